"""The C kernel alone, forward and backward, at the SRAVEN paper model's sizes, one thread: ms a call (median of
``--calls``), for the presets named. Run it from two checkouts (``PYTHONPATH=<checkout>/src``), alternating, to
compare two versions of the kernel; the training step's A/B is ``ab_speed.sh``.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/speed/kernel_ab.py softmax hyla --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from hyla.attention import attention_preset
from hyla.attention.kernels.c.wrapper import fused_cpu_hypernetwork_attention
from hyla.runtime import tune_cpu_allocator


def time_preset(preset: str, batch: int, calls: int) -> dict[str, float]:
    """Median CPU ms of the forward and of the backward of one attention layer (SRAVEN's 16 heads, 36 keys and
    queries, head dim 4), with a bias and attention dropout 0.1, as the paper model trains."""
    heads, tokens, head_dim = 16, 36, 4
    gen = torch.Generator().manual_seed(0)
    q_BxHxTxE, k_BxHxTxE, v_BxHxTxE = (
        torch.randn(batch, tokens, heads, head_dim, generator=gen).transpose(1, 2).requires_grad_() for _ in range(3)
    )
    bias_HxTxT = torch.randn(heads, tokens, tokens, generator=gen, requires_grad=True)
    keep_11xTxT = torch.rand(1, 1, tokens, tokens, generator=gen) > 0.1
    dy_BxHxTxE = torch.randn(batch, heads, tokens, head_dim, generator=gen)
    config = attention_preset(preset)
    forward_ms, backward_ms = [], []
    for _ in range(calls):
        start = time.process_time()
        y = fused_cpu_hypernetwork_attention(
            q_BxHxTxE, k_BxHxTxE, v_BxHxTxE, config, bias=bias_HxTxT, dropout_keep_11xQxK=keep_11xTxT, dropout=0.1
        )
        middle = time.process_time()
        torch.autograd.grad(y, (q_BxHxTxE, k_BxHxTxE, v_BxHxTxE, bias_HxTxT), dy_BxHxTxE)
        forward_ms.append((middle - start) * 1e3)
        backward_ms.append((time.process_time() - middle) * 1e3)
    return {"forward_ms": statistics.median(forward_ms), "backward_ms": statistics.median(backward_ms)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("presets", nargs="+", help="attention presets, e.g. softmax hyla")
    parser.add_argument("--batch", type=int, default=128, help="batch size (the paper's SRAVEN batch: 128)")
    parser.add_argument("--calls", type=int, default=15, help="calls timed per preset")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tune_cpu_allocator()  # as every hyla command does: freed buffers are reused, not page-faulted in again
    results = {preset: time_preset(preset, args.batch, args.calls) for preset in args.presets}
    for preset, ms in results.items():
        print(f"{preset}: forward {ms['forward_ms']:.2f} ms, backward {ms['backward_ms']:.2f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"batch": args.batch, "calls": args.calls, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
