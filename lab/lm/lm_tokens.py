"""Validation perplexity against tokens (lab/tables/lm_cpu.md, section 5), from the records of the sweeps in lab/lm/.

    python lab/lm/lm_tokens.py                 # lab/tables/lm_tokens.md and lab/tables/lm_tokens.png
    python lab/lm/lm_tokens.py --best lm_lr_count linear   # the rate at which that row ended lowest

A run's tokens at an evaluation are its step x batch size x sequence length. A run still training shows the
evaluations it has reached (marked "in progress"); a sweep without records is left out. The first table and the
plot's solid lines are seed 0; where other seeds have records (seeds 1-2 train to half the steps, on the same
schedule), a second table gives each row's mean and standard error over the seeds that reached each token
count, and the HYLA - linear gap seed by seed; the plot draws those seeds faintly.
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass
from pathlib import Path

from hyla.analysis.stats import format_mean_se, mean_se
from hyla.train.run.folder import has_record, read_run, run_state

LAB = Path(__file__).resolve().parents[1]
RUNS = LAB / "runs"
SWEEPS = {
    "lm_tokens_tiny": "our preset (lm_tiny, 16 heads of 8)",
    "lm_tokens_wiki": "the authors' preset (lm_wiki), lr 1e-3",
    "lm_tokens_wiki_lr": "the authors' preset (lm_wiki), lr 3e-3",
}
#: the two that part 2 compares, and their key_normalization=count twins
GAP = ("hyla", "linear")
TABLE_TOKENS = (1.2e6, 2.5e6, 4.9e6, 9.8e6)
ROW_ORDER = ("softmax", "linear", "hyla", "linear_count", "hyla_count")


@dataclass
class Curve:
    sweep: str
    row: str
    run: str
    tokens: list[float]
    val_ppl: list[float]
    finished: bool
    lr: float
    key_normalization: str
    seed: int = 0


def seeds_of(sweep: str, runs: Path = RUNS) -> list[int]:
    """The seeds with records in ``sweep``'s folder, in order."""
    found = {int(m.group(1)) for p in (runs / sweep).glob("*-seed*") if (m := re.search(r"-seed(\d+)$", p.name))}
    return sorted(found)


def read_curves(sweep: str, runs: Path = RUNS, seed: int = 0) -> list[Curve]:
    curves = []
    for run_dir in sorted((runs / sweep).glob(f"*-seed{seed}")):
        if not has_record(run_dir):
            continue
        record = read_run(run_dir)
        cfg = record.config
        per_step = cfg["train"]["batch_size"] * cfg["data"]["seq_len"]
        steps, ppl = record.curve("val", "ppl")
        row = run_dir.name.split("-")[0]
        curves.append(
            Curve(
                sweep,
                row,
                run_dir.name,
                [s * per_step for s in steps],
                ppl,
                run_state(run_dir) == "done",
                cfg["train"]["lr"],
                cfg["model"].get("key_normalization", "none"),
                seed,
            )
        )
    return sorted(curves, key=lambda c: ROW_ORDER.index(c.row) if c.row in ROW_ORDER else len(ROW_ORDER))


def at_tokens(curve: Curve, tokens: float) -> float | None:
    """The validation perplexity of the evaluation nearest ``tokens`` (within 5%), or None."""
    best = min(range(len(curve.tokens)), key=lambda i: abs(curve.tokens[i] - tokens), default=None)
    if best is None or abs(curve.tokens[best] - tokens) > 0.05 * tokens:
        return None
    return curve.val_ppl[best]


def best_rate(sweep: str, row: str, runs: Path = RUNS) -> float:
    """The rate among ``sweep``'s finished runs of ``row`` whose last validation perplexity is lowest."""
    finals = {c.lr: c.val_ppl[-1] for c in read_curves(sweep, runs) if c.row == row and c.finished and c.val_ppl}
    if not finals:
        raise SystemExit(f"no finished run of row {row!r} in {runs / sweep}")
    return min(finals, key=finals.__getitem__)


def gap(curves: list[Curve], suffix: str) -> tuple[list[float], list[float]] | None:
    """HYLA - linear validation perplexity at the token counts both reached (rows ``hyla``/``linear`` + suffix)."""
    by_row = {c.row: c for c in curves}
    hyla, linear = by_row.get(GAP[0] + suffix), by_row.get(GAP[1] + suffix)
    if hyla is None or linear is None:
        return None
    shared = sorted(set(hyla.tokens) & set(linear.tokens))
    h, lin = dict(zip(hyla.tokens, hyla.val_ppl)), dict(zip(linear.tokens, linear.val_ppl))
    return shared, [h[t] - lin[t] for t in shared]


