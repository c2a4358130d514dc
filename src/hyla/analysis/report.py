"""``hyla report RUN_DIR [RUN_DIR ...] --out DIR``: tables and plots over runs, seeds pooled.

Runs with the same configuration except ``seed``, ``name`` and ``train.data_seed`` form a group; the
table gives mean +- standard error (s.e. = std / sqrt(n), ddof 1; 0 for a single run) of the final
evaluation on every split, with the paper's Table A1 number beside it when the configuration is a
Table A1 setting (``hyla.analysis.paper_numbers``). Figures: learning curves (one panel per evaluated
split, one line per run); for each of ``SWEEP_KEYS`` in which the groups differ, OOD (mean +- s.e.)
against that key per attention variant, one factor at a time (``sweep_series``); with
``--latents N`` (default 512) the latent-code section: rule/term probe, topographic similarity (and
its correlation with OOD accuracy across runs, with a scatter plot), and for the first run of each
configuration the PCA / t-SNE embeddings per layer and the mean code per rule (SRAVEN).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from hyla.analysis.paper_numbers import paper_reference, paper_row
from hyla.analysis.plots import learning_curves, sweep_plot
from hyla.analysis.stats import format_mean_se, mean_se
from hyla.tasks import task_entry
from hyla.textio import error_line
from hyla.train.config import config_key, flat_config
from hyla.train.run.folder import RunRecord, metrics_path, read_run

SEED_KEYS = ("seed", "name", "train.data_seed")
SWEEP_KEYS = (
    "data.holdout",
    "model.num_layers",
    "model.width_multiplier",
    "train.steps",
    "model.single_head",
)


def group_runs(runs: list[RunRecord]) -> dict[str, list[RunRecord]]:
    groups: dict[str, list[RunRecord]] = {}
    for run in runs:
        key = config_key(flat_config(run.config), SEED_KEYS)
        groups.setdefault(key, []).append(run)
    return groups


def _label(config: dict[str, Any], varying: list[str]) -> str:
    flat = flat_config(config)
    parts = [f"{k.split('.')[-1]}={flat[k]}" for k in varying if k != "model.attention"]
    return flat["model.attention"] + (f" ({', '.join(parts)})" if parts else "")


def _sweep_x(config: dict[str, Any], key: str) -> float:
    flat = flat_config(config)
    if key == "train.steps":  # the data axis: problems seen = steps * batch size
        return flat["train.steps"] * flat["train.batch_size"]
    return flat[key]


Series = dict[str, tuple[list, list, list]]


def sweep_series(summary: list[dict[str, Any]], key: str, varying: list[str]) -> Series:
    """OOD (mean, s.e.) against ``key`` per attention variant, one factor at a time.

    Groups enter when every *other* varying key (besides the attention) has its most common value over
    the groups, so a Fig. 4-style collection (base, deeper, wider, more data) gives one sweep per axis."""
    others = [k for k in varying if k not in (key, "model.attention")]
    flats = [flat_config(e["config"]) for e in summary]
    base = {}
    for k in others:
        values = [json.dumps(f.get(k)) for f in flats]
        base[k] = max(values, key=values.count)
    series: Series = {}
    at_base = [all(json.dumps(f.get(k)) == base[k] for k in others) for f in flats]
    chosen = [e for e, ok in zip(summary, at_base) if ok and "ood" in e]
    for e in sorted(chosen, key=lambda e: _sweep_x(e["config"], key)):
        xs, ms, ses = series.setdefault(flat_config(e["config"])["model.attention"], ([], [], []))
        xs.append(_sweep_x(e["config"], key))
        ms.append(e["ood"][0])
        ses.append(e["ood"][1])
    return series if len({x for xs, _, _ in series.values() for x in xs}) >= 2 else {}


def build_report(run_dirs: list[str | Path], out: Path, latents: int = 0, permutations: int = 1000) -> str:
    """Write ``out/report.md`` and its figures; return the main table (markdown).

    ``latents > 0`` adds the latent-code section (probe, topographic similarity, embeddings) computed
    on that many problems per split for every run with a checkpoint."""
    runs = [read_run(p) for p in run_dirs]
    if not runs:
        raise ValueError("give at least one run directory")
    if latents < 0:
        raise ValueError(f"latents={latents} must be >= 0")
    tasks = sorted({r.config["data"]["task"] for r in runs})
    if len(tasks) > 1:
        raise ValueError(f"the runs mix tasks ({', '.join(tasks)}): report one task at a time")
    out.mkdir(parents=True, exist_ok=True)
    perplexity = runs[0].primary_metric == "ppl"  # language models: their own table
    if perplexity:
        runs = [_perplexity_from_loss(r) for r in runs]
    groups = group_runs(runs)
    flat_keys = [flat_config(json.loads(k)) for k in groups]
    varying = sorted({k for f in flat_keys for k in f if len({json.dumps(g.get(k)) for g in flat_keys}) > 1})
    if perplexity:
        return _text_report(runs, groups, varying, out)
    splits = [s for s in ("train", "test", "ood", "unseen_terms") if any(r.final(s) for r in runs)]
    if not splits:
        raise ValueError(
            f"no evaluation in {', '.join(str(metrics_path(r.path)) for r in runs)} yet (the first comes at "
            "step train.eval_every); report the runs after it"
        )
    task = task_entry(runs[0].config["data"]["task"])
    metric, unit = runs[0].primary_metric, task.metric_title
    columns = [(s, metric, f"{s} {unit} (%)") for s in splits]
    if any((r.final("ood") or {}).get("feature_acc") is not None for r in runs):  # SRAVEN: per answer feature
        columns.append(("ood", "feature_acc", "ood per-feature acc (%)"))
    rows, summary, labels = [], [], {}
    for key, members in groups.items():
        cfg = members[0].config
        labels[key] = _label(cfg, varying)
        cells, entry = [], {"label": labels[key], "n": len(members), "config": cfg}
        for s, name, _title in columns:
            values = [100 * r.final(s)[name] for r in members if r.final(s) and name in r.final(s)]
            if values:
                m, se = mean_se(values)
                cells.append(format_mean_se(m, se))
                if name == metric:
                    entry[s] = (m, se)
            else:
                cells.append("-")
        ref = paper_reference(cfg)
        cells += [f"{ref[0]:.2f} +- {ref[1]:.2f}", str(paper_row(cfg))] if ref else ["-", "-"]
        at = evaluated_at(members, splits[0])
        rows.append(f"| {entry['label']} | {len(members)} | {at} | " + " | ".join(cells) + " |")
        summary.append(entry)
    titles = " | ".join(title for _s, _m, title in columns)
    header = f"| configuration | seeds | step | {titles} | paper OOD (%) | paper row |"
    table = "\n".join([header, "|" + "---|" * (len(columns) + 5), *rows])

    learning_curves(
        runs,
        metric,
        [s for s in splits if s != "train"] or splits,
        out / "learning_curves.png",
        f"{unit} during training",
        groups=[_label(r.config, varying) for r in runs],
    )
    figures = ["learning_curves.png"]
    for key in SWEEP_KEYS:
        if key not in varying:
            continue
        series = sweep_series(summary, key, varying)
        if series:
            name = f"ood_vs_{key.split('.')[-1]}.png"
            xlabel = "training problems (steps x batch)" if key == "train.steps" else key
            sweep_plot(series, xlabel, f"OOD {unit} (%)", out / name)
            figures.append(name)
    sections = [
        f"# hyla report\n\nRuns: {len(runs)} in {len(groups)} configuration(s); the latest evaluation of "
        f"each run (step: where it was made, of the run's train.steps when a run has not finished), mean +- s.e. "
        f"over seeds (s.e. = sample std / sqrt(n); 0 for one seed). Paper: Table A1 "
        f"(mean +- s.e., 3 seeds) where the configuration matches it.\n\n{table}\n",
        "\n".join(f"![{f}]({f})" for f in figures) + "\n",
    ]
    if latents and task.latent_probe is not None:  # a task without a probe has no section
        from hyla.analysis.latent_summary import figure_lines, latent_section

        lines, latent_figs, results = latent_section(groups, labels, out, latents, permutations)
        sections.append("## Latent code\n\n" + "\n".join([*lines, "", *figure_lines(results, latent_figs)]) + "\n")
        (out / "latents.json").write_text(json.dumps(results, indent=2, default=str))
    sections.append(f"## Every evaluation ({metric}, %)\n\n{every_evaluation(runs, splits, metric)}\n")
    sections.append("Run directories:\n\n" + "\n".join(f"- `{r.path}`" for r in runs) + "\n")
    (out / "report.md").write_text("\n".join(sections))
    return table


def evaluated_at(members: list[RunRecord], split: str) -> str:
    """The step of the members' latest ``split`` evaluation: ``156,250`` when every run reached its
    ``train.steps``, else ``105,000-156,250 of 156,250`` (a mean over runs at different steps says so)."""
    steps = sorted({last["step"] for r in members if (last := r.final(split))})
    if not steps:  # a configuration whose runs have not reached their first evaluation yet
        return "-"
    planned = max(int(r.config["train"]["steps"]) for r in members)
    span = f"{steps[0]:,}" if len(steps) == 1 else f"{steps[0]:,}-{steps[-1]:,}"
    return span if steps == [planned] else f"{span} of {planned:,}"


def every_evaluation(runs: list[RunRecord], splits: list[str], metric: str) -> str:
    """One row per run and split, one column per evaluated step: ``metric`` in %, blank where not evaluated."""
    steps = sorted({step for run in runs for split in splits for step in run.curve(split, metric)[0]})
    lines = ["| run | split | " + " | ".join(str(s) for s in steps) + " |", "|---|---|" + "---|" * len(steps)]
    for run in runs:
        for split in splits:
            at = dict(zip(*run.curve(split, metric)))
            if at:
                cells = " | ".join(f"{100 * at[s]:.1f}" if s in at else "" for s in steps)
                lines.append(f"| {run.name} | {split} | {cells} |")
    return "\n".join(lines)


def _mean_se_cell(values: list[float]) -> str:
    if not values:
        return "-"
    return format_mean_se(*mean_se(values))


def _perplexity_from_loss(run: RunRecord) -> RunRecord:
    """``run`` with ``ppl = exp(loss)`` in every row that has a loss: runs logged before 2026-11-23 give
    ``ppl`` as the mean of per-sequence perplexities, which is larger than the split's perplexity."""
    rows = [{**m, "ppl": math.exp(m["loss"])} if "loss" in m else m for m in run.metrics]
    return RunRecord(run.path, run.config, rows)


