"""``hyla analyze {latents,probe,plots,topsim}``: look inside the latent code of trained runs."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from hyla.analysis import compositionality as comp
from hyla.analysis.latents import collect_latents, save_latents
from hyla.analysis.plots import embedding_panels, rule_heatmaps
from hyla.analysis.probes import rule_probe, slot_features, term_probe
from hyla.analysis.runs import load_run
from hyla.tasks.sraven import RULE_NAMES


def _task(run_dir: str) -> str:
    return load_run(run_dir).config["data"]["task"]


def cmd_latents(args: argparse.Namespace) -> int:
    arrays = collect_latents(args.run, args.split, args.num)
    path = save_latents(arrays, args.out or Path(args.run) / f"latents_{args.split}.npz")
    print(f"wrote {path}: " + ", ".join(f"{k} {v.shape}" for k, v in arrays.items() if v.ndim))
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    out = Path(args.out or Path(args.run) / "analysis")
    out.mkdir(parents=True, exist_ok=True)
    if _task(args.run) == "sraven":
        result = rule_probe(collect_latents(args.run, "test", args.num), collect_latents(args.run, "ood", args.num))
        lines = [
            f"chance (most frequent OOD rule): {100 * result['chance']:.1f}%",
            "| layer | OOD rule acc (%) | train acc (%) | shuffled-label control (%) |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {k} | {100 * v['ood_acc']:.1f} | {100 * v['train_acc']:.1f} | {100 * v['shuffled_label_ood_acc']:.1f} |"
            for k, v in result["layers"].items()
        ]
    else:
        lat = collect_latents(args.run, "test", args.num)
        result = term_probe(lat["codes"], lat["terms"])
        lines = [
            f"ridge R^2 of term literals from the code: {result['r2']:.3f} "
            f"(shuffled-label control {result['shuffled_label_r2']:.3f}, {result['num']} sequences)"
        ]
    (out / "probe.json").write_text(json.dumps(result, indent=2))
    (out / "probe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def cmd_plots(args: argparse.Namespace) -> int:
    if _task(args.run) != "sraven":
        print("hyla analyze plots: latent-code pictures are drawn for SRAVEN runs", file=sys.stderr)
        return 2
    out = Path(args.out or Path(args.run) / "analysis")
    out.mkdir(parents=True, exist_ok=True)
    lat = collect_latents(args.run, args.split, args.num)
    labels = lat["query_rule"].reshape(-1)
    num_layers = lat["codes"].shape[2]
    per_layer = [slot_features(lat["codes"], layer) for layer in range(num_layers)]
    titles = [f"layer {i}" for i in range(num_layers)]
    for method in ("pca", "tsne"):
        embedding_panels(per_layer, labels, list(RULE_NAMES), out / f"latents_{method}.png", method, titles)
    codes = lat["codes"].reshape(-1, *lat["codes"].shape[2:]).mean(axis=2)  # (slots, L, H): mean over keys
    present = np.unique(labels)
    means = np.stack([codes[labels == r].mean(0) for r in present], axis=1)  # (L, R, H)
    # minus the mean over rules: the head profile every rule shares would hide what differs between rules
    rule_heatmaps(
        means - means.mean(axis=1, keepdims=True),
        [RULE_NAMES[r] for r in present],
        out / "mean_code_per_rule.png",
        title="mean latent code per rule, minus the mean over rules",
    )
    print(f"wrote {out}/latents_pca.png, latents_tsne.png, mean_code_per_rule.png")
    return 0


def cmd_topsim(args: argparse.Namespace) -> int:
    results, ood = [], []
    for run_dir in args.runs:
        if _task(run_dir) != "sraven":
            print(f"hyla analyze topsim: {run_dir} is not a SRAVEN run", file=sys.stderr)
            return 2
        lat = collect_latents(run_dir, args.split, args.num)
        codes, rules = comp.task_codes(lat)
        entry = {"run": str(run_dir)}
        for kind in comp.TASK_DISTANCES:
            entry[kind] = comp.topographic_similarity(codes, rules, kind, args.permutations)
        final = load_run(run_dir).final("ood")
        entry["ood_acc"] = final["acc"] if final else float("nan")
        results.append(entry)
        ood.append(entry["ood_acc"])
        print(
            f"{run_dir}: rho(slots)={entry['slots']['rho']:.3f} (p={entry['slots']['p_value']:.3g}), "
            f"rho(semantic)={entry['semantic']['rho']:.3f} (p={entry['semantic']['p_value']:.3g}), "
            f"OOD acc={entry['ood_acc']:.3f}"
        )
    across = {
        kind: comp.correlation_across_runs([r[kind]["rho"] for r in results], ood) for kind in comp.TASK_DISTANCES
    }
    print("across runs: " + json.dumps(across))
    if args.out:
        Path(args.out).write_text(json.dumps({"runs": results, "across_runs": across}, indent=2))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("analyze", help="latent-code analysis of trained runs")
    s = p.add_subparsers(dest="analysis", metavar="ANALYSIS", required=True)
    q = s.add_parser("latents", help="save the latent codes at the relevant (query, key) pairs as .npz")
    q.add_argument("run")
    q.add_argument("--split", default="ood", help="test | ood")
    q.add_argument("--num", type=int, default=2048)
    q.add_argument("--out")
    q.set_defaults(func=cmd_latents)
    q = s.add_parser("probe", help="decode held-out tasks' rules (SRAVEN) or the terms (fuzzy logic) from the code")
    q.add_argument("run")
    q.add_argument("--num", type=int, default=2048)
    q.add_argument("--out")
    q.set_defaults(func=cmd_probe)
    q = s.add_parser("plots", help="PCA / t-SNE of the codes by rule, mean code per rule and head")
    q.add_argument("run")
    q.add_argument("--split", default="ood")
    q.add_argument("--num", type=int, default=1024)
    q.add_argument("--out")
    q.set_defaults(func=cmd_plots)
    q = s.add_parser("topsim", help="topographic similarity of the code (and its correlation with OOD accuracy)")
    q.add_argument("runs", nargs="+", metavar="RUN_DIR")
    q.add_argument("--split", default="ood")
    q.add_argument("--num", type=int, default=2048)
    q.add_argument("--permutations", type=int, default=1000)
    q.add_argument("--out")
    q.set_defaults(func=cmd_topsim)
