"""Latent-code analysis of one run, as the CLI and ``hyla report`` use it: probe, topographic similarity.

By the task's probe (``hyla.tasks.entry.TaskEntry.latent_probe``). Rule probe (SRAVEN): codes of ``num``
problems of the ``test`` split (training tasks) and of the ``ood`` split (held-out tasks) are extracted
once; the probe is fit on the first and scored on the second; the topographic similarity is measured
on the ``ood`` task codes. Term probe (fuzzy logic): ridge on ``num`` sequences of the ``test`` split.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from hyla.analysis import compositionality as comp
from hyla.analysis.latents import collect_latents
from hyla.analysis.probes import rule_probe, term_probe
from hyla.tasks import REGISTRY, task_entry
from hyla.train.run.folder import RunRecord, load_trained, read_run

#: the splits whose codes are drawn: training tasks (in-distribution) and held-out tasks
FIGURE_SPLITS = ("test", "ood")


def latent_probe(run_dir: str | Path) -> str | None:
    """The latent-code probe of a run's task (``hyla.tasks.entry.TaskEntry.latent_probe``)."""
    return task_entry(read_run(run_dir).config["data"]["task"]).latent_probe


def require_rule_codes(run_dir: str | Path, what: str) -> None:
    """Raise unless the run's task has rule codes (``latent_probe == "rule"``), which ``what`` needs."""
    if latent_probe(run_dir) != "rule":
        task = read_run(run_dir).config["data"]["task"]
        tasks = " or ".join(name for name, entry in REGISTRY.items() if entry.latent_probe == "rule")
        raise ValueError(f"{run_dir} is a {task} run; {what} {tasks} runs")


def probe_markdown(result: dict) -> list[str]:
    """Markdown lines for a ``rule_probe`` or ``term_probe`` result."""
    if "chance" in result:
        lines = [
            f"Rule probe: fit on {result['num_train']} answer slots of training tasks, scored on "
            f"{result['num_ood']} of held-out tasks. "
            f"Chance (most frequent OOD rule): {100 * result['chance']:.1f}%.",
            "",
            "| layer | OOD rule acc (%) | train acc (%) | shuffled-label control (%) |",
            "|---|---|---|---|",
        ]
        for k, v in result["layers"].items():
            acc, train, ctl = (100 * v[m] for m in ("ood_acc", "train_acc", "shuffled_label_ood_acc"))
            lines.append(f"| {k} | {acc:.1f} | {train:.1f} | {ctl:.1f} |")
        return lines
    ood = "num_ood" in result
    lines = [
        f"Term probe: ridge R^2 of the term literals from the code, fit on {result['num_fit']} sequences of "
        f"training combinations, scored on {result['num'] - result['num_fit']} others"
        + (f" and on {result['num_ood']} of held-out combinations (OOD)." if ood else "."),
        "",
        "| layer | R^2 | shuffled-label control |" + (" OOD R^2 | OOD shuffled control |" if ood else ""),
        "|---|---|---|" + ("---|---|" if ood else ""),
    ]
    for k, v in result["layers"].items():
        row = f"| {k} | {v['r2']:.3f} | {v['shuffled_label_r2']:.3f} |"
        lines.append(row + (f" {v['ood_r2']:.3f} | {v['shuffled_label_ood_r2']:.3f} |" if ood else ""))
    return lines


def run_probe(run_dir: str | Path, num: int, latents: dict | None = None) -> dict:
    """Probe result of a run (``latents``: already extracted ``{"test": ..., "ood": ...}`` to reuse)."""
    latents = latents if latents is not None else {}
    test = latents.get("test") or collect_latents(run_dir, "test", num)
    ood = latents.get("ood") or collect_latents(run_dir, "ood", num)
    if latent_probe(run_dir) == "rule":
        return rule_probe(test, ood)
    return term_probe(test["codes"], test["terms"], ood_codes=ood["codes"], ood_terms_MxKxL=ood["terms"])


