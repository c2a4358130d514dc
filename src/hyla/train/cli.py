"""``hyla train CONFIG [key=value ...] --out DIR``: also runs under ``torchrun`` for DDP."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hyla.train.checkpoint import CheckpointError


def stacked_configs(args: argparse.Namespace) -> tuple[list, list[Path]]:
    """Configs and run directories for ``--seeds`` / ``--sweep`` (runs stacked in one process)."""
    import yaml

    from hyla.train.config import load_config

    sets: list[tuple[str, list[str]]] = []
    if args.seeds:
        try:
            seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        except ValueError:
            raise ValueError(f"--seeds must be comma-separated integers, got {args.seeds!r}") from None
        sets = [(f"seed{s}", [f"seed={s}"]) for s in seeds]
    if args.sweep:
        spec = yaml.safe_load(Path(args.sweep).read_text()) or {}
        entries = spec.get("runs") if isinstance(spec, dict) else None
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise ValueError(f"{args.sweep}: expected a mapping with a list 'runs' of override mappings")
        base = sets or [("", [])]
        sets = [
            (
                "_".join(x for x in (b_name, "_".join(f"{k.split('.')[-1]}{v}" for k, v in e.items())) if x),
                [*b_over, *(f"{k}={v}" for k, v in e.items())],
            )
            for b_name, b_over in base
            for e in entries
        ]
    cfgs, outs = [], []
    for name, overrides in sets:
        cfg = load_config(args.config, [*args.overrides, *overrides])
        cfg.name = f"{cfg.name}_{name}"
        cfgs.append(cfg)
        outs.append(Path(args.out) / name)
    return cfgs, outs


def run(args: argparse.Namespace) -> int:
    from hyla.train.config import load_config
    from hyla.train.loop import Interrupted, NonFiniteLossError, Trainer

    if args.seeds or args.sweep:
        from hyla.train.stacked import StackedTrainer

        try:
            cfgs, outs = stacked_configs(args)
            trainer_ = StackedTrainer(
                cfgs, outs, device=args.device, resume=args.resume, quiet=args.quiet, stop_at_step=args.stop_at_step
            )
            results = trainer_.run()
        except (ValueError, CheckpointError) as err:
            print(f"hyla train: error: {err}", file=sys.stderr)
            return 2
        metric = trainer_.task.primary_metric
        for out, res in zip(outs, results if trainer_.step >= cfgs[0].train.steps else []):
            print(f"{out}: " + ", ".join(f"{split} {metric}={v[metric]:.4f}" for split, v in res.items()))
        return 0

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
        help="YAML with 'runs: [{train.lr: 3e-4}, ...]': stacked runs differing in seed, train.lr, train.weight_decay",
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a model on a task (see configs/)")
    add_train_arguments(p)
    p.set_defaults(func=run)
