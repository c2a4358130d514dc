"""The tanh GELU alone on CPU: torch's (``F.gelu(approximate="tanh")`` and its backward) against the C kernel's
(``hyla.ops.gelu``), with torch's erf GELU and ``exp`` of the same size beside them as the
yardstick of what an elementwise pass with one exponential costs here. ms a call, median over ``--calls``, sides
alternating over ``--rounds``; the shape is a paper model's MLP hidden activation (default SRAVEN's, batch 128 x
36 tokens x 256).

Usage: python benchmarks/speed/gelu_cpu.py [--shape 128,36,256] [--calls 40] [--rounds 3] [--json FILE]
       (set OMP_NUM_THREADS for the thread count)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from hyla.ops import gelu as kernel
from hyla.runtime import tune_cpu_allocator


def _median_ms(fn: Callable[[], object], calls: int) -> float:
    fn()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="128,36,256")
    p.add_argument("--calls", type=int, default=40)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", help="write {case: [ms per round]} here")
    args = p.parse_args()
    if args.calls < 1 or args.rounds < 1:
        raise SystemExit(f"--calls and --rounds must be >= 1; got {args.calls}, {args.rounds}")
    tune_cpu_allocator()  # as the hyla command does
    shape = tuple(int(n) for n in args.shape.split(","))
    gen = torch.Generator().manual_seed(0)
    x, dy = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    cases: dict[str, Callable[[], object]] = {
        "torch tanh GELU forward": lambda: F.gelu(x, approximate="tanh"),
        "torch tanh GELU backward": lambda: torch.ops.aten.gelu_backward(dy, x, approximate="tanh"),
        "kernel tanh GELU forward": lambda: kernel.gelu_tanh_cpu_op(x),
        "kernel tanh GELU backward": lambda: kernel.gelu_tanh_cpu_backward_op(x, dy),
        "torch erf GELU forward": lambda: F.gelu(x),
        "torch erf GELU backward": lambda: torch.ops.aten.gelu_backward(dy, x),
        "torch exp": lambda: torch.exp(x),
    }
    results: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, fn in cases.items():
            results[name].append(_median_ms(fn, args.calls))
    print(f"{x.numel():,} float32 values {shape}, {torch.get_num_threads()} threads, median of {args.calls} calls")
    for name, per_round in results.items():
        rounds = " / ".join(f"{ms:.2f}" for ms in per_round)
        print(f"  {name:28s} {statistics.median(per_round):7.2f} ms  ({rounds})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"shape": shape, "threads": torch.get_num_threads(), "ms": results}, f, indent=1)


if __name__ == "__main__":
    main()
