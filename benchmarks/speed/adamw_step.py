"""AdamW's update alone on the paper models' parameters: torch's single-tensor loop (the CPU default before
#47's fused AdamW), ``foreach`` and ``fused``, ms per update, and how far each ends from the loop.

The parameters are the SRAVEN and fuzzy-logic paper models' (HYLA, ``hyla.bench.step.time_variant``'s model),
in the two groups training builds (matrices decayed); the gradients are five fixed random draws, reused in
turn, so every kind updates the same numbers. Timings are medians over ``--updates`` after 10 warm-up updates.

Usage: python benchmarks/speed/adamw_step.py [--tasks sraven,fuzzy_logic] [--updates 60] [--json FILE]
       (set OMP_NUM_THREADS for the thread count)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from hyla.bench.step import _task_shapes, paper_model
from hyla.models import Transformer, TransformerConfig

KINDS = {"single-tensor": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}
WARMUP = 10


def time_kinds(task: str, updates: int) -> dict[str, dict[str, float]]:
    """Per kind: ms per update (median) and the largest |difference| from the single-tensor loop's parameters."""
    seq_len, input_dim, output_dim, _ = _task_shapes(task)
    cfg = TransformerConfig(
        input_dim=input_dim,
        output_dim=output_dim,
        attention="hyla",
        relative_position_buckets=seq_len,
        relative_position_max_distance=seq_len,
        **paper_model(task),
    )
    ends: dict[str, list[torch.Tensor]] = {}
    out: dict[str, dict[str, float]] = {}
    for kind, options in KINDS.items():
        torch.manual_seed(0)
        params = list(Transformer(cfg).parameters())
        groups = [
            {"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.1},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
        ]
        opt = torch.optim.AdamW(groups, lr=1e-3, **options)
        gen = torch.Generator().manual_seed(1)
        grads = [[1e-2 * torch.randn(p.shape, generator=gen) for p in params] for _ in range(5)]
        times = []
        for i in range(WARMUP + updates):
            for p, g in zip(params, grads[i % 5]):
                p.grad = g.clone()
            t0 = time.perf_counter()
            opt.step()
            times.append(time.perf_counter() - t0)
        ends[kind] = [p.detach().clone() for p in params]
        first = ends[next(iter(KINDS))]
        out[kind] = {
            "ms_per_update": 1000 * statistics.median(times[WARMUP:]),
            "tensors": float(len(params)),
            "max_abs_diff_from_single_tensor": max((a - b).abs().max().item() for a, b in zip(ends[kind], first)),
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", default="sraven,fuzzy_logic")
    p.add_argument("--updates", type=int, default=60)
    p.add_argument("--json", help="write {task: {kind: {...}}} here")
    args = p.parse_args()
    if args.updates < 1:
        raise SystemExit(f"--updates must be >= 1; got {args.updates}")
    results = {}
    print(f"AdamW update, {torch.get_num_threads()} threads, {args.updates} updates after {WARMUP}")
    for task in args.tasks.split(","):
        results[task] = time_kinds(task, args.updates)
        for kind, r in results[task].items():
            diff = r["max_abs_diff_from_single_tensor"]
            print(f"  {task:12s} {kind:14s} {r['ms_per_update']:7.3f} ms  (max |diff| from single-tensor {diff:.1e})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
