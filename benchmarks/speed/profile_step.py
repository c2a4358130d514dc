"""Where a training step's time goes: ``torch.profiler`` around the step that ``hyla bench step`` times
(``hyla.bench.step.time_variant``: the paper model of a task, forward, backward and AdamW on random inputs), the
ops with the most self CPU time, per step.

It calls only what checkouts since the C kernel became a custom op have, so an A/B profiles another commit with
that commit's code: ``PYTHONPATH=OTHER/src python benchmarks/speed/profile_step.py ...``
(``benchmarks/speed/ab_speed.sh`` with ``SUITE=one-thread-step`` does, for both sides). The profile covers the
warm-up and timed steps and the model's construction (a few ms of the seconds profiled).

How to read it: ``torch.library`` custom ops run their forward inside an autograd node, so with gradients on,
the C kernel's forward shows as the self time of ``GeneratedBackwardFor_hyla_fused_cpu_attention_default``, not
of ``hyla::fused_cpu_attention`` (under ``torch.no_grad`` it is the op's own); ``aten::copy_`` with
``aten::addmm`` above it is ``nn.Linear`` writing its bias into the output before the matrix product.

Usage: python benchmarks/speed/profile_step.py [--task sraven] [--variant hyla] [--dropout 0.1] [--steps 20]
       [--top 10] [--gelu tanh] [--json FILE]    (set OMP_NUM_THREADS for the thread count)
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from hyla.bench.step import time_variant
from hyla.runtime import tune_cpu_allocator


def top_ops(
    task: str, variant: str, dropout: float, steps: int, warmup: int, top: int, gelu: str = "none"
) -> list[dict[str, Any]]:
    """The ``top`` ops by self CPU time: name, share of all self time, ms and calls per training step."""
    extra = {"gelu_approximate": gelu} if gelu != "none" else {}  # checkouts before it took no such argument
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        time_variant(task, variant, 128, steps, warmup, "cpu", dropout=dropout, **extra)
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    per_step = 1000.0 * (steps + warmup)  # profiler times are in microseconds
    return [
        {
            "op": e.key,
            "share": e.self_cpu_time_total / total,
            "ms_per_step": e.self_cpu_time_total / per_step,
            "calls_per_step": e.count / (steps + warmup),
        }
        for e in events[:top]
    ]


def blas_path() -> str:
    """What summed this process's matrix products (``hyla.cpu.blas_path``; checkouts before #47 lack it)."""
    try:
        from hyla.cpu import blas_path as path
    except ImportError:
        return "as installed"
    return path()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="sraven")
    p.add_argument("--variant", default="hyla")
    p.add_argument("--dropout", type=float, default=0.1, help="attention dropout (the paper configs: 0.1)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--top", type=int, default=10)
    p.add_argument("--gelu", default="none", help="the MLP's GELU: none (erf) | tanh (the paper configs')")
    p.add_argument("--json", help="write {'task', 'variant', 'threads', 'ops': [...]} here")
    args = p.parse_args()
    if args.steps < 1 or args.warmup < 0 or args.top < 1:
        raise SystemExit(f"--steps and --top must be >= 1, --warmup >= 0; got {args.steps}, {args.top}, {args.warmup}")
    tune_cpu_allocator()  # as the hyla command does
    ops = top_ops(args.task, args.variant, args.dropout, args.steps, args.warmup, args.top, args.gelu)
    threads = torch.get_num_threads()
    print(f"{args.task} {args.variant}, {threads} threads, dropout {args.dropout}, gelu {args.gelu}: self CPU time")
    for op in ops:
        calls = f"{op['calls_per_step']:7.1f} calls/step"
        print(f"  {op['share']:6.1%} {op['ms_per_step']:8.2f} ms/step {calls}  {op['op']}")
    if args.json:
        threads = torch.get_num_threads()
        out = {"task": args.task, "variant": args.variant, "threads": threads, "blas": blas_path(), "ops": ops}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