def run_topsim(
    run_dir: str | Path, split: str, num: int, permutations: int, latents: dict | None = None
) -> dict[str, object]:
    """Topographic similarity (both task distances) of a SRAVEN run's task codes, and its final OOD acc."""
    require_rule_codes(run_dir, "topographic similarity needs")
    run = read_run(run_dir)
    lat = latents if latents is not None else collect_latents(run_dir, split, num)
    codes, rules = comp.task_codes(lat)
    entry: dict[str, object] = {"run": str(run_dir), "split": split}
    for kind in comp.TASK_DISTANCES:
        entry[kind] = comp.topographic_similarity(codes, rules, kind, permutations)
    final = run.final("ood")
    entry["ood_acc"] = float(final["acc"]) if final and "acc" in final else float("nan")
    return entry


def topsim_across_runs(entries: list[dict]) -> dict[str, dict]:
    """Per task distance: Spearman correlation of the runs' rho with their OOD accuracy."""
    ood = [float(e["ood_acc"]) for e in entries]
    return {k: comp.correlation_across_runs([e[k]["rho"] for e in entries], ood) for k in comp.TASK_DISTANCES}


def analyze_run(
    run_dir: str | Path, num: int, permutations: int = 1000, figures_dir: Path | None = None, prefix: str = ""
) -> dict[str, object]:
    """Probe (+ topographic similarity and figures for SRAVEN) of one run, reading its weights and codes once.

    SRAVEN figures (Fig. 5B/5E), with ``figures_dir``: ``sraven_latent_figures`` of
    the training tasks' codes (``{prefix}test_*.png``) and of the held-out tasks' (``{prefix}ood_*.png``);
    ``result["figures"][split][kind]`` is the file name of picture ``kind`` of ``split``."""
    from hyla.analysis.plots import sraven_latent_figures

    trained = load_trained(run_dir)
    lat = {split: collect_latents(trained, split, num) for split in FIGURE_SPLITS}
    out: dict[str, object] = {"run": str(run_dir), "task": trained.config.data.task, "weights": trained.weights}
    if task_entry(trained.config.data.task).latent_probe == "rule":
        out["topsim"] = run_topsim(run_dir, "ood", num, permutations, lat["ood"])
        if figures_dir is not None:
            out["figures"] = {
                split: {
                    kind: path.name
                    for kind, path in sraven_latent_figures(lat[split], figures_dir, f"{prefix}{split}_").items()
                }
                for split in FIGURE_SPLITS
            }
    out["probe"] = run_probe(run_dir, num, lat)
    return out


SPLIT_TITLES = {"test": "training tasks (ID)", "ood": "held-out tasks (OOD)"}


def figure_lines(results: list[dict[str, Any]], names: list[str], link_prefix: str = "") -> list[str]:
    """Markdown of ``latent_section``'s figures ``names``: the SRAVEN code figures of its ``results`` in a
    table, one column per run that drew them (HYLA beside softmax) and one row per split and picture, then
    the other figures; links are ``link_prefix + name``."""
    drawn = [res for res in results if res.get("figures")]
    in_table = {name for res in drawn for by_kind in res["figures"].values() for name in by_kind.values()}
    lines = []
    if drawn:
        lines += ["| | " + " | ".join(f"{res['label']} ({res['name']})" for res in drawn) + " |"]
        lines += ["|---|" + "---|" * len(drawn)]
        for split in FIGURE_SPLITS:
            for kind in drawn[0]["figures"][split]:
                cells = [f"![{name}]({link_prefix}{name})" for name in (res["figures"][split][kind] for res in drawn)]
                lines += [f"| {SPLIT_TITLES[split]}: {kind.replace('_', ' ')} | " + " | ".join(cells) + " |"]
        lines += [""]
    return lines + [f"![{name}]({link_prefix}{name})" for name in names if name not in in_table]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", text).strip("_")


