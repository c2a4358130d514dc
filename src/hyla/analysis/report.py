"""``hyla report RUN_DIR [RUN_DIR ...] --out DIR``: tables and plots over runs, seeds pooled.

Runs with the same configuration except ``seed``, ``name`` and ``train.data_seed`` form a group; the
table gives mean +- standard error (s.e. = std / sqrt(n), ddof 1; 0 for a single run) of the final
evaluation on every split, with the paper's Table A1 number beside it when the configuration is a
Table A1 setting. If groups differ in one of ``SWEEP_KEYS`` (besides the attention variant), an OOD
versus that key plot is drawn per variant.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from hyla.analysis.paper import paper_reference
from hyla.analysis.plots import learning_curves, sweep_plot
from hyla.analysis.runs import Run, load_run

SEED_KEYS = ("seed", "name", "train.data_seed")
SWEEP_KEYS = ("data.holdout", "model.num_layers", "model.width_multiplier", "train.steps", "model.single_head")


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def group_runs(runs: list[Run]) -> dict[str, list[Run]]:
    groups: dict[str, list[Run]] = {}
    for run in runs:
        key = json.dumps({k: v for k, v in sorted(flatten(run.config).items()) if k not in SEED_KEYS})
        groups.setdefault(key, []).append(run)
    return groups


def mean_se(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def _label(config: dict[str, Any], varying: list[str]) -> str:
    flat = flatten(config)
    parts = [f"{k.split('.')[-1]}={flat[k]}" for k in varying if k != "model.attention"]
    return flat["model.attention"] + (f" ({', '.join(parts)})" if parts else "")


def build_report(run_dirs: list[str | Path], out: Path) -> str:
    runs = [load_run(p) for p in run_dirs]
    if not runs:
        raise ValueError("give at least one run directory")
    out.mkdir(parents=True, exist_ok=True)
    groups = group_runs(runs)
    flat_keys = [flatten(json.loads(k)) for k in groups]
    varying = sorted({k for f in flat_keys for k in f if len({json.dumps(g.get(k)) for g in flat_keys}) > 1})
    splits = [s for s in ("train", "test", "ood", "unseen_terms") if any(r.final(s) for r in runs)]
    metric = runs[0].primary_metric
    rows, summary = [], []
    for members in groups.values():
        cfg = members[0].config
        cells, entry = [], {"label": _label(cfg, varying), "n": len(members), "config": cfg}
        for s in splits:
            values = [100 * r.final(s)[metric] for r in members if r.final(s)]
            if values:
                m, se = mean_se(values)
                cells.append(f"{m:.2f} +- {se:.2f}")
                entry[s] = (m, se)
            else:
                cells.append("-")
        ref = paper_reference(cfg)
        cells.append(f"{ref[0]:.2f} +- {ref[1]:.2f}" if ref else "-")
        rows.append(f"| {entry['label']} | {len(members)} | " + " | ".join(cells) + " |")
        summary.append(entry)
    unit = "accuracy" if metric == "acc" else "R^2"
    header = "| configuration | seeds | " + " | ".join(f"{s} {unit} (%)" for s in splits) + " | paper OOD (%) |"
    table = "\n".join([header, "|" + "---|" * (len(splits) + 3), *rows])

    learning_curves(
        runs,
        metric,
        [s for s in splits if s != "train"] or splits,
        out / "learning_curves.png",
        f"{unit} during training",
    )
    figures = ["learning_curves.png"]
    for key in SWEEP_KEYS:
        if key not in varying or not set(varying) <= {key, "model.attention"}:
            continue
        series: dict[str, tuple[list, list, list]] = {}
        for e in sorted(summary, key=lambda e: flatten(e["config"])[key]):
            if "ood" in e:
                xs, ms, ses = series.setdefault(flatten(e["config"])["model.attention"], ([], [], []))
                xs.append(flatten(e["config"])[key])
                ms.append(e["ood"][0])
                ses.append(e["ood"][1])
        name = f"ood_vs_{key.split('.')[-1]}.png"
        sweep_plot(series, key, f"OOD {unit} (%)", out / name)
        figures.append(name)
    text = (
        f"# hyla report\n\nRuns: {len(runs)} in {len(groups)} configuration(s); final evaluation of each run, "
        f"mean +- s.e. over seeds. Paper: Table A1 where the configuration matches it.\n\n{table}\n\n"
        + "\n".join(f"![{f}]({f})" for f in figures)
        + "\n\nRun directories:\n"
        + "\n".join(f"- `{r.path}`" for r in runs)
        + "\n"
    )
    (out / "report.md").write_text(text)
    return table


def run(args: argparse.Namespace) -> int:
    try:
        table = build_report(args.runs, Path(args.out))
    except ValueError as err:
        print(f"hyla report: error: {err}")
        return 2
    print(table)
    print(f"\nreport: {Path(args.out) / 'report.md'}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="tables (mean +- s.e. over seeds) and plots over run directories")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--out", required=True)
    p.set_defaults(func=run)
