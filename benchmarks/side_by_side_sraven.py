"""SRAVEN side by side: the first steps of the authors' paper run next to our paper run of the same seed.

Their run: ``benchmarks/authors_side_by_side.sh authors-sraven VARIANT SEED`` (their configs/raven.py at its
full 156,250-step schedule, stopped after ``STEPS`` updates), read from ``AUTHORS_LOGS/sraven-<variant>-seed<S>/
event.log``. Ours: the Table A1 sweep run of the same variant and seed (``metrics.jsonl``), which trains the
same schedule. Prints two markdown tables and writes ``results/side_by_side/sraven_<variant>_seed<S>.json``:

- training loss and accuracy (all four answer features right) per 1,000-step bin: the mean of their logged
  single-batch values in the bin (one every 250 updates) and of our ``train_batch`` values (each a mean over
  the 250 steps before it). Both are taken in training mode (attention dropout on);
- ``test`` (training tasks) and ``ood`` (held-out tasks) accuracy at each evaluation. Their evaluation after
  k updates is logged as step k + 1 (see side_by_side.py) and listed at k.

The held-out rule combinations differ between the two codes for the same seed (theirs: a JAX permutation of
the 330 combinations, ours: numpy's), 82 of 330 in both.

Usage: .venv/bin/python benchmarks/side_by_side_sraven.py [--variant hyla] [--seed 0] [--authors-logs DIR]
       [--ours-run RUN_DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from side_by_side import REPO, _git, authors_commit, machine, parse_authors_log

from hyla.train.rundir import read_run

OURS_SWEEP = REPO / "results/sweeps/table_a1_sraven"
BIN = 1000


#: their eval and training-batch prefixes -> our split names (for SRAVEN their test/ood are ours)
SPLITS = {"train": "train_batch", "test": "test", "ood": "ood"}


def parse_ours(run_dir: Path, last_step: int) -> list[dict[str, Any]]:
    """Our run directory's metrics up to ``last_step``, same fields."""
    out = []
    for rec in read_run(run_dir).metrics:
        if rec.get("split") in ("train_batch", "test", "ood") and rec["step"] <= last_step:
            out.append({k: rec[k] for k in ("step", "split", "loss", "acc") if k in rec})
    return out


def training_bins(curve: list[dict[str, Any]], authors: bool, last_step: int) -> dict[int, dict[str, float]]:
    """Mean loss and acc of the ``train_batch`` points in each full bin up to ``last_step`` (end step -> means)."""
    bins: dict[int, list[dict[str, Any]]] = {}
    for p in curve:
        if p["split"] != "train_batch":
            continue
        updates = p["step"] - 1 if authors else p["step"]  # their step k + 1 is logged after k updates
        if 0 < updates <= last_step:
            bins.setdefault(-(-updates // BIN) * BIN, []).append(p)
    return {
        end: {m: float(np.mean([p[m] for p in ps])) for m in ("loss", "acc")}
        for end, ps in sorted(bins.items())
        if end <= last_step
    }


def evaluations(curve: list[dict[str, Any]], authors: bool) -> dict[tuple[int, str], float]:
    """Accuracy per (updates made, split) of the evaluations."""
    shift = 1 if authors else 0
    return {(p["step"] - shift, p["split"]): p["acc"] for p in curve if p["split"] != "train_batch"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", default="hyla")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--authors-logs", type=Path, default=REPO / "runs/side_by_side/authors")
    ap.add_argument("--ours-run", type=Path, help="default: the Table A1 paper run of --variant and --seed")
    ap.add_argument("--authors-code", type=Path, default=Path(os.environ.get("AUTHORS_CODE", "/work/authors/code")))
    ap.add_argument("--authors-mirror", type=Path, default=Path("/work/.mirror/smonsays+hypernetwork-attention/repo"))
    ap.add_argument("--out", type=Path, help="default: results/side_by_side/sraven_<variant>_seed<S>.json")
    args = ap.parse_args()

    ours_run = args.ours_run or OURS_SWEEP / f"{args.variant}-lr0.001-weight_decay0.1-seed{args.seed}"
    authors_dir = args.authors_logs / f"sraven-{args.variant}-seed{args.seed}"
    theirs = parse_authors_log(authors_dir / "event.log", SPLITS, ("acc", "loss"))
    last = max(p["step"] - 1 for p in theirs)  # updates they made
    ours = parse_ours(ours_run, last)

    their_bins, our_bins = training_bins(theirs, True, last), training_bins(ours, False, last)
    print(f"Training batches ({args.variant}, seed {args.seed}), mean per {BIN}-step bin:\n")
    print("| steps | loss: authors | loss: ours | acc (%): authors | acc (%): ours |")
    print("|---|---|---|---|---|")
    for end in sorted(set(their_bins) & set(our_bins)):
        a, o = their_bins[end], our_bins[end]
        acc = f"{100 * a['acc']:.1f} | {100 * o['acc']:.1f}"
        print(f"| {end - BIN + 1}-{end} | {a['loss']:.3f} | {o['loss']:.3f} | {acc} |")
    their_evals, our_evals = evaluations(theirs, True), evaluations(ours, False)
    print("\nEvaluation accuracy (%, all four answer features right; '-' = no evaluation at that step):\n")
    print("| step | test: authors | test: ours | ood: authors | ood: ours |")
    print("|---|---|---|---|---|")
    for step in sorted({s for s, _ in their_evals | our_evals if s > 0}):
        cells = [
            f"{100 * v:.1f}" if v is not None else "-"
            for split in ("test", "ood")
            for v in (their_evals.get((step, split)), our_evals.get((step, split)))
        ]
        print(f"| {step} | " + " | ".join(cells) + " |")

    meta = {
        "command": "benchmarks/authors_side_by_side.sh authors-sraven VARIANT SEED; "
        "benchmarks/side_by_side_sraven.py --variant VARIANT --seed SEED",
        "machine": machine(),
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "authors_commit": authors_commit(args.authors_code, args.authors_mirror),
        "hyla_commit": _git(["-C", str(REPO), "rev-parse", "HEAD"]),
        "authors_updates": last,
        "ours_run": str(ours_run.relative_to(REPO)) if ours_run.is_relative_to(REPO) else str(ours_run),
    }
    out = args.out or REPO / f"results/side_by_side/sraven_{args.variant}_seed{args.seed}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    curves = {"meta": meta, "variant": args.variant, "seed": args.seed, "authors": theirs, "ours": ours}
    out.write_text(json.dumps(curves, indent=1) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
