"""The ``hyla sweep`` command line: which runs (``--only``, ``--where``, ``--override``), how (``--jobs``,
``--max-minutes``, ``--stop-at-step``, ``--launcher``, ``--retry-failed``), or only what it would do (``--dry-run``,
``--emit-commands``); exit codes as ``hyla train``'s: 2 bad input (or the sweep folder in use by another
``hyla sweep``), 3 runs failed with a non-finite loss (the others trained on), 128 + signal when stopped by one."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from hyla.sweep.estimate import dry_run
from hyla.sweep.groups import Group, RunsFailed, at_or_past, failed_runs, plan_sweep, states_and_pending
from hyla.sweep.launch import submit
from hyla.sweep.workers import train_groups
from hyla.train.config import parse_override_value
from hyla.train.sweeps import RECORD_ROOT, SWEEP_MAX_STACK, RunSpec, Sweep, check_slurm, load_sweep

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
    if args.stop_at_step is not None and args.stop_at_step < 1:
        raise ValueError(f"--stop-at-step must be >= 1, got {args.stop_at_step}")
    if args.stop_at_step is not None and args.launcher != "local":
        raise ValueError(f"--stop-at-step runs with --launcher local only, got --launcher {args.launcher}")
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--device cuda asked for, but no CUDA device is available (allowed here: cpu)")
    return sweep, specs


def failure_line(sweep: Sweep, root: Path, failed: dict[str, str]) -> str:
    """The one line that ends a sweep with failed runs: which, why, what a rerun does, and what may help (only
    what applies to them)."""
    from hyla.train.cli import divergence_advice

    runs = "; ".join(f"{name} ({why})" for name, why in failed.items())
    bf16 = any(sweep.configs[name].train.bf16 for name in failed)
    advice = divergence_advice(bf16, f"edit {sweep.path.name} and remove its folder under {root}")
    return (
        f"hyla sweep: error: {len(failed)} runs failed: {runs}. A rerun skips them (--retry-failed trains them "
        f"again, from their last checkpoint if any, same config); {advice}"
    )


def run(args: argparse.Namespace) -> int:
    from hyla.train.run.checkpoint import CheckpointError
    from hyla.train.run.lock import FolderLock

    t_start = time.monotonic()
    try:
        sweep, specs = selected_runs(args)
    except (ValueError, CheckpointError) as err:
        print(f"hyla sweep: error: {err}", file=sys.stderr)
        return 2
    root = Path(args.root) / sweep.name
    if args.emit_commands or args.dry_run:  # they only read: a sweep training meanwhile is no matter
        return _plan(args, sweep, specs, root, t_start)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # a file in the way, no permission: the user's --root
        print(f"hyla sweep: error: --root {args.root}: cannot make {root} ({err.strerror})", file=sys.stderr)
        return 2
    try:
        # one sweep at a time per folder: a second would train the same pending runs beside the first
        with FolderLock(root, "hyla sweep", "the sweep folder"):
            return _plan(args, sweep, specs, root, t_start)
    except ValueError as err:  # the folder is in use (its holder named) or its lock cannot be written
        print(f"hyla sweep: error: {err}", file=sys.stderr)
        return 2


def _plan(args: argparse.Namespace, sweep: Sweep, specs: list[RunSpec], root: Path, t_start: float) -> int:
    """Read the runs' states, then print the commands, the dry run, or train; failed runs (a NaN/inf loss)
    are skipped unless ``--retry-failed``."""
    from hyla.train.run.checkpoint import CheckpointError

    try:
        states, pending = states_and_pending(specs, root)
        failed = failed_runs(specs, states, root)
        skipped = {} if args.retry_failed else failed
        # a run already at --stop-at-step has nothing to train now; it stays stopped, not done
        reached = [] if args.stop_at_step is None else at_or_past(pending, states, root, args.stop_at_step)
        pending = [s for s in pending if s.name not in skipped and s.name not in reached]
        if args.emit_commands:
            for s in pending:
                print(s.command(root / s.name, args.device, states[s.name] == "stopped", args.stop_at_step))
            return 0
        if args.max_stack < 1:
            raise ValueError(f"--max-stack must be >= 1 (1: each run alone), got {args.max_stack}")
        groups = plan_sweep(pending, sweep.configs, states, root, max_stack=args.max_stack)
        if args.dry_run:
            dry_run(
                sweep.name,
                specs,
                sweep.configs,
                states,
                groups,
                root,
                args.device,
                args.jobs,
                args.max_stack,
                args.stop_at_step,
            )
            return 0
    except (ValueError, CheckpointError) as err:
        print(f"hyla sweep: error: {err}", file=sys.stderr)
        return 2
    if not pending:
        if reached and not skipped:
            print(
                f"{sweep.name}: {len(specs) - len(reached)} of {len(specs)} runs are done, {len(reached)} at step "
                f"{args.stop_at_step} or past it (--stop-at-step) ({root})"
            )
            return 0
        if not skipped:
            print(f"{sweep.name}: all {len(specs)} runs are done ({root})")
            return 0
        print(
            f"{sweep.name}: {len(specs) - len(skipped)} of {len(specs)} runs are done, {len(skipped)} failed ({root})"
        )
        print(failure_line(sweep, root, skipped), file=sys.stderr)
        return 3
    if args.launcher != "local":
        return submit(groups, sweep, root, args.launcher, args.device, args.override)
    return _train(args, sweep, root, groups, len(specs), pending, skipped, t_start)


def _train(
    args: argparse.Namespace,
    sweep: Sweep,
    root: Path,
    groups: list[Group],
    selected: int,
    pending: list[RunSpec],
    skipped: dict[str, str],
    t_start: float,
) -> int:
    """Train ``groups`` (the ``pending`` of ``selected`` runs; failed ones ``skipped``); the exit code."""
    from hyla.textio import DISK_FAULTS
    from hyla.train.cli import failure_exit_code
    from hyla.train.loop import Interrupted, NonFiniteLossError
    from hyla.train.run.checkpoint import CheckpointError, checkpoint_write_failure

    deadline = None if args.max_minutes is None else budget_deadline(t_start, args.max_minutes)
    print(f"{sweep.name}: {len(pending)} of {selected} runs to train into {root}", flush=True)
    failed_now: dict[str, str] = {}
    try:
        finished = train_groups(
            groups,
            root,
            device=args.device,
            deadline=deadline,
            quiet=not args.progress,
            jobs=args.jobs,
            stop_at_step=args.stop_at_step,
        )
    except RunsFailed as err:  # the other groups trained on; the failed runs are named below
        finished, failed_now = err.finished, err.failed
    except (ValueError, CheckpointError, NonFiniteLossError, Interrupted) as err:
        return failure_exit_code("hyla sweep", err, "(checkpoints saved); run the same command to continue")
    except OSError as err:  # a full or read-only disk under --root: the atomic writes left the records intact
        if err.errno not in DISK_FAULTS:
            raise
        again = "the same command"  # a sweep resumes its runs by itself
        line = checkpoint_write_failure(err, [root / s.name for s in pending], fresh=f"run {again}", resume=again)
        print(f"hyla sweep: error: {line}", file=sys.stderr)
        return 2
    left = len(pending) - len(finished) - len(failed_now)
    out_of_time = deadline is not None and time.monotonic() >= deadline
    if out_of_time:
        why = "time budget reached; run the same command to continue"
    elif args.stop_at_step:
        why = f"stopped at step {args.stop_at_step} (--stop-at-step); a sweep without it continues them"
    else:
        why = "run the same command to continue"
    print(
        f"{sweep.name}: {len(finished)} runs finished now, {left} left"
        + (f", {len(failed_now)} failed" if failed_now else "")
        + (f" ({why})" if left else "")
    )
    failed = {**skipped, **failed_now}
    if failed:
        print(failure_line(sweep, root, failed), file=sys.stderr)
        return 3
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
    p.add_argument(
        "--stop-at-step",
        type=int,
        metavar="N",
        help="train each run to step N at most and stop there with a checkpoint, its schedule unchanged (a run "
        "at N or past it trains nothing); without it a later sweep continues them",
    )
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
    p.add_argument(
        "--retry-failed",
        action="store_true",
        help="train the runs whose loss became NaN/inf again (from their last checkpoint; skipped by default)",
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