def _tokens(run: RunRecord, step: int) -> int:
    """Training tokens after ``step`` updates (the batch is global: every process's share together)."""
    return step * run.config["train"]["batch_size"] * run.config["data"]["seq_len"]


def _text_report(runs: list[RunRecord], groups: dict[str, list[RunRecord]], varying: list[str], out: Path) -> str:
    """Language-model runs: perplexity (exp of the mean loss per token) table and validation curves."""
    columns = ("final val ppl", "best val ppl", "final train ppl")
    rows = []
    for members in groups.values():
        finals = [(r, r.final("val"), r.final("train")) for r in members]
        val = [v["ppl"] for _r, v, _t in finals if v]
        best = [min(r.curve("val", "ppl")[1]) for r, v, _t in finals if v]
        train = [t["ppl"] for _r, _v, t in finals if t]
        cells = [_mean_se_cell(values) for values in (val, best, train)]
        steps = sorted({v["step"] for _r, v, _t in finals if v})
        tokens = ", ".join(f"{_tokens(members[0], s) / 1e6:.2f}M" for s in steps) or "-"
        rows.append(f"| {_label(members[0].config, varying)} | {len(members)} | {tokens} | " + " | ".join(cells) + " |")
    header = f"| configuration | seeds | training tokens | {' | '.join(columns)} |"
    table = "\n".join([header, "|" + "---|" * (len(columns) + 3), *rows])
    curves = out / "learning_curves.png"
    labels = [_label(r.config, varying) for r in runs]  # seeds of a configuration share its label
    learning_curves(runs, "ppl", ["val", "train"], curves, "perplexity during training", log_y=True, groups=labels)
    (out / "report.md").write_text(
        f"# hyla report\n\nRuns: {len(runs)} language-model runs in {len(groups)} configuration(s); "
        "perplexity = exp(mean loss per token) of each run's evaluation windows, mean +- s.e. over seeds "
        "(s.e. = sample std / sqrt(n); 0 for one seed); best = lowest validation perplexity of any "
        f"evaluation. The paper reports its language-model results as curves only (Fig. 6).\n\n{table}\n\n"
        "![learning_curves.png](learning_curves.png)\n\nRun directories:\n\n"
        + "\n".join(f"- `{r.path}`" for r in runs)
        + "\n"
    )
    return table


