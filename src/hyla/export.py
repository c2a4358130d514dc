"""``hyla data TASK``: export the problems of a task, or exactly those a training config draws.

``hyla data fuzzy-logic --config fuzzy_logic seed=2 --split ood --num 1000 --out ood.npz`` builds the
task as ``hyla train fuzzy_logic seed=2`` does (its task options and its held-out split, including a
split that follows the run's ``seed``), so anyone can check a config's split without reading code.
Without ``--config``, the task options are flags (``--holdout``, ``--split-seed``, ...).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from hyla.tasks.cli import _save_npz, export_fuzzy_logic, export_sraven
from hyla.tasks.fuzzy_logic import FuzzyLogic
from hyla.tasks.sraven import RULE_NAMES, SRaven

#: flag -> default of the task options that ``--config`` replaces (given with it, they are an error)
SRAVEN_FLAGS: dict[str, Any] = {
    "holdout": 0.25,
    "num_features": 4,
    "num_values": 8,
    "grid_size": 3,
    "rules": None,
    "unambiguous_only": False,
}
FUZZY_FLAGS: dict[str, Any] = {
    "holdout": 0.7,
    "num_variables": 4,
    "num_terms": 2,
    "num_examples": 32,
    "num_unseen_terms": 2,
}


def _parse_rules(text: str | None) -> list[str] | None:
    return None if text is None else [r.strip() for r in text.split(",") if r.strip()]


def _task_from_flags(args: argparse.Namespace) -> SRaven | FuzzyLogic:
    flags = SRAVEN_FLAGS if args.task == "sraven" else FUZZY_FLAGS
    values = {k: flags[k] if getattr(args, k) is None else getattr(args, k) for k in flags}
    split_seed = 0 if args.split_seed is None else args.split_seed
    if args.task == "sraven":
        return SRaven(**{**values, "rules": _parse_rules(values["rules"])}, split_seed=split_seed)
    return FuzzyLogic(**values, split_seed=split_seed)


def _task_from_config(args: argparse.Namespace) -> SRaven | FuzzyLogic:
    from hyla.train.build import build_task
    from hyla.train.config import load_config

    flags = SRAVEN_FLAGS if args.task == "sraven" else FUZZY_FLAGS
    given = [k for k in [*flags, "split_seed"] if getattr(args, k) not in (None, False)]
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise ValueError(f"{flag} cannot be combined with --config; give it as an override (data.{given[0]}=...)")
    cfg = load_config(args.config, args.overrides)
    if cfg.data.task != args.task:
        raise ValueError(f"--config {args.config} trains data.task={cfg.data.task}, not {args.task}")
    task = build_task(cfg)
    assert isinstance(task, SRaven | FuzzyLogic)
    return task


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
        if isinstance(task, SRaven):
            arrays = export_sraven(task, args.split, args.num, args.seed)
        else:
            arrays = export_fuzzy_logic(task, args.split, args.num, args.seed)
        _save_npz(Path(args.out), **arrays)
    except ValueError as err:
        print(f"hyla data: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"hyla data: error: --out {args.out}: cannot write it ({err.strerror or err})", file=sys.stderr)
        return 2
    shapes = ", ".join(f"{k} {v.shape}" for k, v in arrays.items())
    print(f"wrote {args.out}: {shapes}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="export task problems as .npz (format: README, 'Task data')")
    tasks = p.add_subparsers(dest="task", metavar="TASK", required=True)
    s = tasks.add_parser("sraven", help="symbolic Raven problems: grid, rules, perm, task_id, rule_names")
    s.add_argument("--holdout", type=float, help="fraction of rule combinations held out (ood; default 0.25)")
    s.add_argument("--num-features", type=int, help="default 4")
    s.add_argument("--num-values", type=int, help="default 8")
    s.add_argument("--grid-size", type=int, help="default 3")
    s.add_argument("--rules", help=f"comma-separated subset of: {','.join(RULE_NAMES)} (default: all)")
    s.add_argument("--unambiguous-only", action="store_true", default=None, help="resample ambiguous problems")
    f = tasks.add_parser("fuzzy-logic", help="fuzzy-logic regression sequences: x, y, terms, task_id")
    f.add_argument("--holdout", type=float, help="fraction of term combinations held out (ood; default 0.7)")
    f.add_argument("--num-variables", type=int, help="default 4")
    f.add_argument("--num-terms", type=int, help="default 2")
    f.add_argument("--num-examples", type=int, help="default 32")
    f.add_argument("--num-unseen-terms", type=int, help="terms reserved for the unseen_terms split (default 2)")
    for q, task in ((s, "sraven"), (f, "fuzzy_logic")):
        q.add_argument(
            "overrides",
            nargs="*",
            metavar="key.sub=value",
            help="with --config: overrides (seed=1 ...)",
        )
        q.add_argument("--config", help="build the task as this training config does (a name in configs/ or a path)")
        q.add_argument("--split", required=True, help="train | test | ood (| unseen_terms for fuzzy logic)")
        q.add_argument("--num", type=int, required=True, help="number of problems")
        q.add_argument("--seed", type=int, default=0, help="seed of the problems (not of the split)")
        q.add_argument("--split-seed", type=int, help="which combinations are held out (default 0)")
        q.add_argument("--out", required=True, help="output .npz file (written atomically)")
        q.set_defaults(func=run, task=task)
