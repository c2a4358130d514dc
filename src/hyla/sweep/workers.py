"""Train a sweep's groups one after another, or ``--jobs K`` at a time in worker processes that share the
cores; a signal or a failed group stops them all with checkpoints, and a deadline ends them in time. A group
whose loss became NaN/inf is recorded as failed and the others go on; the failed runs are raised at the end
(``RunsFailed``). Workers end with the sweep: when its process dies (``kill -9``
included) they stop with checkpoints and start nothing more."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import multiprocessing
import os
import signal
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from hyla.sweep.groups import Group, RunsFailed, train_group
from hyla.textio import print_warnings_on_one_line

#: Linux's prctl option that sends a process a signal when its parent dies (linux/prctl.h)
PR_SET_PDEATHSIG = 1


def train_groups(
    groups: list[Group],
    root: Path,
    *,
    device: str = "cpu",
    deadline: float | None = None,
    quiet: bool = True,
    jobs: int = 1,
    stop_at_step: int | None = None,
) -> list[str]:
    """Train ``groups`` in order, ``jobs`` at a time, each run to ``stop_at_step`` if given; returns the names
    of the runs finished now, or raises ``RunsFailed`` (naming those too) after the last group if some failed."""
    if jobs > 1 and len(groups) > 1:
        return _train_in_workers(groups, root, device=device, deadline=deadline, jobs=jobs, stop_at_step=stop_at_step)
    finished: list[str] = []
    failed: list[RunsFailed] = []
    for group in groups:
        if deadline is not None and time.monotonic() >= deadline:
            break
        try:
            finished += train_group(
                group, root, device=device, deadline=deadline, quiet=quiet, stop_at_step=stop_at_step
            )
        except RunsFailed as err:
            failed.append(_say_failed(err))
    return _finished_or_failed(finished, failed)


def _say_failed(err: RunsFailed) -> RunsFailed:
    for name, why in err.failed.items():
        print(f"failed: {name} ({why})", flush=True)
    return err


def _finished_or_failed(finished: list[str], failed: list[RunsFailed]) -> list[str]:
    if not failed:
        return finished
    raise RunsFailed(
        {name: why for err in failed for name, why in err.failed.items()}, finished, any(e.bf16 for e in failed)
    )


def worker_threads(jobs: int) -> int:
    """Intra-op threads of each of ``jobs`` workers: the cores shared out, at least one."""
    return max(1, (os.cpu_count() or 1) // jobs)


#: in a worker process: the sweep's stop event (set by the main process on a signal or a failed group)
_STOP: Any = None
#: in a worker process: the pid of the sweep that started it, and whether a group is training now
_PARENT: int | None = None
_BUSY = False


def _orphaned() -> bool:
    """Whether this worker's sweep is gone (its pid no longer this process's parent)."""
    return _PARENT is not None and os.getppid() != _PARENT


def _exit_orphaned(signum: int = signal.SIGTERM) -> None:
    """End a worker whose sweep died: nothing would take its results, and it must not take another run."""
    if _orphaned():
        os._exit(128 + signum)


def _die_with_parent() -> None:
    """Ask Linux to SIGTERM this worker when the sweep dies, as the sweep's own SIGTERM would stop it (with a
    checkpoint); the pool spawns its workers from ``submit()``, on the sweep's main thread, which lives as long as
    the sweep (the signal follows the thread that spawned). Elsewhere the checks of ``_orphaned`` remain."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _worker_init(threads: int, stop: Any, parent: int) -> None:
    import torch

    from hyla.train.loop import STOP_SIGNALS

    global _STOP, _PARENT
    _STOP, _PARENT = stop, parent
    _die_with_parent()
    _exit_orphaned()  # the sweep died before the line above could have it signal this worker
    torch.set_num_threads(threads)
    print_warnings_on_one_line()

    # a signal between groups must not end the worker (the pool would break): it stops the whole sweep; one
    # whose sweep is gone ends it (nothing to save between groups). While a group trains, the trainer's own
    # handlers take over (checkpoint, Interrupted).
    def on_signal(signum: int, frame: Any) -> None:
        stop.set()
        if not _BUSY:
            _exit_orphaned(signum)

    for sig in STOP_SIGNALS:
        signal.signal(sig, on_signal)


def _stop_requested() -> bool:
    return (_STOP is not None and _STOP.is_set()) or _orphaned()


def _train_group_logged(
    group: Group, root: Path, device: str, deadline: float | None, stop_at_step: int | None
) -> list[str]:
    """A worker's task: ``train_group``, its progress lines into the first run's ``train.log``;
    nothing once the sweep is stopping, and the worker's end once the sweep is gone."""
    global _BUSY
    _exit_orphaned()
    if _STOP is not None and _STOP.is_set():
        return []
    first = root / group.names[0]
    try:
        _BUSY = True
        first.mkdir(parents=True, exist_ok=True)
        with open(first / "train.log", "a") as log, contextlib.redirect_stdout(log):
            return train_group(
                group,
                root,
                device=device,
                deadline=deadline,
                quiet=True,
                stop_requested=_stop_requested,
                stop_at_step=stop_at_step,
            )
    finally:  # the group saved and recorded its piece; the log is closed
        _BUSY = False
        _exit_orphaned()


def _train_in_workers(
    groups: list[Group], root: Path, *, device: str, deadline: float | None, jobs: int, stop_at_step: int | None
) -> list[str]:
    """The groups over ``jobs`` worker processes (spawned: no state shared with this one but a stop event).
    The first error, a SIGTERM or Ctrl-C sets the event: running groups stop with checkpoints after their
    current step, queued ones do not start; then the error (or ``Interrupted``) is raised here. Failed
    runs (a NaN/inf loss) stop nothing: they are raised after the last group as ``RunsFailed``."""
    from hyla.train.loop import Interrupted

    threads = worker_threads(jobs)
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    pool = ProcessPoolExecutor(
        max_workers=jobs, mp_context=context, initializer=_worker_init, initargs=(threads, stop, os.getpid())
    )
    received: list[int] = []

    def on_sigterm(signum: int, frame: Any) -> None:
        received.append(signum)
        stop.set()

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    finished: list[str] = []
    failed: list[RunsFailed] = []
    error: BaseException | None = None
    try:
        futures = [pool.submit(_train_group_logged, group, root, device, deadline, stop_at_step) for group in groups]
        print(f"{len(groups)} groups over {jobs} workers ({threads} threads each); logs: <run>/train.log", flush=True)
        for future in as_completed(futures):  # each as it ends, so "finished" lines come as runs finish
            if future.cancelled():
                continue
            if isinstance(future.exception(), RunsFailed):
                failed.append(_say_failed(future.exception()))
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
    return _finished_or_failed(finished, failed)
