"""Latent-code analysis of one run, as the CLI and ``hyla report`` use it: probe, topographic similarity.

SRAVEN: codes of ``num`` problems of the ``test`` split (training tasks) and of the ``ood`` split
(held-out tasks) are extracted once; the rule probe is fit on the first and scored on the second; the
topographic similarity is measured on the ``ood`` task codes. Fuzzy logic: the term probe on ``num``
sequences of the ``test`` split (training combinations).
"""

from __future__ import annotations

from pathlib import Path

from hyla.analysis import compositionality as comp
from hyla.analysis.latents import collect_latents
from hyla.analysis.probes import rule_probe, term_probe
from hyla.analysis.runs import load_run


def probe_markdown(result: dict) -> list[str]:
    """Markdown lines for a :func:`~hyla.analysis.probes.rule_probe` or ``term_probe`` result."""
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
    lines = [
        f"Term probe: ridge R^2 of the term literals from the code, fit on {result['num_fit']} sequences, "
        f"scored on {result['num'] - result['num_fit']}.",
        "",
        "| layer | R^2 | shuffled-label control |",
        "|---|---|---|",
    ]
    lines += [f"| {k} | {v['r2']:.3f} | {v['shuffled_label_r2']:.3f} |" for k, v in result["layers"].items()]
    return lines


def run_probe(run_dir: str | Path, num: int, latents: dict | None = None) -> dict:
    """Probe result of a run (``latents``: already extracted ``{"test": ..., "ood": ...}`` to reuse)."""
    latents = latents if latents is not None else {}
    task = load_run(run_dir).config["data"]["task"]
    test = latents.get("test") or collect_latents(run_dir, "test", num)
    if task == "sraven":
        ood = latents.get("ood") or collect_latents(run_dir, "ood", num)
        return rule_probe(test, ood)
    return term_probe(test["codes"], test["terms"])


def run_topsim(
    run_dir: str | Path, split: str, num: int, permutations: int, latents: dict | None = None
) -> dict[str, object]:
    """Topographic similarity (both task distances) of a SRAVEN run's task codes, and its final OOD acc."""
    run = load_run(run_dir)
    if run.config["data"]["task"] != "sraven":
        task = run.config["data"]["task"]
        raise ValueError(f"{run_dir} is a {task} run; topographic similarity needs sraven")
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
    """Probe (+ topographic similarity and figures for SRAVEN) of one run, extracting codes once."""
    from hyla.analysis.plots import sraven_latent_figures

    task = load_run(run_dir).config["data"]["task"]
    lat = {"test": collect_latents(run_dir, "test", num)}
    out: dict[str, object] = {"run": str(run_dir), "task": task}
    if task == "sraven":
        lat["ood"] = collect_latents(run_dir, "ood", num)
        out["topsim"] = run_topsim(run_dir, "ood", num, permutations, lat["ood"])
        if figures_dir is not None:
            out["figures"] = [p.name for p in sraven_latent_figures(lat["ood"], figures_dir, prefix)]
    out["probe"] = run_probe(run_dir, num, lat)
    return out