def gap_summary(tokens: list[float], gaps: list[float]) -> str:
    """Over every shared evaluation: at how many HYLA is ahead (a negative gap), and the widest gap either way."""
    ahead = [t for t, g in zip(tokens, gaps) if g < 0]
    widest = max(range(len(gaps)), key=lambda i: abs(gaps[i]))
    where = f", first at {tokens_text(ahead[0])}" if ahead else ""
    return (
        f"over all {len(gaps)} shared evaluations HYLA{'' if ahead else ' is'} ahead at {len(ahead)}{where}, the"
        f" widest gap {gaps[widest]:+.2f} at {tokens_text(tokens[widest])}"
    )


def tokens_text(tokens: float) -> str:
    return f"{tokens / 1e6:.1f}M" if tokens >= 1e5 else f"{tokens:,.0f}"


def table(all_curves: dict[str, list[Curve]], columns: tuple[float, ...] = TABLE_TOKENS) -> str:
    head = "| preset | row | key sums | lr | " + " | ".join(tokens_text(t) for t in columns) + " | state |"
    lines = [head, "|" + "---|" * (5 + len(columns))]
    for sweep, curves in all_curves.items():
        for c in curves:
            cells = [at_tokens(c, t) for t in columns]
            state = (
                "finished" if c.finished else f"in progress ({tokens_text(c.tokens[-1])})" if c.tokens else "started"
            )
            lines.append(
                f"| {sweep} | {c.row} | {c.key_normalization} | {c.lr:g} | "
                + " | ".join("" if v is None else f"{v:.2f}" for v in cells)
                + f" | {state} |"
            )
    gaps = []
    for sweep, curves in all_curves.items():
        for suffix in ("", "_count"):
            g = gap(curves, suffix)
            if g is None:
                continue
            by_tokens = dict(zip(*g))
            nearest = [min(by_tokens, key=lambda t, x=x: abs(t - x)) for x in columns if by_tokens]
            shown = [t for x, t in zip(columns, nearest) if abs(t - x) < 0.05 * x]
            points = [f"{by_tokens[t]:+.2f} at {tokens_text(t)}" for t in shown]
            if points:
                gaps.append(f"- {sweep}, HYLA{suffix} - linear{suffix}: " + ", ".join(points) + "; " + gap_summary(*g))
    return "\n".join([*lines, "", *gaps])


def seeds_table(by_seed: dict[str, dict[int, list[Curve]]], columns: tuple[float, ...] = TABLE_TOKENS) -> str:
    """Each row's mean +- s.e. over its seeds that reached each column (n where not all), and the HYLA -
    linear gap seed by seed there; only sweeps and rows with more than one seed. Empty when there are none."""
    lines, gaps = [], []
    for sweep, curves_by_seed in by_seed.items():
        if len(curves_by_seed) < 2:
            continue
        rows = [c.row for c in curves_by_seed[min(curves_by_seed)]]
        for row in rows:
            row_curves = [c for cs in curves_by_seed.values() for c in cs if c.row == row]
            if len(row_curves) < 2:
                continue
            cells = []
            for t in columns:
                values = [v for c in row_curves if (v := at_tokens(c, t)) is not None]
                if len(values) < 2:
                    cells.append("")
                    continue
                fewer = f" (n = {len(values)})" if len(values) < len(row_curves) else ""
                cells.append(format_mean_se(*mean_se(values)) + fewer)
            seeds = ", ".join(str(c.seed) for c in row_curves)
            lines.append(f"| {sweep} | {row} | {row_curves[0].lr:g} | {seeds} | " + " | ".join(cells) + " |")
        for suffix in ("", "_count"):
            per_seed = {seed: g for seed, cs in curves_by_seed.items() if (g := gap(cs, suffix)) is not None}
            if len(per_seed) < 2:
                continue
            for t in columns:
                at = {seed: dict(zip(*g)) for seed, g in per_seed.items()}
                near = {seed: min(d, key=lambda x: abs(x - t)) for seed, d in at.items() if d}
                if len(near) < 2 or any(abs(x - t) > 0.05 * t for x in near.values()):
                    continue
                points = ", ".join(f"{at[seed][x]:+.2f} (seed {seed})" for seed, x in near.items())
                gaps.append(f"- {sweep}, HYLA{suffix} - linear{suffix} at {tokens_text(t)}: {points}")
            for seed, g in per_seed.items():
                gaps.append(f"- {sweep}, HYLA{suffix} - linear{suffix}, seed {seed}: " + gap_summary(*g))
    if not lines:
        return ""
    head = "| preset | row | lr | seeds | " + " | ".join(tokens_text(t) for t in columns) + " |"
    return "\n".join([head, "|" + "---|" * (4 + len(columns)), *lines, "", *gaps])


