"""The ``hyla sweep`` command line: which runs (``--only``, ``--where``, ``--override``), how (``--jobs``,
``--max-minutes``, ``--launcher``), or only what it would do (``--dry-run``, ``--emit-commands``); exit
codes as ``hyla train``'s: 2 bad input, 3 non-finite loss, 128 + signal when stopped by one."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from hyla.sweep.estimate import dry_run
from hyla.sweep.groups import plan_sweep, states_and_pending
from hyla.sweep.launch import submit
from hyla.sweep.workers import train_groups
from hyla.train.config import parse_override_value
from hyla.train.plan import SWEEP_MAX_STACK
from hyla.train.sweepfile import RECORD_ROOT, RunSpec, Sweep, check_slurm, load_sweep

LAUNCHERS = ("local", "slurm", "submitit-local")
#: seconds kept free at the end of ``--max-minutes`` for the last checkpoint and evaluation (at most this,
#: at most a tenth of the budget)
BUDGET_MARGIN_S = 30.0


def budget_deadline(start: float, max_minutes: float) -> float:
    """The ``time.monotonic()`` by which training stops for a ``--max-minutes`` budget begun at ``start``:
    a margin (at most ``BUDGET_MARGIN_S``, less for tiny budgets) is left to write checkpoints and records."""
    return start + max_minutes * 60 - min(BUDGET_MARGIN_S, 6 * max_minutes)


def parse_slurm(items: list[str]) -> dict[str, Any]:
    """``--slurm KEY=VALUE`` (repeatable): numbers read as numbers."""
    values: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--slurm {item!r} must look like KEY=VALUE, e.g. partition=gpu or time=240")
        values[key.strip()] = parse_override_value(f"--slurm {item}", raw)
    return values


def comma_list(text: str) -> list[str]:
    """``"a, b,,c"`` as ``["a", "b", "c"]``: the values of ``--only`` and of each ``--where``."""
    return [v.strip() for v in text.split(",") if v.strip()]


def parse_where(items: list[str]) -> dict[str, list[str]]:
    """``--where KEY=V1[,V2...]`` (repeatable) as ``{KEY: [V1, V2, ...]}``; a repeated key adds values."""
    where: dict[str, list[str]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not key.strip() or not comma_list(values):
            raise ValueError(f"--where takes KEY=VALUE[,VALUE...], e.g. train.lr=0.001 or seed=2; got {item!r}")
        where.setdefault(key.strip(), []).extend(comma_list(values))
    return where


def selected_runs(args: argparse.Namespace) -> tuple[Sweep, list[RunSpec]]:
    """The sweep file with ``--override`` applied and the runs that ``--only`` and ``--where`` keep; bad
    arguments raise ``ValueError`` naming the option."""
    sweep = load_sweep(args.file)
    sweep.override(args.override)
    sweep.slurm.update(check_slurm(parse_slurm(args.slurm), "--slurm"))
    specs = sweep.runs(comma_list(args.only) if args.only else None, parse_where(args.where))
    if args.max_minutes is not None and not args.max_minutes > 0:
        raise ValueError(f"--max-minutes must be > 0, got {args.max_minutes}")
    if args.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--device cuda asked for, but no CUDA device is available (allowed here: cpu)")
    return sweep, specs


def run(args: argparse.Namespace) -> int:
    from hyla.train.checkpoint import CheckpointError
    from hyla.train.cli import failure_exit_code
    from hyla.train.loop import Interrupted, NonFiniteLossError

    t_start = time.monotonic()
    try:
        sweep, specs = selected_runs(args)
        root = Path(args.root) / sweep.name
        states, pending = states_and_pending(specs, root)
        if args.emit_commands:
            for s in pending:
                print(s.command(root / s.name, args.device, resume=states[s.name] == "stopped"))
            return 0
        if args.max_stack < 1:
            raise ValueError(f"--max-stack must be >= 1 (1: each run alone), got {args.max_stack}")
        groups = plan_sweep(pending, sweep.configs, states, root, max_stack=args.max_stack)
        if args.dry_run:
            dry_run(sweep.name, specs, sweep.configs, states, groups, root, args.device, args.jobs, args.max_stack)
            return 0
    except (ValueError, CheckpointError) as err:
        print(f"hyla sweep: error: {err}", file=sys.stderr)
        return 2
    if not pending:
        print(f"{sweep.name}: all {len(specs)} runs are done ({root})")
        return 0
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # a file in the way, no permission: the user's --root
        print(f"hyla sweep: error: --root {args.root}: cannot make {root} ({err.strerror})", file=sys.stderr)
        return 2
    if args.launcher != "local":
        return submit(groups, sweep, root, args.launcher, args.device, args.override)
    deadline = None if args.max_minutes is None else budget_deadline(t_start, args.max_minutes)
    print(f"{sweep.name}: {len(pending)} of {len(specs)} runs to train into {root}", flush=True)
    try:
        finished = train_groups(
            groups, root, device=args.device, deadline=deadline, quiet=not args.progress, jobs=args.jobs
        )
    except (ValueError, CheckpointError, NonFiniteLossError, Interrupted) as err:
        return failure_exit_code("hyla sweep", err, "(checkpoints saved); run the same command to continue")
    left = len(pending) - len(finished)
    print(
        f"{sweep.name}: {len(finished)} runs finished now, {left} left"
        + (" (time budget reached; run the same command to continue)" if left else "")
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep", help="run a sweep file (packaged ones by name): resumable, recorded under ./results/sweeps"
    )
    p.add_argument("file", help="a sweep YAML path or the name of a packaged sweep (e.g. table_a1_fuzzy); a path wins")
    p.add_argument("--only", metavar="ROWS", help="comma-separated rows to run (default: all)")
    p.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="KEY=V[,V]",
        help="only runs at these grid values or seeds, e.g. --where train.lr=0.001 --where seed=2 (repeatable)",
    )
    p.add_argument("--max-minutes", type=float, metavar="M", help="stop with checkpoints before M minutes pass")
    p.add_argument("--device", default="cpu", help="cpu | cuda (default cpu)")
    p.add_argument(
        "--max-stack",
        type=int,
        default=SWEEP_MAX_STACK,
        metavar="R",
        help=f"train up to R stackable runs as one stack in one process (default {SWEEP_MAX_STACK}: each run alone, "
        "which trained fastest on a CPU and on an H100)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="K",
        help="train K runs at a time in K processes sharing the cores (default 1); logs in <run>/train.log",
    )
    p.add_argument("--dry-run", action="store_true", help="list the runs and their estimated cost; train nothing")
    p.add_argument("--emit-commands", action="store_true", help="print one `hyla train` command per pending run")
    p.add_argument("--launcher", default="local", choices=LAUNCHERS, help="local (default) | slurm | submitit-local")
    p.add_argument(
        "--slurm",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="what each job asks of the cluster, over the sweep file's slurm: block "
        "(partition, account, qos, time [min], cpus, mem_gb, gpus)",
    )
    p.add_argument("--root", default=str(RECORD_ROOT), help="where sweep records go (default results/sweeps)")
    p.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="add to every run's config, e.g. train.fast=true on a GPU (repeatable)",
    )
    p.add_argument("--progress", action="store_true", help="progress bars instead of one line per log interval")
    p.set_defaults(func=run)