def p_value_text(p_value: float, permutations: int) -> str:
    """A permutation test's p-value; at its floor, ``1 / (permutations + 1)``, as an upper bound."""
    floor = 1 / (permutations + 1)
    return f"<= {floor:.2g}" if p_value <= floor * (1 + 1e-9) else f"{p_value:.3g}"


def _probe_by_layer(
    results: list[dict[str, Any]],
    caption: str,
    metric: tuple[str, float, int],
    baseline: tuple[float, str, str],
    figure: Path,
) -> list[str]:
    """The per-layer table of a probe score (``metric`` = key in each layer's result, scale, decimals) and its
    figure (``probe_by_layer_plot``; ``baseline`` = no-information level, its
    label, the y label); rule probes also list their chance level per run."""
    from hyla.analysis.plots import probe_by_layer_plot

    key, scale, digits = metric
    has_chance = "chance" in results[0]["probe"]
    num_layers = len(results[0]["probe"]["layers"]) - 1
    head = "| configuration | run | " + " | ".join(f"layer {i}" for i in range(num_layers)) + " | all |"
    lines = [
        "",
        caption,
        "",
        head + (" chance |" if has_chance else ""),
        "|---|---|" + "---|" * (num_layers + 1 + has_chance),
    ]
    for res in results:
        cells = " | ".join(f"{scale * v[key]:.{digits}f}" for v in res["probe"]["layers"].values())
        chance = f" {scale * res['probe']['chance']:.{digits}f} |" if has_chance else ""
        lines.append(f"| {res['label']} | {res['name']} | {cells} |{chance}")
    probe_by_layer_plot(
        {f"{r['label']}/{r['name']}": [scale * v[key] for v in r["probe"]["layers"].values()] for r in results},
        baseline[0],
        figure,
        ylabel=baseline[2],
        baseline_label=baseline[1],
    )
    return lines


