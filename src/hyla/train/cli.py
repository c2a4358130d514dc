"""``hyla train CONFIG [key=value ...] --out DIR``: also runs under ``torchrun`` for DDP."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hyla.train.checkpoint import CheckpointError


def run(args: argparse.Namespace) -> int:
    from hyla.train.config import load_config
    from hyla.train.loop import Interrupted, NonFiniteLossError, Trainer

    if args.seeds or args.sweep:  # several runs stacked in one process: hyla.train.stacked
        from hyla.train.stacked import run_cli

        return run_cli(args)

    try:
        cfg = load_config(args.config, args.overrides)
        trainer = Trainer(
            cfg,
            Path(args.out),
            device=args.device,
            resume=args.resume,
            stop_at_step=args.stop_at_step,
            quiet=args.quiet,
        )
    except (ValueError, CheckpointError) as err:
        print(f"hyla train: error: {err}", file=sys.stderr)
        return 2
    try:
        results = trainer.run()
    except NonFiniteLossError as err:
        print(f"hyla train: error: {err}", file=sys.stderr)
        return 3
    except Interrupted as err:
        print(
            f"hyla train: {err} received at step {trainer.step}; checkpoint saved, resume with --resume",
            file=sys.stderr,
        )
        return 128 + err.signum
    finally:
        trainer.close()
    if results and trainer.dist.is_main and not args.quiet:
        metric = trainer.task.primary_metric
        print("final " + ", ".join(f"{split} {metric}={v[metric]:.4f}" for split, v in results.items()))
    return 0


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="YAML path or a name in configs/ (e.g. sraven, fuzzy_logic)")
    p.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides, e.g. model.attention=hyla")
    p.add_argument("--out", required=True, help="run directory (config.yaml, metrics.jsonl, tb/, checkpoints/)")
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
        "(OUT/lr0.0003 ...), stacked when they differ only in seed and optimizer hyperparameters",
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a model on a task (see configs/)")
    add_train_arguments(p)
    p.set_defaults(func=run)
