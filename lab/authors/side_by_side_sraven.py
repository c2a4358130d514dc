"""SRAVEN side by side: the authors' paper run next to ours, seed by seed, and the verdict table over seeds.

Their run: ``lab/authors/authors_side_by_side.sh authors-sraven-resumable VARIANT SEED`` (their
configs/raven.py at its full 156,250-step schedule, resumable, stopped after ``STEPS`` updates), read from
``AUTHORS_LOGS/sraven-<variant>-seed<S>/event.log``. Ours: the Table A1 sweep run of the same variant and seed
(``metrics.jsonl``), which trains the same schedule. Both codes log the number of updates made as the step (their
loop evaluates after update k + 1 at loop index k, logged k + 1: their evaluation logged 2,501 is listed beside
ours after 2,500 updates, one update apart).

Per seed (``--seed S``): prints two markdown tables and writes ``lab/tables/side_by_side/sraven_<variant>_seed<S>.json``
and a plot ``.png`` beside it:

- training loss, accuracy (all four answer features right), gradient norm and parameter norm per 1,000-update
  bin: the mean of their logged single-batch values in the bin (one every 250 updates) and of our
  ``train_batch`` values (loss and accuracy: means over the 250 steps before each line; the norms: the
  line's own update, as theirs). Both in training mode (attention dropout on). Our runs log the norms since
  commit a95aca3: older records have none ('-');
- ``test`` (training tasks) and ``ood`` (held-out tasks) accuracy at each evaluation.

``--their-runs``: the OOD accuracy at each evaluation of every run of theirs in ``AUTHORS_LOGS``, their seeds and
the swaps (split and batches of one seed, initial draw of another), one column each (``sraven_<variant>_their_runs.md``
in ``--dir``), and the first evaluation past the plateau (SRAVEN's ``PaperColumn.past_plateau``, the level
``hyla report --paper`` uses for our runs).

``--summary``: reads the per-seed JSON files and prints (and writes ``sraven_<variant>.md``) the accuracy at each
evaluation, theirs beside ours, mean +- s.e. over the seeds each has there.

The held-out rule combinations differ between the two codes for the same seed (theirs: a JAX permutation of
the 330 combinations, ours: numpy's), 82 of 330 in both.

Usage: .venv/bin/python lab/authors/side_by_side_sraven.py [--variant hyla] [--seed 0] [--authors-logs DIR]
       [--ours-run RUN_DIR] [--bin 1000] [--out FILE]
       .venv/bin/python lab/authors/side_by_side_sraven.py --summary [--variant hyla] [--seeds 0,1,2]
       .venv/bin/python lab/authors/side_by_side_sraven.py --their-runs --authors-logs DIR --dir DIR
           [--setting "lr 3e-4, wd 0.3, warmup 1000"]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
from side_by_side import REPO, _git, authors_commit, machine, parse_authors_log

from hyla.analysis.stats import first_reaching
from hyla.tasks import task_entry
from hyla.train.run.folder import read_run

OURS_SWEEP = REPO / "lab/runs/table_a1_sraven"
SIDE_BY_SIDE = REPO / "lab/tables/side_by_side"
BIN = 1000
TRAIN_METRICS = ("loss", "acc", "grad_norm", "param_norm")


#: their eval and training-batch prefixes -> our split names (for SRAVEN their test/ood are ours)
SPLITS = {"train": "train_batch", "test": "test", "ood": "ood"}


def parse_ours(run_dir: Path, last_step: int) -> list[dict[str, Any]]:
    """Our run directory's metrics up to ``last_step``, same fields."""
    out = []
    for rec in read_run(run_dir).metrics:
        if rec.get("split") in ("train_batch", "test", "ood") and rec["step"] <= last_step:
            out.append({k: rec[k] for k in ("step", "split", *TRAIN_METRICS) if k in rec})
    return out


