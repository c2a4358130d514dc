"""Train a sweep's groups one after another, or ``--jobs K`` at a time in worker processes that share the
cores; a signal or a failed group stops them all with checkpoints, and a deadline ends them in time."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from hyla.sweep.groups import Group, train_group
from hyla.textio import print_warnings_on_one_line


def train_groups(
    groups: list[Group],
    root: Path,
    *,
    device: str = "cpu",
    deadline: float | None = None,
    quiet: bool = True,
    jobs: int = 1,
) -> list[str]:
    """Train ``groups`` in order, ``jobs`` at a time; returns the names of the runs finished now."""
    if jobs > 1 and len(groups) > 1:
        return _train_in_workers(groups, root, device=device, deadline=deadline, jobs=jobs)
    finished: list[str] = []
    for group in groups:
        if deadline is not None and time.monotonic() >= deadline:
            break
        finished += train_group(group, root, device=device, deadline=deadline, quiet=quiet)
    return finished


def worker_threads(jobs: int) -> int:
    """Intra-op threads of each of ``jobs`` workers: the cores shared out, at least one."""
    return max(1, (os.cpu_count() or 1) // jobs)


#: in a worker process: the sweep's stop event (set by the main process on a signal or a failed group)
_STOP: Any = None


def _worker_init(threads: int, stop: Any) -> None:
    import torch

    from hyla.train.loop import STOP_SIGNALS

    global _STOP
    torch.set_num_threads(threads)
    print_warnings_on_one_line()
    _STOP = stop
    # a signal between groups must not end the worker (the pool would break): it stops the whole sweep;
    # while a group trains, the trainer's own handlers take over (checkpoint, Interrupted)
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda signum, frame: stop.set())


def _train_group_logged(group: Group, root: Path, device: str, deadline: float | None) -> list[str]:
    """A worker's task: :func:`train_group`, its progress lines into the first run's ``train.log``;
    nothing once the sweep is stopping."""
    if _STOP is not None and _STOP.is_set():
        return []
    first = root / group.names[0]
    first.mkdir(parents=True, exist_ok=True)
    with open(first / "train.log", "a") as log, contextlib.redirect_stdout(log):
        stop_requested = _STOP.is_set if _STOP is not None else None
        return train_group(group, root, device=device, deadline=deadline, quiet=True, stop_requested=stop_requested)


def _train_in_workers(groups: list[Group], root: Path, *, device: str, deadline: float | None, jobs: int) -> list[str]:
    """The groups over ``jobs`` worker processes (spawned: no state shared with this one but a stop event).
    The first error, a SIGTERM or Ctrl-C sets the event: running groups stop with checkpoints after their
    current step, queued ones do not start; then the error (or :class:`Interrupted`) is raised here."""
    from hyla.train.loop import Interrupted

    threads = worker_threads(jobs)
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_worker_init, initargs=(threads, stop))
    received: list[int] = []

    def on_sigterm(signum: int, frame: Any) -> None:
        received.append(signum)
        stop.set()

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    finished: list[str] = []
    error: BaseException | None = None
    try:
        futures = [pool.submit(_train_group_logged, group, root, device, deadline) for group in groups]
        print(f"{len(groups)} groups over {jobs} workers ({threads} threads each); logs: <run>/train.log", flush=True)
        for future in as_completed(futures):  # each as it ends, so "finished" lines come as runs finish
            if future.cancelled():
                continue
            if future.exception() is not None:
                if error is None:
                    error = future.exception()
                    stop.set()
                continue
            names = future.result()
            finished += names
            if names:
                print(f"finished: {', '.join(names)}", flush=True)
    except KeyboardInterrupt:  # Ctrl-C (it reached the workers too)
        received.append(signal.SIGINT)
        stop.set()
    finally:  # waits for the running groups to save and stop
        pool.shutdown(wait=True, cancel_futures=True)
        signal.signal(signal.SIGTERM, previous)
    if received:
        raise Interrupted(received[0])
    if error is not None:
        raise error
    return finished
