"""Where the MoE rows' routers send tokens: per finished run and layer, the share of routed (token, choice) pairs
each expert gets (largest first), the router's mean top-1 probability, and how far the OOD split's shares sit from
the in-distribution ones (total variation). Read off the runs' final weights through ``hyla.load`` and the
``hook_router`` hook point, on fresh problems of each split (a fixed generator, so reruns give the same table).

    python lab/moe_routing.py                       # Table A1 fuzzy's MoE rows in lab/runs -> lab/tables/moe_routing/
    python lab/moe_routing.py --problems 256 --out /tmp/routing
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch import Tensor

import hyla
from hyla.analysis.selection import final_value
from hyla.models.transformer import MoE
from hyla.sweep.groups import provenance
from hyla.textio import write_text_atomic
from hyla.train.run.folder import FINAL_WEIGHTS, read_run
from hyla.train.sweeps import load_sweep

LAB = Path(__file__).resolve().parent
ROWS = ("softmax_moe", "linear_moe", "hyla_moe")
SPLITS = ("test", "ood")
#: a layer "concentrates" where one expert takes at least this share of the pairs (0.50: every token's top-2)
CONCENTRATED = 0.45
#: an expert "idles" at or below this share
IDLE = 0.01


def routed_shares(run_dir: Path, problems: int, seed: int) -> dict[str, list[dict[str, object]]]:
    """Per split, per MoE layer: ``share_by_expert`` (each expert's share of the routed pairs),
    ``mean_prob_by_expert`` (the router's mean probability per expert) and ``top1`` (its mean largest probability),
    over all positions of ``problems`` fresh problems."""
    trained = hyla.load(run_dir)
    layers = [m for m in trained.model.modules() if isinstance(m, MoE)]
    seen: list[Tensor] = []
    handles = [m.hook_router.register_forward_hook(lambda _m, _i, out: seen.append(out.detach())) for m in layers]
    result: dict[str, list[dict[str, object]]] = {}
    try:
        for split in SPLITS:
            seen.clear()
            batch = trained.task.sample(problems, split, torch.Generator().manual_seed(seed))
            with torch.no_grad():
                trained.model(batch.inputs, last_positions=trained.task.num_output_positions)
            per_layer = []
            for layer, probs_BxTxE in zip(layers, seen, strict=True):
                probs_NxE = probs_BxTxE.reshape(-1, probs_BxTxE.shape[-1])
                top_i_NxK = probs_NxE.topk(layer.top_k, dim=-1).indices
                counts_E = torch.bincount(top_i_NxK.reshape(-1), minlength=probs_NxE.shape[-1]).double()
                share_E = counts_E / counts_E.sum()
                per_layer.append(
                    {
                        "share_by_expert": share_E.tolist(),
                        "mean_prob_by_expert": probs_NxE.mean(0).tolist(),
                        "top1": probs_NxE.max(-1).values.mean().item(),
                    }
                )
            result[split] = per_layer
    finally:
        for h in handles:
            h.remove()
    return result


def total_variation(test: dict, ood: dict) -> float:
    return 0.5 * sum(abs(a - b) for a, b in zip(test["share_by_expert"], ood["share_by_expert"], strict=True))


def summary(found: dict[str, dict]) -> list[str]:
    """Per row, over its runs' layers (test split): how many concentrate, how many experts idle in each, and the
    largest total variation between the test and OOD shares."""
    lines = []
    for row in ROWS:
        entries = [e for e in found.values() if e["row"] == row]
        layers = [layer for e in entries for layer in e["test"]]
        if not layers:
            continue
        concentrated = sum(max(layer["share_by_expert"]) >= CONCENTRATED for layer in layers)
        idle = [sum(share <= IDLE for share in layer["share_by_expert"]) for layer in layers]
        tv = max(total_variation(t, o) for e in entries for t, o in zip(e["test"], e["ood"], strict=True))
        lines.append(
            f"- {row}: {len(entries)} runs, {len(layers)} layers; one expert at >= {CONCENTRATED:.2f} of the pairs in "
            f"{concentrated}; experts at <= {IDLE:.0%} per layer {idle}; largest TV(test, OOD) {tv:.3f}"
        )
    return lines


def table(found: dict[str, dict]) -> list[str]:
    lines = [
        "| run | OOD R^2 | layer | shares, test (largest first) | top-1 p, test | shares, OOD | TV(test, OOD) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, entry in found.items():
        for layer, (test, ood) in enumerate(zip(entry["test"], entry["ood"], strict=True)):
            test_E, ood_E = sorted(test["share_by_expert"], reverse=True), sorted(ood["share_by_expert"], reverse=True)
            score = f"{entry['ood_r2']:.2f}" if entry["ood_r2"] is not None else "-"
            lines.append(
                f"| {name} | {score} | {layer} | {' '.join(f'{s:.2f}' for s in test_E)} | {test['top1']:.2f}"
                f" | {' '.join(f'{s:.2f}' for s in ood_E)} | {total_variation(test, ood):.3f} |"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=LAB / "runs", help="the sweeps' records (default lab/runs)")
    parser.add_argument("--sweep", default="table_a1_fuzzy")
    parser.add_argument("--problems", type=int, default=512, help="fresh problems per split (default 512)")
    parser.add_argument("--seed", type=int, default=0, help="the sampling generator's seed (default 0)")
    parser.add_argument("--out", type=Path, default=LAB / "tables" / "moe_routing")
    args = parser.parse_args(argv)
    if args.problems < 1:
        print(f"--problems must be a positive integer, got {args.problems}", file=sys.stderr)
        return 2
    sweep = load_sweep(args.sweep)
    folder = args.root / sweep.name
    row_of = {folder / spec.name: spec.row for spec in sweep.runs(only=list(ROWS))}
    runs = sorted(d for d in row_of if (d / FINAL_WEIGHTS).is_file())
    if not runs:
        print(f"no finished MoE run ({', '.join(ROWS)}) under {folder}", file=sys.stderr)
        return 1
    torch.set_num_threads(1)
    found = {
        d.name: {
            "row": row_of[d],
            **routed_shares(d, args.problems, args.seed),
            "ood_r2": final_value(read_run(d), "ood", "r2"),
        }
        for d in runs
    }
    command = "python lab/moe_routing.py " + " ".join(argv if argv is not None else sys.argv[1:])
    made = {
        **provenance("cpu", mixture_of_experts=True),
        "command": command.strip(),
        "problems_per_split": args.problems,
        "seed": args.seed,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out / "routing.json", json.dumps({"made": made, "runs": found}, indent=1) + "\n")
    header = [
        "# Where the MoE rows' routers send tokens (fuzzy logic, Table A1)",
        "",
        f"Command `{made['command']}`, commit {made['commit']}, {made['cpu']}, torch {made['versions']['torch']}, "
        f"{made['date'][:10]}; {args.problems} fresh problems per split (generator seed {args.seed}), every position; "
        "JSON beside this file.",
        "",
        "Shares: each expert's fraction of the routed (token, choice) pairs, largest first; with top-2 routing 0.50 "
        "means every token has that expert among its two. Top-1 p: the router's mean largest probability. "
        "TV: total variation between the test and OOD shares. OOD R^2: the run's final evaluation (%).",
        "",
    ]
    lines = [*summary(found), "", *table(found)]
    write_text_atomic(args.out / "README.md", "\n".join(header + lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