def report_error(err: ValueError | OSError) -> int:
    print(f"hyla report: error: {error_line(err)}", file=sys.stderr)
    return 2


def readme_table_command(out: str | None, sweep_root: str | None) -> int:
    """Print the README's paper-vs-ours table; with ``out`` (a README) also rewrite it between the markers."""
    from hyla.analysis.paper_report import readme_table, replace_readme_table
    from hyla.train.sweeps import RECORD_ROOT

    try:
        table = readme_table(Path(sweep_root or RECORD_ROOT))
        if out is not None:
            path = Path(out)
            path.write_text(replace_readme_table(path.read_text(), table))
    except (ValueError, OSError) as err:
        return report_error(err)
    print(table)
    return 0


def run(args: argparse.Namespace) -> int:
    if args.readme_table:
        return readme_table_command(args.out, args.sweep_root)
    if args.out is None:
        print("hyla report: error: --out DIR is required", file=sys.stderr)
        return 2
    if args.paper:
        from hyla.analysis.paper_report import LATENT_PROBLEMS, paper_report
        from hyla.train.sweeps import RECORD_ROOT

        try:
            latents = LATENT_PROBLEMS if args.latents is None else args.latents
            paper_report(Path(args.out), Path(args.sweep_root or RECORD_ROOT), args.runs or None, latents=latents)
        except (ValueError, OSError) as err:
            return report_error(err)
        print(f"report: {Path(args.out) / 'paper.md'}")
        return 0
    if not args.runs:
        print("hyla report: error: give RUN_DIR(s), or --paper [SWEEP ...]", file=sys.stderr)
        return 2
    try:
        latents = 512 if args.latents is None else args.latents
        table = build_report(args.runs, Path(args.out), latents, args.permutations)
    except (ValueError, OSError) as err:
        return report_error(err)
    print(table)
    print(f"\nreport: {Path(args.out) / 'report.md'}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="tables (mean +- s.e. over seeds) and plots over run directories")
    p.add_argument("runs", nargs="*", metavar="RUN_DIR", help="run directories (with --paper: sweep names)")
    p.add_argument(
        "--paper",
        action="store_true",
        help="OUT/paper.md: ours beside the paper from the sweep records (sweeps: table_a1_fuzzy, table_a1_sraven, "
        "fig2c_fuzzy unless named)",
    )
    p.add_argument(
        "--readme-table",
        action="store_true",
        help="print the README's ours-vs-paper table from the sweep records; with --out README.md, also put it "
        "between the README's paper-table markers",
    )
    p.add_argument("--sweep-root", help="where the sweep records are (default results/sweeps)")
    p.add_argument("--out", help="DIR for report.md and the PNG figures (with --readme-table: the README to update)")
    p.add_argument(
        "--latents",
        type=int,
        default=None,
        metavar="N",
        help="latent-code section on N problems per split for runs with weights (0: skip; default 512, "
        "with --paper 2048 for finished runs)",
    )
    p.add_argument("--permutations", type=int, default=1000, help="topographic-similarity permutation test")
    p.set_defaults(func=run)