def plot(all_curves: dict[str, list[Curve]], out: Path, others: dict[str, list[Curve]] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(all_curves), figsize=(5.5 * len(all_curves), 7), squeeze=False)
    for col, (sweep, curves) in enumerate(all_curves.items()):
        top, bottom = axes[0, col], axes[1, col]
        colors = {}
        for c in curves:
            style = "--" if c.key_normalization == "count" else "-"
            (line,) = top.plot([t / 1e6 for t in c.tokens], c.val_ppl, style, label=f"{c.row} (lr {c.lr:g})")
            colors[c.row] = line.get_color()
        for c in (others or {}).get(sweep, []):  # the other seeds, faint, in their row's colour
            top.plot([t / 1e6 for t in c.tokens], c.val_ppl, color=colors.get(c.row), alpha=0.35, lw=0.8)
        top.set_yscale("log")
        top.set_title(SWEEPS[sweep], fontsize=10)
        top.set_ylabel("validation perplexity")
        top.legend(fontsize=8)
        for suffix in ("", "_count"):
            g = gap(curves, suffix)
            if g is not None:
                bottom.plot(
                    [t / 1e6 for t in g[0]], g[1], "--" if suffix else "-", label=f"HYLA{suffix} - linear{suffix}"
                )
        bottom.axhline(0, color="gray", lw=0.8)
        bottom.set_xlabel("training tokens (millions)")
        bottom.set_ylabel("perplexity gap")
        if bottom.get_lines()[:-1]:
            bottom.legend(fontsize=8)
        finite = [v for c in curves for v in c.val_ppl if math.isfinite(v)]
        if finite:
            top.set_ylim(min(finite) * 0.9, min(max(finite), 20 * min(finite)) * 1.1)  # the first evaluations off
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--best", nargs=2, metavar=("SWEEP", "ROW"), help="print the best rate of ROW in SWEEP")
    parser.add_argument("--out", type=Path, default=LAB / "tables" / "lm_tokens")
    parser.add_argument("--runs", type=Path, default=RUNS, help="where the sweeps' records are")
    parser.add_argument(
        "--tokens", default=",".join(f"{t:g}" for t in TABLE_TOKENS), help="the table's token counts, comma-separated"
    )
    args = parser.parse_args()
    if args.best:
        print(best_rate(*args.best, runs=args.runs))
        return
    # every seed's records read once; seed 0 is the first table and the plot's solid lines
    by_seed = {
        sweep: {seed: read_curves(sweep, args.runs, seed) for seed in seeds_of(sweep, args.runs)} for sweep in SWEEPS
    }
    all_curves = {sweep: seeds[0] for sweep, seeds in by_seed.items() if seeds.get(0)}
    others = {sweep: [c for seed, cs in seeds.items() if seed != 0 for c in cs] for sweep, seeds in by_seed.items()}
    if not all_curves:
        raise SystemExit(f"no records of {', '.join(SWEEPS)} under {args.runs}")
    header = (
        "# Validation perplexity against tokens\n\n"
        "Generated by `python lab/lm/lm_tokens.py` from the records of `lab/runs/lm_tokens_tiny`,\n"
        "`lab/runs/lm_tokens_wiki` and `lab/runs/lm_tokens_wiki_lr`; the setup and what it shows: `lm_cpu.md`,\n"
        "section 5.\n\n"
        "Validation perplexity of seed 0 at the evaluation nearest each token count.\n\n"
    )
    columns = tuple(float(t) for t in args.tokens.split(","))
    text = header + table(all_curves, columns) + "\n"
    if seeds := seeds_table(by_seed, columns):
        text += (
            "\n## Over seeds\n\nMean +- s.e. (standard error of the mean) at the evaluation nearest each token count,"
            " over the seeds listed that reached it (n where not all; seeds 1-2 train to half the steps), and the"
            " HYLA - linear gap seed by seed.\n\n" + seeds + "\n"
        )
    args.out.with_suffix(".md").write_text(text)
    plot(all_curves, args.out.with_suffix(".png"), others)
    print(f"wrote {args.out.with_suffix('.md')} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
