"""``hyla sweep --dry-run``: each run's state and the minutes it has left, measured on this machine."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
import time
from pathlib import Path

from hyla.sweep.groups import Group, at_or_past
from hyla.sweep.workers import worker_threads
from hyla.train.config import ExperimentConfig
from hyla.train.run.folder import last_step
from hyla.train.sweeps import RunSpec, describe_plan


def estimate_seconds(
    cfg: ExperimentConfig,
    device: str,
    cache: dict[str, tuple[float, float]],
    from_step: int = 0,
    threads: int | None = None,
    to_step: int | None = None,
) -> float:
    """Seconds left for the run of ``cfg`` up to ``to_step`` (``--stop-at-step``) or its schedule's end:
    measured seconds per step (a few steps after warm-up) and per evaluation, times the steps and evaluations
    it has left. One measurement per architecture (cached), with ``threads`` intra-op threads (what a
    ``--jobs`` worker gets) or torch's current number."""
    import torch

    from hyla.train.loop import Trainer

    arch = json.dumps({k: v for k, v in cfg.to_dict().items() if k not in ("seed", "name", "train")}, sort_keys=True)
    if arch not in cache:
        with tempfile.TemporaryDirectory() as tmp:
            probe = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, eval_size=512))
            trainer = Trainer(probe, Path(tmp) / "probe", device=device, quiet=True, progress=False)
            threads_before = torch.get_num_threads()
            torch.set_num_threads(threads or threads_before)
            try:
                for _ in range(2):
                    trainer.train_step()
                trainer.check_finite()
                t0 = time.perf_counter()
                for _ in range(5):
                    trainer.train_step()
                trainer.check_finite()
                per_step = (time.perf_counter() - t0) / 5
                t0 = time.perf_counter()
                trainer.evaluate()
                per_problem = (time.perf_counter() - t0) / (512 * len(trainer.task.splits))
                eval_s = per_problem * cfg.train.eval_size * len(trainer.task.splits)
            finally:
                torch.set_num_threads(threads_before)
                trainer.close()
        cache[arch] = (per_step, eval_s)
    per_step, eval_s = cache[arch]
    return seconds_left(cfg, per_step, eval_s, from_step, to_step)


def seconds_left(
    cfg: ExperimentConfig, per_step: float, eval_s: float, from_step: int = 0, to_step: int | None = None
) -> float:
    """Seconds the run of ``cfg`` has left from ``from_step`` to ``to_step`` (at most its schedule's end; None:
    the end) at ``per_step`` seconds a step and ``eval_s`` an evaluation (the dry run's measurement here, the
    GPU queue's measured rates there)."""
    t = cfg.train
    end = t.steps if to_step is None else min(to_step, t.steps)
    if end <= from_step:
        return 0.0
    evals = math.ceil(end / t.eval_every) - from_step // t.eval_every
    return per_step * (end - from_step) + eval_s * max(evals, 0)


def probe_threads(wanted: int, cores: int, load: float) -> int:
    """Threads for a probe that wants ``wanted`` of ``cores`` while ``load`` (the load average) is busy elsewhere:
    at most the cores left idle, at least one. More threads than idle cores fight the others for them, and the
    probe then measures the fight, many times the run's time."""
    return max(1, min(wanted, cores - round(load)))


def wall_seconds(costs: list[float], jobs: int) -> float:
    """When the last of the groups costing ``costs`` seconds ends, ``jobs`` at a time, each started in order
    on the first worker free (what ``--jobs`` does)."""
    free_at = [0.0] * jobs
    for cost in costs:
        first_free = free_at.index(min(free_at))
        free_at[first_free] += cost
    return max(free_at)


def dry_run(
    name: str,
    specs: list[RunSpec],
    configs: dict[str, ExperimentConfig],
    states: dict[str, str],
    groups: list[Group],
    root: Path,
    device: str,
    jobs: int,
    max_stack: int | None = None,
    stop_at_step: int | None = None,
) -> None:
    """Print each run's state and estimated minutes left (to ``stop_at_step`` where given), then the total and,
    with ``jobs`` > 1, the wall time of ``--jobs`` over ``groups`` (each probe measured with a worker's
    threads, or with the cores left idle where the machine is busy: ``probe_threads``)."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    threads = None
    if device == "cpu":
        import torch

        wanted = worker_threads(jobs) if jobs > 1 else torch.get_num_threads()
        threads = probe_threads(wanted, os.cpu_count() or 1, load)
    cache: dict[str, tuple[float, float]] = {}
    seconds: dict[str, float] = {}
    pending = [s for s in specs if states[s.name] != "done"]
    reached = set() if stop_at_step is None else set(at_or_past(pending, states, root, stop_at_step))
    print(
        f"{name}: {len(specs)} runs, {len(specs) - len(pending)} done, {len(pending) - len(reached)} to train"
        + (f", {len(reached)} at --stop-at-step {stop_at_step} or past it" if reached else "")
        + f" ({device})"
    )
    for s in specs:
        if states[s.name] == "done":
            print(f"  {s.name}: done")
            continue
        step = last_step(root / s.name) if states[s.name] == "stopped" else 0
        if s.name in reached:
            print(f"  {s.name}: {states[s.name]} at step {step}, at or past --stop-at-step {stop_at_step}")
            continue
        seconds[s.name] = estimate_seconds(configs[s.name], device, cache, step, threads, stop_at_step)
        until = "" if stop_at_step is None else f" to step {min(stop_at_step, configs[s.name].train.steps)}"
        print(f"  {s.name}: {states[s.name]} at step {step}, about {seconds[s.name] / 60:.1f} min{until}")
    if groups:
        print(f"plan: {describe_plan([list(g.cfgs) for g in groups], max_stack)}")
    total = sum(seconds.values())
    print(f"estimated: {total / 60:.1f} min for the {len(seconds)} runs left (one after another)")
    if jobs > 1 and seconds:
        # a stack costs about its runs one after another on a CPU (measured)
        costs = [sum(seconds[n] for n in group.names) for group in groups]
        print(
            f"with --jobs {jobs}: about {wall_seconds(costs, jobs) / 60:.1f} min "
            f"({worker_threads(jobs) if device == 'cpu' else 'all'} threads each; "
            "runs sharing the machine each go somewhat slower than measured alone)"
        )
    if load > 0.5 * (os.cpu_count() or 1):
        print(
            f"note: the machine was busy while measuring (load average {load:.1f}; probe threads: {threads or 'all'},"
            " at most the idle cores): on an idle machine these runs go faster"
        )