def latent_section(
    groups: dict[str, list[RunRecord]],
    labels: dict[str, str],
    out: Path,
    num: int,
    permutations: int,
    figure_prefix: str = "",
) -> tuple[list[str], list[str], list[dict[str, Any]]]:
    """Markdown lines, figure names and per-run results of the latent-code analysis of every run with
    trained weights (final, else its latest checkpoint; figures for the first run of each configuration).
    Every figure's file name starts with ``figure_prefix``: sections that share ``out`` stay apart."""
    from hyla.analysis.plots import scatter_plot
    from hyla.train.run.folder import has_trained_weights

    results, figures = [], []
    for key, members in groups.items():
        drawn = False
        for r in members:
            if not has_trained_weights(r.path):
                continue
            prefix = f"{figure_prefix}{_slug(labels[key])}_{_slug(r.name)}_"
            res = analyze_run(r.path, num, permutations, None if drawn else out, prefix)
            res["label"], res["name"] = labels[key], r.name
            figures += [name for by_kind in res.get("figures", {}).values() for name in by_kind.values()]
            drawn = True
            results.append(res)
    if not results:
        return ["No run has trained weights or a checkpoint: no latent-code analysis."], [], []
    if task_entry(str(results[0]["task"])).latent_probe == "rule":
        lines = [
            "Final weights (else the latest checkpoint: column `weights`) of each run; codes of "
            f"{num} problems of training tasks (`test`) and {num} of held-out tasks (`ood`). Rule probe "
            "(all layers): logistic regression fit on the first, scored on the second; chance = most frequent "
            "OOD rule; "
            "control = fit on shuffled labels. Topographic similarity on the `ood` task codes: Spearman "
            "rho with the `slots` / `semantic` task distance, permutation p-value (`latents.json` has every "
            "layer).",
            "",
            "| configuration | run | weights | OOD acc (%) | rule probe OOD acc (%) | chance (%) "
            "| shuffled control (%) | topsim rho slots (p) | topsim rho semantic (p) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for res in results:
            pr, ts, every = res["probe"], res["topsim"], res["probe"]["layers"]["all"]
            lines.append(
                f"| {res['label']} | {res['name']} | {res['weights']} | {100 * ts['ood_acc']:.2f} "
                f"| {100 * every['ood_acc']:.1f} "
                f"| {100 * pr['chance']:.1f} | {100 * every['shuffled_label_ood_acc']:.1f} "
                f"| {ts['slots']['rho']:.3f} ({p_value_text(ts['slots']['p_value'], permutations)}) "
                f"| {ts['semantic']['rho']:.3f} ({p_value_text(ts['semantic']['p_value'], permutations)}) |"
            )
        chance = 100 * sum(res["probe"]["chance"] for res in results) / len(results)  # same OOD tasks: ~equal
        lines += _probe_by_layer(
            results,
            "Rule probe per layer (Fig. 5F): OOD accuracy (%) of decoding each query feature's rule from that "
            "layer's code, fit on training tasks.",
            ("ood_acc", 100, 1),
            (chance, "chance", "OOD rule accuracy (%)"),
            out / f"{figure_prefix}probe_by_layer.png",
        )
        figures.append(f"{figure_prefix}probe_by_layer.png")
        across = topsim_across_runs([res["topsim"] for res in results])
        too_few = min(c["num_runs"] for c in across.values()) < comp.MIN_RUNS_TO_CORRELATE
        if too_few:
            lines += [
                "",
                "Topographic similarity against OOD accuracy across runs: not computed (needs >= "
                f"{comp.MIN_RUNS_TO_CORRELATE} runs; {len(results)} here).",
            ]
        else:
            lines += ["", "Across runs, Spearman correlation of topographic similarity with OOD accuracy:", ""]
            for kind, c in across.items():
                extra = f", p = {c['p_value']:.3g}" if "p_value" in c else f" ({c.get('note', '')})"
                lines.append(f"- {kind}: {c['spearman']:.3f} over {c['num_runs']} runs{extra}")
        if len(results) >= 2:
            name = f"{figure_prefix}topsim_vs_ood.png"
            scatter_plot(
                [res["topsim"]["slots"]["rho"] for res in results],
                [100 * res["topsim"]["ood_acc"] for res in results],
                [f"{res['label']}/{res['name']}" for res in results],
                "topographic similarity (rho, slots distance)",
                "OOD accuracy (%)",
                out / name,
            )
            figures.append(name)
    else:
        lines = [
            "Final weights (else the latest checkpoint: column `weights`) of each run; codes at the last query "
            f"of {num} sequences of training combinations (`test`) and {num} of held-out combinations (`ood`). "
            "Term probe: ridge R^2 of the +-1 term literals from the code pooled over the context keys, fit "
            "on half of the `test` sequences, scored on the other half (ID) and on the `ood` ones; control = "
            "fit on shuffled labels.",
            "",
            "| configuration | run | weights | term probe R^2 (ID) | term probe R^2 (OOD) | shuffled control "
            "(ID / OOD) |",
            "|---|---|---|---|---|---|",
        ]
        for res in results:
            pr = res["probe"]
            lines.append(
                f"| {res['label']} | {res['name']} | {res['weights']} | {pr['r2']:.3f} | {pr['ood_r2']:.3f} "
                f"| {pr['shuffled_label_r2']:.3f} / {pr['shuffled_label_ood_r2']:.3f} |"
            )
        lines += _probe_by_layer(
            results,
            "Term probe per layer: R^2 on held-out combinations (OOD) of decoding the terms from that layer's "
            "code, fit on training combinations.",
            ("ood_r2", 1, 3),
            (0.0, "no information (R^2 = 0)", "OOD term-probe R^2"),
            out / f"{figure_prefix}term_probe_by_layer.png",
        )
        figures.append(f"{figure_prefix}term_probe_by_layer.png")
    return lines, figures, results