def training_bins(curve: list[dict[str, Any]], last_step: int, width: int = BIN) -> dict[int, dict[str, float]]:
    """Mean of each training metric over the ``train_batch`` points in each full bin of ``width`` updates up to
    ``last_step`` (bin end -> means; a metric no point of the bin has is left out)."""
    bins: dict[int, list[dict[str, Any]]] = {}
    for p in curve:
        if p["split"] == "train_batch" and 0 < p["step"] <= last_step:
            bins.setdefault(-(-p["step"] // width) * width, []).append(p)
    out = {}
    for end, ps in sorted(bins.items()):
        if end <= last_step:
            out[end] = {
                m: float(np.mean([p[m] for p in ps if m in p])) for m in TRAIN_METRICS if any(m in p for p in ps)
            }
    return out


def evaluations(curve: list[dict[str, Any]], authors: bool) -> dict[tuple[int, str], float]:
    """Accuracy per (evaluation point, split): our step; their logged step - 1 (see the module docstring), except
    their evaluation at the end of the schedule, logged at the schedule's length (156,250 is no k + 1 of an
    ``eval_every`` multiple k; every ``eval_every`` of theirs is a multiple of 100)."""

    def point(step: int) -> int:
        return step - 1 if authors and (step - 1) % 100 == 0 else step

    return {(point(p["step"]), p["split"]): p["acc"] for p in curve if p["split"] != "train_batch"}


def cell(values: dict[str, float], metric: str, scale: float = 1.0, digits: int = 3) -> str:
    return f"{scale * values[metric]:.{digits}f}" if metric in values else "-"


def authors_devices(run_dir: Path) -> list[str]:
    """The devices their run trained on: ``cuda`` or ``cpu`` from each ``== STAMP: this call (DEVICE)`` line that
    ``gpu_sraven_verdict.sh`` writes to ``stdout.log``; ``["cpu"]`` for a run of ``authors_side_by_side.sh``
    (no such line)."""
    try:
        text = (run_dir / "stdout.log").read_text(errors="replace")
    except FileNotFoundError:
        return []
    found = re.findall(r"^== \S+: this call \((\w+)\)$", text, re.M)
    return sorted(set(found)) or ["cpu"]


def plot(path: Path, theirs: list[dict[str, Any]], ours: list[dict[str, Any]], title: str) -> None:
    """Training loss (their single batches, our 250-step means) and evaluation accuracy, both codes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 3.6))
    for curve, who, shift, color in ((theirs, "authors", 1, "tab:orange"), (ours, "ours", 0, "tab:blue")):
        train = [p for p in curve if p["split"] == "train_batch" and p["step"] > 1]
        ax_loss.plot([p["step"] for p in train], [p["loss"] for p in train], color=color, lw=0.8, label=who)
        for split, style in (("ood", "-o"), ("test", "--s")):
            pts = [p for p in curve if p["split"] == split]
            xs, ys = [p["step"] - shift for p in pts], [100 * p["acc"] for p in pts]
            ax_acc.plot(xs, ys, style, color=color, ms=3, label=f"{who} {split}")
    ax_loss.set(xlabel="updates", ylabel="training loss", title=title)
    ax_acc.set(xlabel="updates", ylabel="accuracy (%, all four features)")
    for ax in (ax_loss, ax_acc):
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def one_seed(args: argparse.Namespace) -> None:
    ours_run = args.ours_run or OURS_SWEEP / f"{args.variant}-lr0.001-weight_decay0.1-seed{args.seed}"
    authors_dir = args.authors_logs / f"sraven-{args.variant}-seed{args.seed}"
    theirs = parse_authors_log(authors_dir / "event.log", SPLITS, ("acc", "loss", "grad_norm", "param_norm"))
    last = max(p["step"] for p in theirs)  # updates they made
    ours = parse_ours(ours_run, last)

    their_bins, our_bins = training_bins(theirs, last, args.bin), training_bins(ours, last, args.bin)
    print(f"Training batches ({args.variant}, seed {args.seed}), mean per {args.bin}-update bin (authors / ours):\n")
    print("| updates | loss | acc (%) | gradient norm | parameter norm |")
    print("|---|---|---|---|---|")
    for end in sorted(set(their_bins) & set(our_bins)):
        a, o = their_bins[end], our_bins[end]
        cells = [
            f"{cell(a, 'loss')} / {cell(o, 'loss')}",
            f"{cell(a, 'acc', 100, 1)} / {cell(o, 'acc', 100, 1)}",
            f"{cell(a, 'grad_norm', digits=2)} / {cell(o, 'grad_norm', digits=2)}",
            f"{cell(a, 'param_norm', digits=2)} / {cell(o, 'param_norm', digits=2)}",
        ]
        print(f"| {end - args.bin + 1}-{end} | " + " | ".join(cells) + " |")
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
        "command": f"{args.authors_command}; lab/authors/side_by_side_sraven.py --variant VARIANT --seed SEED",
        "authors_devices": authors_devices(authors_dir),
        "machine": machine(),
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "authors_commit": authors_commit(args.authors_code, args.authors_mirror),
        "hyla_commit": _git(["-C", str(REPO), "rev-parse", "HEAD"]),
        "authors_updates": last,
        "ours_run": str(ours_run.relative_to(REPO)) if ours_run.is_relative_to(REPO) else str(ours_run),
    }
    out = args.out or SIDE_BY_SIDE / f"sraven_{args.variant}_seed{args.seed}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    curves = {"meta": meta, "variant": args.variant, "seed": args.seed, "authors": theirs, "ours": ours}
    out.write_text(json.dumps(curves, indent=1) + "\n")
    where = "+".join(meta["authors_devices"])
    plot(
        out.with_suffix(".png"),
        theirs,
        ours,
        f"SRAVEN {args.variant}, seed {args.seed}, lr 1e-3, wd 0.1 (theirs: {where})",
    )
    print(f"\nwrote {out} and {out.with_suffix('.png').name}")


def mean_se(values: list[float]) -> str:
    """``mean +- s.e.`` in percent (the s.e. only from two values on), with the number of seeds."""
    if not values:
        return "-"
    mean = 100 * float(np.mean(values))
    if len(values) < 2:
        return f"{mean:.1f} (1 seed)"
    se = 100 * float(np.std(values, ddof=1)) / np.sqrt(len(values))
    return f"{mean:.1f} +- {se:.1f} ({len(values)})"


def summary(args: argparse.Namespace) -> str:
    """Accuracy at each evaluation over the seeds' JSON files, theirs beside ours (markdown)."""
    theirs: dict[tuple[int, str], list[float]] = {}
    ours: dict[tuple[int, str], list[float]] = {}
    used = []
    for seed in args.seeds:
        path = args.dir / f"sraven_{args.variant}_seed{seed}.json"
        if not path.exists():
            continue
        used.append(seed)
        curves = json.loads(path.read_text())
        for who, into, authors in (("authors", theirs, True), ("ours", ours, False)):
            for key, acc in evaluations(curves[who], authors).items():
                into.setdefault(key, []).append(acc)
    lines = [
        f"SRAVEN {args.variant}, lr 1e-3, wd 0.1, warmup 1000: accuracy (%, all four answer features) at each "
        f"evaluation, mean +- s.e. over seeds (count in brackets; seeds {', '.join(map(str, used))}). Their "
        "evaluations use 12,800 problems per split, ours 51,200. `test` = training tasks, `ood` = held-out tasks.",
        "",
        "| updates | ood: authors | ood: ours | test: authors | test: ours |",
        "|---|---|---|---|---|",
    ]
    for step in sorted({s for s, _ in theirs} & {s for s, _ in ours}):
        if step <= 0:
            continue
        cells = [mean_se(d.get((step, split), [])) for split in ("ood", "test") for d in (theirs, ours)]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def their_runs(args: argparse.Namespace) -> str:
    """OOD accuracy at each evaluation of every run of theirs under ``--authors-logs`` (their seeds, and the swaps
    ``sraven-<variant>-seedS-initI`` of ``gpu_sraven_verdict.sh``: split and batches of seed S, initial weights and
    dropout stream of seed I), one column each (markdown)."""
    pattern = re.compile(rf"sraven-{re.escape(args.variant)}-seed(\d+)(?:-init(\d+))?$")
    runs = {}
    for run_dir in sorted(args.authors_logs.iterdir()):
        if (m := pattern.match(run_dir.name)) and (run_dir / "event.log").exists():
            data, init = m.group(1), m.group(2) or m.group(1)
            curve = parse_authors_log(run_dir / "event.log", SPLITS, ("acc", "loss"))
            runs[f"data {data}, init {init}"] = evaluations(curve, authors=True)
    steps = sorted({step for accs in runs.values() for step, split in accs if split == "ood" and step > 0})
    level = task_entry("sraven").paper_column.past_plateau
    lines = [
        f"SRAVEN {args.variant}, their code ({args.setting}): OOD accuracy (%, all four answer "
        "features) at each evaluation of each run: its split and batches from seed `data`, its initial weights "
        "and attention-dropout stream from seed `init`; 12,800 problems per evaluation. Their evaluation logged "
        f"k + 1 is listed at k. The last line: the first evaluation at {100 * level:g}% or more (past the plateau, "
        "as `hyla report --paper` reads our runs).",
        "",
        "| updates | " + " | ".join(runs) + " |",
        "|---|" + "---|" * len(runs),
    ]
    for step in steps:
        cells = [f"{100 * accs[(step, 'ood')]:.1f}" if (step, "ood") in accs else "-" for accs in runs.values()]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    firsts = [
        first_reaching([(s, v) for (s, split), v in accs.items() if split == "ood"], level) for accs in runs.values()
    ]
    cells = ["-" if step is None else f"{step:,}" for step in firsts]
    lines.append(f"| first >= {100 * level:g}% | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", default="hyla")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--summary", action="store_true", help="the table over seeds from the per-seed JSON files")
    ap.add_argument(
        "--their-runs", action="store_true", help="OOD accuracy of every run of theirs (seeds and swaps), per column"
    )
    ap.add_argument("--seeds", type=lambda v: [int(s) for s in v.split(",")], default=[0, 1, 2])
    ap.add_argument(
        "--setting", default="lr 1e-3, wd 0.1, warmup 1000", help="--their-runs: the grid point their runs trained at"
    )
    ap.add_argument("--dir", type=Path, default=SIDE_BY_SIDE, help="--summary: where the per-seed files are")
    ap.add_argument("--authors-logs", type=Path, default=SIDE_BY_SIDE / "authors")
    ap.add_argument(
        "--authors-command",
        default="lab/authors/authors_side_by_side.sh authors-sraven-resumable VARIANT SEED",
        help="what made their logs (recorded in the JSON), e.g. lab/gpu/gpu_sraven_verdict.sh",
    )
    ap.add_argument("--bin", type=int, default=BIN, help="updates per bin of the training table (default 1000)")
    ap.add_argument("--ours-run", type=Path, help="default: the Table A1 paper run of --variant and --seed")
    ap.add_argument("--authors-code", type=Path, default=Path(os.environ.get("AUTHORS_CODE", "/work/authors/code")))
    ap.add_argument("--authors-mirror", type=Path, default=Path("/work/.mirror/smonsays+hypernetwork-attention/repo"))
    ap.add_argument("--out", type=Path, help="default: lab/tables/side_by_side/sraven_<variant>_seed<S>.json")
    args = ap.parse_args()
    if args.summary or args.their_runs:
        text, name = (summary(args), "") if args.summary else (their_runs(args), "_their_runs")
        print(text)
        (args.dir / f"sraven_{args.variant}{name}.md").write_text(text)
        return
    one_seed(args)


if __name__ == "__main__":
    main()
