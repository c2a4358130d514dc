"""``hyla analyze {latents,probe,plots,topsim,rules}``: look inside the latent code of trained runs, and
which rules a trained SRAVEN model gets right."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from hyla.analysis.latent_summary import probe_markdown, require_rule_codes, run_probe, run_topsim, topsim_across_runs
from hyla.analysis.latents import collect_latents, save_latents
from hyla.analysis.plots import sraven_latent_figures
from hyla.analysis.rule_accuracy import rule_accuracy, rule_accuracy_markdown
from hyla.textio import error_line
from hyla.train.run.folder import load_trained


def cmd_latents(args: argparse.Namespace) -> int:
    arrays = collect_latents(args.run, args.split, args.num)
    path = save_latents(arrays, args.out or Path(args.run) / f"latents_{args.split}.npz")
    print(f"wrote {path}: " + ", ".join(f"{k} {v.shape}" for k, v in arrays.items() if v.ndim))
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    out = Path(args.out or Path(args.run) / "analysis")
    result = run_probe(args.run, args.num)
    lines = probe_markdown(result)
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe.json").write_text(json.dumps(result, indent=2))
    (out / "probe.md").write_text(f"# Probe of `{args.run}`\n\n" + "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def cmd_plots(args: argparse.Namespace) -> int:
    require_rule_codes(args.run, "latent-code pictures are drawn for")
    out = Path(args.out or Path(args.run) / "analysis")
    latents = collect_latents(args.run, args.split, args.num)
    paths = sraven_latent_figures(latents, out, max_points=args.max_points)
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def cmd_topsim(args: argparse.Namespace) -> int:
    results = []
    for run_dir in args.runs:
        entry = run_topsim(run_dir, args.split, args.num, args.permutations)
        results.append(entry)
        print(
            f"{run_dir}: rho(slots)={entry['slots']['rho']:.3f} (p={entry['slots']['p_value']:.3g}), "
            f"rho(semantic)={entry['semantic']['rho']:.3f} (p={entry['semantic']['p_value']:.3g}), "
            f"OOD acc={100 * entry['ood_acc']:.2f}%"
        )
    across = topsim_across_runs(results)
    print("across runs (Spearman with OOD acc): " + json.dumps(across))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"runs": results, "across_runs": across}, indent=2))
    return 0


def cmd_rules(args: argparse.Namespace) -> int:
    if args.names is not None and len(args.names) != len(args.runs):
        raise ValueError(f"--names gives {len(args.names)} names for {len(args.runs)} runs; give one per run")
    trained = [load_trained(run) for run in args.runs]  # each model read once, for every split
    results = [rule_accuracy(run, split, args.num, seed=args.seed) for split in args.splits for run in trained]
    lines = rule_accuracy_markdown(results, None if args.names is None else args.names * len(args.splits))
    print("\n".join(lines))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(results, indent=2))
        out.with_suffix(".md").write_text("\n".join(lines))
    return 0


def _guarded(func: Callable[[argparse.Namespace], int], name: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except (ValueError, OSError) as err:  # OSError: an --out that cannot be written
            print(f"hyla analyze {name}: error: {error_line(err)}", file=sys.stderr)
            return 2

    return run


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def _nonnegative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be >= 0")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("analyze", help="latent-code analysis of trained runs")
    s = p.add_subparsers(dest="analysis", metavar="ANALYSIS", required=True)
    q = s.add_parser("latents", help="save the latent codes at the relevant (query, key) pairs as .npz")
    q.add_argument("run", metavar="RUN_DIR")
    q.add_argument("--split", default="ood", help="test | ood (fuzzy logic also: unseen_terms)")
    q.add_argument("--num", type=_positive, default=2048, help="problems (sequences) to extract")
    q.add_argument("--out", help="FILE.npz (default RUN_DIR/latents_SPLIT.npz)")
    q.set_defaults(func=_guarded(cmd_latents, "latents"))
    q = s.add_parser("probe", help="decode held-out tasks' rules (SRAVEN) or the terms (fuzzy logic)")
    q.add_argument("run", metavar="RUN_DIR")
    q.add_argument("--num", type=_positive, default=2048, help="problems per split")
    q.add_argument("--out", help="DIR for probe.json and probe.md (default RUN_DIR/analysis)")
    q.set_defaults(func=_guarded(cmd_probe, "probe"))
    q = s.add_parser("plots", help="PCA / t-SNE of the codes by rule per layer, mean code per rule and head")
    q.add_argument("run", metavar="RUN_DIR")
    q.add_argument("--split", default="ood", help="test | ood")
    q.add_argument("--num", type=_positive, default=1024)
    q.add_argument("--max-points", type=_positive, default=4000, help="answer slots drawn per panel")
    q.add_argument("--out", help="DIR (default RUN_DIR/analysis)")
    q.set_defaults(func=_guarded(cmd_plots, "plots"))
    q = s.add_parser("topsim", help="topographic similarity of the code, its correlation with OOD accuracy")
    q.add_argument("runs", nargs="+", metavar="RUN_DIR")
    q.add_argument("--split", default="ood", help="test | ood")
    q.add_argument("--num", type=_positive, default=2048)
    q.add_argument("--permutations", type=_nonnegative, default=1000, help="permutation-test shuffles")
    q.add_argument("--out", help="FILE.json")
    q.set_defaults(func=_guarded(cmd_topsim, "topsim"))
    q = s.add_parser("rules", help="SRAVEN: accuracy of the answer slots by their feature's rule, run beside run")
    q.add_argument("runs", nargs="+", metavar="RUN_DIR")
    q.add_argument("--splits", nargs="+", default=["test", "ood"], help="test | ood (default: both)")
    q.add_argument("--num", type=_positive, default=4096, help="problems per split")
    q.add_argument("--seed", type=_nonnegative, default=0, help="the problems' generator seed")
    q.add_argument("--names", nargs="+", help="column names, one per RUN_DIR (default: the directories' names)")
    q.add_argument("--out", help="FILE: FILE.md (the tables) and FILE.json")
    q.set_defaults(func=_guarded(cmd_rules, "rules"))
