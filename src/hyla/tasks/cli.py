"""``hyla data``: export problems as ``.npz`` for other frameworks (format in the README)."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from hyla.tasks.fuzzy_logic import FuzzyLogic
from hyla.tasks.sraven import RULE_NAMES, SRaven

_CHUNK = 65_536


def _save_npz(path: Path, **arrays: np.ndarray) -> None:
    """Write atomically: a temporary file in the same folder, then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".npz")
    os.close(fd)
    try:
        np.savez_compressed(tmp, **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def export_sraven(task: SRaven, split: str, num: int, seed: int) -> dict[str, np.ndarray]:
    """``grid`` (N, G, G, F) as the model sees it, ``rules`` (N, F) per canonical feature, ``perm`` (N, G, F)
    with ``grid[n, r, c, i] == canonical[n, r, c, perm[n, c, i]]``, ``task_id`` (N,), ``rule_names``.

    Drawn in chunks from ``torch.Generator().manual_seed(seed)`` on the CPU: the same arguments give
    the same file."""
    task.check_split(split)
    gen = torch.Generator().manual_seed(seed)
    parts: dict[str, list[np.ndarray]] = {"grid": [], "rules": [], "perm": [], "task_id": []}
    for start in range(0, num, _CHUNK):
        p = task.sample_problems(min(_CHUNK, num - start), split, gen)
        if task.unambiguous_only:
            from hyla.tasks.sraven_ambiguity import resample_ambiguous

            p = resample_ambiguous(task, p, split, gen)
        for k, v in parts.items():
            v.append(p[k].numpy().astype(np.int64))
    out = {k: np.concatenate(v) for k, v in parts.items()}
    out["rule_names"] = np.array(RULE_NAMES)
    return out


def export_fuzzy_logic(task: FuzzyLogic, split: str, num: int, seed: int) -> dict[str, np.ndarray]:
    """``x`` (N, T, L) float32, ``y`` (N, T) float32 (true targets, the last included), ``terms``
    (N, K, L) bool (True: literal x_i, False: 1 - x_i), ``task_id`` (N,)."""
    task.check_split(split)
    gen = torch.Generator().manual_seed(seed)
    parts: dict[str, list[np.ndarray]] = {"x": [], "y": [], "terms": [], "task_id": []}
    for start in range(0, num, _CHUNK):
        batch = task.sample(min(_CHUNK, num - start), split, gen)
        parts["x"].append(batch.inputs[..., : task.num_variables].numpy())
        parts["y"].append(batch.targets.numpy())
        parts["terms"].append(batch.info["terms"].numpy())
        parts["task_id"].append(batch.info["task_id"].numpy().astype(np.int64))
    return {k: np.concatenate(v) for k, v in parts.items()}


def _parse_rules(text: str | None) -> list[str] | None:
    return None if text is None else [r.strip() for r in text.split(",") if r.strip()]


def run(args: argparse.Namespace) -> int:
    if args.num < 1:
        print(f"hyla data: error: --num must be >= 1, got {args.num}", file=sys.stderr)
        return 2
    try:
        task: SRaven | FuzzyLogic
        if args.task == "sraven":
            task = SRaven(
                num_features=args.num_features,
                num_values=args.num_values,
                grid_size=args.grid_size,
                rules=_parse_rules(args.rules),
                holdout=args.holdout,
                split_seed=args.split_seed,
                unambiguous_only=args.unambiguous_only,
            )
        else:
            task = FuzzyLogic(
                num_variables=args.num_variables,
                num_terms=args.num_terms,
                num_examples=args.num_examples,
                holdout=args.holdout,
                split_seed=args.split_seed,
                num_unseen_terms=args.num_unseen_terms,
            )
        if args.split not in task.splits:
            raise ValueError(f"--split {args.split!r} is not valid; allowed values: {', '.join(task.splits)}")
        if isinstance(task, SRaven):
            arrays = export_sraven(task, args.split, args.num, args.seed)
        else:
            arrays = export_fuzzy_logic(task, args.split, args.num, args.seed)
    except ValueError as err:
        print(f"hyla data: error: {err}", file=sys.stderr)
        return 2
    _save_npz(Path(args.out), **arrays)
    shapes = ", ".join(f"{k} {v.shape}" for k, v in arrays.items())
    print(f"wrote {args.out}: {shapes}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="export task problems as .npz (format: README, 'Task data')")
    tasks = p.add_subparsers(dest="task", metavar="TASK", required=True)
    s = tasks.add_parser("sraven", help="symbolic Raven problems: grid, rules, perm, task_id, rule_names")
    s.add_argument("--holdout", type=float, default=0.25, help="fraction of rule combinations held out (ood)")
    s.add_argument("--num-features", type=int, default=4)
    s.add_argument("--num-values", type=int, default=8)
    s.add_argument("--grid-size", type=int, default=3)
    s.add_argument("--rules", help=f"comma-separated subset of: {','.join(RULE_NAMES)} (default: all)")
    s.add_argument("--unambiguous-only", action="store_true", help="resample ambiguous problems")
    f = tasks.add_parser("fuzzy-logic", help="fuzzy-logic regression sequences: x, y, terms, task_id")
    f.add_argument("--holdout", type=float, default=0.7, help="fraction of term combinations held out (ood)")
    f.add_argument("--num-variables", type=int, default=4)
    f.add_argument("--num-terms", type=int, default=2)
    f.add_argument("--num-examples", type=int, default=32)
    f.add_argument("--num-unseen-terms", type=int, default=2, help="terms reserved for the unseen_terms split")
    for q, task in ((s, "sraven"), (f, "fuzzy_logic")):
        q.add_argument("--split", required=True, help="train | test | ood (| unseen_terms for fuzzy logic)")
        q.add_argument("--num", type=int, required=True, help="number of problems")
        q.add_argument("--seed", type=int, default=0, help="seed of the problems (not of the split)")
        q.add_argument("--split-seed", type=int, default=0, help="which combinations are held out")
        q.add_argument("--out", required=True, help="output .npz file (written atomically)")
        q.set_defaults(func=run, task=task)
