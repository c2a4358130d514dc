"""A sweep's pending runs as the groups they train in, and one group trained as one recorded piece.

The grouping and the engine are the planner's (:mod:`hyla.train.plan`, shared with ``hyla train``); the
run directories' states and ``made_by.jsonl`` are :mod:`hyla.train.rundir`'s. Here: what a piece records
(commit, machine, device, on CPU what decides how its sums round, steps, wall time) and the training of one
group until done, a deadline or a stop.
"""

from __future__ import annotations

import datetime
import platform
import subprocess
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hyla import cpu
from hyla.attention.kernels.c import gelu
from hyla.attention.kernels.c.wrapper import MARCH_ENV, source_digest, target_march
from hyla.runtime import cpu_model
from hyla.train.checkpoint import checkpoint_step
from hyla.train.config import ExperimentConfig
from hyla.train.plan import engine_for, plan_groups
from hyla.train.rundir import finish_piece_record, read_pieces, run_state, start_piece_record
from hyla.train.sweepfile import RunSpec

#: the checkout this code runs from (this file is its src/hyla/sweep/groups.py), whose commit a piece records
SOURCE_ROOT = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class Group:
    """Runs that train together (a stack, or a lone run), their loaded configs, and the step of the checkpoint
    they resume from (``None``: they start from scratch)."""

    specs: tuple[RunSpec, ...]
    cfgs: tuple[ExperimentConfig, ...]
    resume_from: int | None

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.specs]

    @property
    def resume(self) -> bool:
        return self.resume_from is not None


def states_and_pending(specs: list[RunSpec], root: Path) -> tuple[dict[str, str], list[RunSpec]]:
    """Each run's state by name (:func:`hyla.train.rundir.run_state` of ``root/NAME``: ``done``, ``stopped`` or
    ``new``) and the runs not done, in ``specs``' order. Reads the records, which may be damaged
    (:class:`hyla.train.checkpoint.CheckpointError`)."""
    states = {s.name: run_state(root / s.name) for s in specs}
    return states, [s for s in specs if states[s.name] != "done"]


def plan_sweep(
    specs: list[RunSpec],
    configs: dict[str, ExperimentConfig],
    states: dict[str, str],
    root: Path,
    max_stack: int | None = None,
) -> list[Group]:
    """``specs`` (all not done; ``states`` by name, ``configs`` by name) as the groups they train in, stacks of
    at most ``max_stack`` runs (:func:`hyla.train.plan.plan_groups`), the group with the fewest steps left
    first (ties in sweep order): under a time budget, runs near their end finish instead of waiting behind
    new ones."""
    cfgs = [configs[s.name] for s in specs]
    resume_from = [checkpoint_step(root / s.name) if states[s.name] == "stopped" else None for s in specs]
    groups = plan_groups(cfgs, resume_from, max_stack)
    groups.sort(key=lambda g: cfgs[g[0]].train.steps - (resume_from[g[0]] or 0))
    return [Group(tuple(specs[i] for i in g), tuple(cfgs[i] for i in g), resume_from[g[0]]) for g in groups]


