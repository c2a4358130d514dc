"""``hyla train CONFIG [key=value ...] --out DIR``: one run, or several (``--seeds``, ``--sweep``).

Expansion of seeds and ``--sweep`` files into runs and the exit codes live here: 2 bad input, 3 non-finite
loss, 128 + signal when stopped by one. The runs go through the planner of ``hyla sweep``
(``hyla.train.sweeps``: groups and engines), and ``--sweep`` files are ``hyla sweep``'s format, their runs
named by its rule. Also runs under ``torchrun`` for DDP (lone runs).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import warnings
from pathlib import Path

from hyla.textio import FileFormatError
from hyla.train.config import ExperimentConfig, check_device_name, flat_config, load_config, parse_overrides
from hyla.train.run.checkpoint import CheckpointError, checkpoint_step, checkpoint_write_failure
from hyla.train.run.folder import METRICS
from hyla.train.run.lock import FolderLock
from hyla.train.sweeps import (
    RunSpec,
    Sweep,
    check_run_configs,
    describe_plan,
    engine_for,
    load_sweep,
    plan_groups,
)


def _seeds(text: str | None) -> list[int] | None:
    """``--seeds 0,1,2`` as integers (None without the flag)."""
    if not text:
        return None
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--seeds must be comma-separated integers, got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds must list distinct integers, got {text!r}")
    return seeds


def legacy_run_name(sweep: Sweep, run: RunSpec, seeds_given: bool) -> str:
    """The folder ``hyla train --seeds/--sweep`` named ``run`` before it took ``run_name``: ``seed0_lr0.003``
    (the seed first, then each override's key and value, joined by ``_``)."""
    items = {k: v for k, v in sweep.rows[run.row].items() if k not in ("config", "grid")} | dict(run.point)
    values = "_".join(f"{k.split('.')[-1]}{v}" for k, v in items.items())
    return "_".join(x for x in (f"seed{run.seed}" if seeds_given else "", values) if x)


def run_configs(args: argparse.Namespace) -> tuple[list[ExperimentConfig], list[Path]]:
    """Configs and run directories: ``OUT`` for one run; ``OUT/seed0``, ``OUT/lr0.003``, ``OUT/lr0.003-seed0``
    ... (``run_name``, as ``hyla sweep`` names them) for ``--seeds`` / ``--sweep``. On ``--resume`` a run found
    only under its name from before (``legacy_run_name``) continues there."""
    seeds = _seeds(args.seeds)
    base = load_config(args.config, args.overrides)
    if not seeds and not args.sweep:
        return [base], [Path(args.out)]
    if args.sweep:
        try:
            sweep = load_sweep(args.sweep, base=args.config)
        except FileFormatError as err:
            raise ValueError(f"--sweep {err}") from err
    else:
        sweep = Sweep(name="seeds", config=args.config, rows={"": {}})
    if seeds:
        sweep.seeds = list(seeds)
    source = f"--sweep {args.sweep}" if args.sweep else "--seeds"
    sweep.overrides.update(flat_config(parse_overrides(args.overrides)))  # below the rows' and the grid's
    check_run_configs(sweep, source)
    cfgs, outs = [], []
    for run in sweep.runs():
        cfg, out, name = sweep.configs[run.name], Path(args.out) / run.name, run.name
        old = Path(args.out) / legacy_run_name(sweep, run, bool(seeds))
        if getattr(args, "resume", False) and old != out and not out.exists() and old.is_dir():
            print(f"hyla train: resuming {old} (named {old.name} before runs took the name {run.name})", flush=True)
            warnings.warn(
                f"{old}: run folders of hyla train --seeds/--sweep are now named like {run.name} (hyla sweep's rule); "
                "this run continues under its old name",
                DeprecationWarning,
                stacklevel=2,
            )
            out, name = old, old.name
        cfg.name = f"{base.name}_{name}"
        cfgs.append(cfg)
        outs.append(out)
    return cfgs, outs


def divergence_advice(bf16: bool, restart: str) -> str:
    """What may stop a NaN/inf loss, only what applies (``train.bf16=false`` if a diverging run trained in bf16),
    and how to start that run afresh (``restart``): a resume keeps the config, so it cannot take another."""
    what = "a lower train.lr" + (" or train.bf16=false" if bf16 else "")
    return f"to train it anew with {what}, {restart} (a resume keeps the config)"


def failure_exit_code(command: str, err: Exception, interrupted_note: str, diverged_note: str | None = None) -> int:
    """Say why a training command stopped; its exit code: 2 bad input, 3 non-finite loss, 128 + signal.
    ``diverged_note`` (default: ``divergence_advice``, started afresh) follows a non-finite loss."""
    from hyla.train.loop import Interrupted, NonFiniteLossError

    if isinstance(err, Interrupted):
        print(f"{command}: {err} received {interrupted_note}", file=sys.stderr)
        return 128 + err.signum
    if isinstance(err, NonFiniteLossError):
        note = diverged_note or divergence_advice(err.bf16, "start it afresh")
        print(f"{command}: error: {err}; {note}", file=sys.stderr)
        return 3
    print(f"{command}: error: {err}", file=sys.stderr)
    return 2


def writes_records() -> bool:
    """Whether this process writes the run directories: not the other ranks of a ``torchrun`` (DDP) launch."""
    return int(os.environ.get("RANK", "0")) == 0


def run(args: argparse.Namespace) -> int:
    """Train every group of runs in turn (one group for a lone run), each run directory locked
    (``hyla.train.run.lock``) so that a second command on it stops at once."""
    try:
        if args.stop_at_step is not None and args.stop_at_step < 1:
            raise ValueError(f"--stop-at-step must be >= 1, got {args.stop_at_step}")
        check_device_name(args.device)
        cfgs, outs = run_configs(args)
    except (ValueError, CheckpointError) as err:
        print(f"hyla train: error: {err}", file=sys.stderr)
        return 2
    with contextlib.ExitStack() as locks:
        try:
            if writes_records():
                for out in outs:
                    locks.enter_context(FolderLock(out, "hyla train", "the run directory"))
        except ValueError as err:
            print(f"hyla train: error: {err}", file=sys.stderr)
            return 2
        return _train(args, cfgs, outs)


def _train(args: argparse.Namespace, cfgs: list[ExperimentConfig], outs: list[Path]) -> int:
    from hyla.train.loop import Interrupted, NonFiniteLossError, Trainer

    several = bool(args.seeds or args.sweep)
    try:
        resume_from = [checkpoint_step(out) if args.resume else None for out in outs]
        groups = plan_groups(cfgs, resume_from)
    except (ValueError, CheckpointError) as err:
        print(f"hyla train: error: {err}", file=sys.stderr)
        return 2
    if len(groups) > 1:
        print(describe_plan([[cfgs[i] for i in g] for g in groups]) + ", trained one after another", flush=True)
    for group in groups:
        g_cfgs, g_outs = [cfgs[i] for i in group], [outs[i] for i in group]
        common = {"device": args.device, "resume": args.resume, "stop_at_step": args.stop_at_step, "quiet": args.quiet}
        trainer: Trainer | None = None
        try:
            trainer = Trainer(g_cfgs, g_outs, engine=engine_for(g_cfgs), **common)
            results = trainer.run()
        except (ValueError, CheckpointError, NonFiniteLossError, Interrupted) as err:
            saved = "checkpoints saved" if several else "checkpoint saved"
            note = f"at step {trainer.step if trainer else 0}; {saved}, resume with --resume"
            return failure_exit_code(
                "hyla train", err, note, divergence_advice(getattr(err, "bf16", False), "choose another --out")
            )
        except OSError as err:  # a full or read-only disk: the atomic writes keep every earlier checkpoint intact
            print(f"hyla train: error: {checkpoint_write_failure(err, g_outs)}", file=sys.stderr)
            return 2
        finally:
            if trainer is not None:
                trainer.close()
        if trainer.step < g_cfgs[0].train.steps:  # --stop-at-step
            continue
        metric = trainer.task.primary_metric
        if not several:
            if results[0] and trainer.dist.is_main and not args.quiet:
                print("final " + ", ".join(f"{split} {metric}={v[metric]:.4f}" for split, v in results[0].items()))
            continue
        for out, res in zip(g_outs, results):
            print(f"{out}: " + ", ".join(f"{split} {metric}={v[metric]:.4f}" for split, v in res.items()))
    return 0


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="YAML path or the name of a packaged config (e.g. sraven, fuzzy_logic); a path wins")
    p.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides, e.g. model.attention=hyla")
    p.add_argument("--out", required=True, help=f"run directory (config.yaml, {METRICS}, tb/, checkpoints/)")
    p.add_argument("--device", default="cpu", help="cpu | cuda (default cpu)")
    p.add_argument("--resume", action="store_true", help="continue from the run directory's latest checkpoint")
    p.add_argument(
        "--stop-at-step",
        type=int,
        default=None,
        metavar="N",
        help="save a checkpoint at step N and exit 0 (what a preempted job does)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar: one line per log interval")
    p.add_argument("--seeds", help="e.g. 0,1,2: train these seeds together as one stacked model (OUT/seedN)")
    p.add_argument(
        "--sweep",
        metavar="FILE.yaml",
        help="'runs: [{train.lr: 3e-4}, ...]' and/or 'grid: {train.lr: [1e-3, 3e-4]}': one run per override set "
        "(OUT/lr0.0003 ...), stacked when they differ only in seed, split and optimizer hyperparameters",
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a model on a task (packaged configs: hyla/configs/)")
    add_train_arguments(p)
    p.set_defaults(func=run)
