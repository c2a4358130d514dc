"""``hyla data TASK``: export the problems of a task, or exactly those a training config draws.

``hyla data fuzzy-logic --config fuzzy_logic seed=2 --split ood --num 1000 --out ood.npz`` builds the
task as ``hyla train fuzzy_logic seed=2`` does (its task options and its held-out split, including a
split that follows the run's ``seed``), so anyone can check a config's split without reading code.
Without ``--config``, the task options are flags (``--holdout``, ``--split-seed``, ...).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from pathlib import Path
from typing import Any

from hyla.tasks import REGISTRY, Task, TaskEntry, task_entry
from hyla.tasks.export import export_problems, save_npz


def export_flags(entry: TaskEntry) -> dict[str, Any]:
    """Flag (option name) -> default: the fields of the task's export options, whose defaults are the task's."""
    options = entry.flag_options()
    return {f.name: getattr(options(), f.name) for f in dataclasses.fields(options)}


def _task_from_flags(args: argparse.Namespace) -> Task:
    entry = task_entry(args.task)
    values = {k: d if getattr(args, k) is None else getattr(args, k) for k, d in export_flags(entry).items()}
    return entry.task_from_flags(values, 0 if args.split_seed is None else args.split_seed)


def _task_from_config(args: argparse.Namespace) -> Task:
    from hyla.train.build import build_task
    from hyla.train.config import load_config

    given = [k for k in [*export_flags(task_entry(args.task)), "split_seed"] if getattr(args, k) not in (None, False)]
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise ValueError(f"{flag} cannot be combined with --config; give it as an override (data.{given[0]}=...)")
    cfg = load_config(args.config, args.overrides)
    if cfg.data.task != args.task:
        raise ValueError(f"--config {args.config} trains data.task={cfg.data.task}, not {args.task}")
    return build_task(cfg)


def run(args: argparse.Namespace) -> int:
    if args.num < 1:
        print(f"hyla data: error: --num must be >= 1, got {args.num}", file=sys.stderr)
        return 2
    try:
        if args.overrides and not args.config:
            raise ValueError(f"overrides ({args.overrides[0]} ...) need --config")
        task = _task_from_config(args) if args.config else _task_from_flags(args)
        if args.split not in task.splits:
            raise ValueError(f"--split {args.split!r} is not valid; allowed values: {', '.join(task.splits)}")
        arrays = export_problems(task, args.split, args.num, args.seed)
        save_npz(Path(args.out), **arrays)
    except ValueError as err:
        print(f"hyla data: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"hyla data: error: --out {args.out}: cannot write it ({err.strerror or err})", file=sys.stderr)
        return 2
    shapes = ", ".join(f"{k} {v.shape}" for k, v in arrays.items())
    print(f"wrote {args.out}: {shapes}")
    return 0


def _add_option_flags(parser: argparse.ArgumentParser, entry: TaskEntry) -> None:
    """One flag per export option, its help and default from the options dataclass."""
    options = entry.flag_options()
    hints = typing.get_type_hints(options)
    for f in dataclasses.fields(options):
        default, about = getattr(options(), f.name), f.metadata.get("help", "")
        flag = "--" + f.name.replace("_", "-")
        if hints[f.name] is bool:
            parser.add_argument(flag, action="store_true", default=None, help=about)
            continue
        kind = next(t for t in (int, float, str) if t is hints[f.name] or t in typing.get_args(hints[f.name]))
        extra = "" if default is None else f"default {default}"
        parser.add_argument(flag, type=kind, help="; ".join(part for part in (about, extra) if part))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="export task problems as .npz (the format: the docs' tasks page)")
    tasks = p.add_subparsers(dest="task", metavar="TASK", required=True)
    for name, entry in REGISTRY.items():
        if entry.export_help is None:
            continue
        # the registry's name (as `hyla train` and the configs spell it) and its hyphenated form, both accepted
        spellings = sorted({name, name.replace("_", "-")}, key=lambda s: s != name)
        q = tasks.add_parser(spellings[0], aliases=spellings[1:], help=entry.export_help)
        _add_option_flags(q, entry)
        q.add_argument(
            "overrides",
            nargs="*",
            metavar="key.sub=value",
            help="with --config: overrides (seed=1 ...)",
        )
        q.add_argument(
            "--config", help="build the task as this training config does (a packaged config name or a path)"
        )
        q.add_argument("--split", required=True, help="a split of the task: train | test | ood | ...")
        q.add_argument("--num", type=int, required=True, help="number of problems")
        q.add_argument("--seed", type=int, default=0, help="seed of the problems (not of the split)")
        q.add_argument("--split-seed", type=int, help="which combinations are held out (default 0)")
        q.add_argument("--out", required=True, help="output .npz file (written atomically)")
        q.set_defaults(func=run, task=name)