def provenance(device: str) -> dict[str, Any]:
    """Commit, machine and device: what every piece of a run records in ``made_by.jsonl``."""
    from hyla.bench import device_label

    def git(*args: str) -> str:
        if not (SOURCE_ROOT / ".git").exists():  # an installed wheel: no commit to name (not the cwd's repository)
            return ""
        try:
            return subprocess.run(
                ["git", *args], cwd=SOURCE_ROOT, capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = bool(git("status", "--porcelain", "--untracked-files=no", "--", "src"))
    made = {
        "commit": commit + ("+changes" if dirty else ""),
        "machine": f"{platform.node()} {platform.machine()} {cpu_model()}".strip(),
        "device": device_label(device),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if device == "cpu":  # what decides how a CPU run's sums round, so a retrain can pin both
        made["cpu_capability"] = torch.backends.cpu.get_cpu_capability()  # PyTorch's kernels (ATEN_CPU_CAPABILITY)
        made["kernel_march"] = target_march()  # the C kernel's -march
        made["kernel_source"] = source_digest()  # and its version: a new kernel may sum in another order
        made["blas"] = cpu.blas_path()  # which library's kernels sum the matrix products (hyla.cpu)
        made["gelu"] = gelu.gelu_path()  # what computes a tanh GELU: the C kernel or torch
    return made


#: what a CPU piece records of how its sums round, and the environment variable that pins each (None: only
#: the code of the earlier piece, e.g. a worktree of its commit, continues alike)
ROUNDING_SETTINGS: dict[str, str | None] = {
    "cpu_capability": "ATEN_CPU_CAPABILITY",
    "kernel_march": MARCH_ENV,
    "kernel_source": None,
    "blas": cpu.SETTING_ENV,
    "gelu": gelu.SETTING_ENV,
}
#: a recorded value -> the value of its setting that gives it again, where the two differ
PIN_VALUES: dict[str, dict[str, str]] = {
    "blas": {"mkl": "off", "mkl+vendor_override": "on"},
    "gelu": {"torch": "off", "c_kernel": "auto"},
}


def rounding_change(run_dir: Path, made: dict[str, Any]) -> str | None:
    """A warning if ``made`` (this piece's :func:`provenance`) rounds otherwise than the run's last recorded
    piece: results stay valid, but the run no longer retraces bit for bit what one machine would train."""
    pieces = read_pieces(run_dir)
    last = pieces[-1] if pieces else {}
    changed = [k for k in ROUNDING_SETTINGS if k in last and k in made and last[k] != made[k]]
    if not changed:
        return None
    was = ", ".join(f"{k}={last[k]}" for k in changed)
    now = ", ".join(f"{k}={made[k]}" for k in changed)
    pins = [
        f"set {ROUNDING_SETTINGS[k]}={PIN_VALUES.get(k, {}).get(last[k], str(last[k]).lower())}"
        for k in changed
        if ROUNDING_SETTINGS[k]
    ]
    if any(ROUNDING_SETTINGS[k] is None for k in changed):
        pins.append(f"train from a worktree of commit {last.get('commit', '?')}")
    pin = " and ".join(pins)
    return f"{run_dir.name}: its last piece ran with {was}, this one with {now}; to continue alike, {pin}"


def train_group(
    group: Group,
    root: Path,
    *,
    device: str = "cpu",
    deadline: float | None = None,
    quiet: bool = True,
    stop_requested: Callable[[], bool] | None = None,
) -> list[str]:
    """Train one group until done, ``deadline`` (``time.monotonic()``) or ``stop_requested()`` (asked after
    every step; the group then stops with a checkpoint); record the piece in each run's ``made_by.jsonl``
    as it starts and complete that line as it ends; return the names finished."""
    from hyla.train.loop import Trainer

    if deadline is not None and time.monotonic() >= deadline:
        return []
    cfgs, outs = list(group.cfgs), [root / name for name in group.names]
    made = provenance(device)  # the code that trains, read before it starts (HEAD may move meanwhile)
    t0 = time.monotonic()
    trainer = Trainer(
        cfgs, outs, engine=engine_for(cfgs), device=device, resume=group.resume, quiet=quiet, progress=not quiet
    )
    started = {
        **made,
        "ended": None,  # null until the piece ends: one killed outright (SIGKILL) keeps it so
        "from_step": trainer.step,  # the checkpoint's step (the metrics log may end a few steps before it)
        "to_step": None,
        "wall_s": None,
        "stacked_with": len(cfgs),
    }
    trainer.deadline, trainer.stop_requested = deadline, stop_requested
    for out in outs:
        if (change := rounding_change(out, made)) is not None:
            warnings.warn(change, stacklevel=2)
    try:
        for out in outs:
            start_piece_record(out, started)
        trainer.run()
    finally:
        trainer.close()
        ended = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        finished = {**started, "ended": ended, "to_step": trainer.step, "wall_s": round(time.monotonic() - t0, 1)}
        for out in outs:
            finish_piece_record(out, started, finished)
    return group.names if trainer.step >= cfgs[0].train.steps else []
