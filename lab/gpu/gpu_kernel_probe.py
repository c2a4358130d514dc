"""Check and time the fused HYLA Triton kernel on a CUDA GPU, one launch configuration at a time.

    PYTHONPATH=src python lab/gpu/gpu_kernel_probe.py [--seq-len 2048] [--batch-tokens 16384] \
        [--budget-s 240] [--json FILE]

1. Correctness at the benchmark's head shape (H=16, E=D=64) on T=300 with a causal mask and a bias, fp32
   and bf16: forward and every gradient against the direct form in float64 (``||out-ref|| / ||ref||``).
2. Forward and backward time (``triton.testing.do_bench`` medians, ms) of each tile configuration below
   at T=``--seq-len``, B=batch_tokens/T, bf16, beside SDPA (FlashAttention) and the direct form.
   Configurations that fail to compile or run out of resources are reported, not fatal; the sweep stops
   when ``--budget-s`` is spent.
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from hyla.attention import attention_preset
from hyla.attention.functional import hypernetwork_attention
from hyla.attention.kernels.triton import kernel as triton_kernel

FWD_CONFIGS = [  # (block_q, block_k, block_d, num_warps, num_stages); None: Triton's default stages
    (16, 16, 64, 4, None),
    (16, 16, 64, 4, 1),
    (16, 16, 64, 4, 2),
    (16, 16, 64, 8, 1),
    (16, 32, 64, 4, 1),
    (16, 32, 64, 4, None),
    (32, 16, 64, 4, 1),
    (16, 16, 64, 2, None),
]
BWD_CONFIGS = [  # (block_q, block_k, num_warps, num_stages, stagger)
    (16, 16, 8, None, False),
    (16, 16, 8, None, True),
    (16, 16, 8, 1, True),
    (16, 16, 8, 2, True),
    (16, 16, 16, None, True),
    (32, 16, 8, 1, True),
    (16, 32, 8, 1, True),
]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def correctness(dtype: torch.dtype, device: str = "cuda", t: int = 300, h: int = 16, e: int = 64) -> dict[str, float]:
    gen = torch.Generator(device=device).manual_seed(0)
    b = 2
    q, k, v = (torch.randn(b, h, t, e, device=device, dtype=dtype, generator=gen).requires_grad_() for _ in range(3))
    bias = torch.randn(1, h, t, t, device=device, generator=gen).requires_grad_()
    mask = torch.ones(t, t, device=device, dtype=torch.bool).tril()[None, None]
    cfg = attention_preset("hyla")
    y = triton_kernel.forward(q, k, v, bias, mask, cfg.normalization, cfg.nonlinearity, cfg.rms_eps)
    dy = torch.randn_like(y)
    dq, dk, dv, db = triton_kernel.backward(
        dy, q, k, v, bias, mask, cfg.normalization, cfg.nonlinearity, cfg.rms_eps, True
    )
    ins = [x.detach().double().requires_grad_() for x in (q, k, v, bias)]
    ref, _ = hypernetwork_attention(*ins[:3], cfg, mask_Bx1xQxK=mask, bias=ins[3])
    grads = torch.autograd.grad(ref, ins, dy.double())
    out = {"y": rel(y, ref)}
    for name, got, want in zip(("dq", "dk", "dv", "dbias"), (dq, dk, dv, db), grads):
        out[name] = rel(got, want)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch-tokens", type=int, default=16384)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--budget-s", type=float, default=240.0)
    p.add_argument("--json")
    args = p.parse_args()
    t_start = time.perf_counter()
    report: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    import triton

    report["triton"] = triton.__version__
    print(report, flush=True)
    for dt, t, h, e in ((torch.float32, 300, 16, 64), (torch.bfloat16, 300, 16, 64), (torch.bfloat16, 100, 32, 128)):
        try:
            errs = correctness(dt, t=t, h=h, e=e)
        except Exception as err:
            errs = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
        report[f"correctness_{dt}_H{h}_E{e}"] = errs
        print(f"correctness {dt} H={h} E=D={e}: {errs}", flush=True)

    t, hd = args.seq_len, args.head_dim
    b = max(1, args.batch_tokens // t)
    gen = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (
        torch.randn(b, args.heads, t, hd, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
        for _ in range(3)
    )
    dy = torch.randn_like(q)
    cfg = attention_preset("hyla")
    norm, phi, eps = cfg.normalization, cfg.nonlinearity, cfg.rms_eps
    rows = []

    def bench(name: str, fwd, bwd=None) -> None:
        row: dict = {"name": name}
        try:
            row["fwd_ms"] = do_bench(fwd, warmup=10, rep=60, return_mode="median")
            if bwd is not None:
                row["bwd_ms"] = do_bench(bwd, warmup=10, rep=60, return_mode="median")
        except Exception as err:
            row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
        rows.append(row)
        print(row, flush=True)

    def sdpa_fb() -> None:
        F.scaled_dot_product_attention(q, k, v).backward(dy)

    bench("sdpa fwd | fwd+bwd", lambda: F.scaled_dot_product_attention(q, k, v), sdpa_fb)

    def direct_fb() -> None:
        hypernetwork_attention(q, k, v, cfg)[0].backward(dy)

    bench("direct fwd | fwd+bwd", lambda: hypernetwork_attention(q, k, v, cfg)[0], direct_fb)
    fwd_kernel = partial(triton_kernel.forward, q, k, v, None, None, norm, phi, eps)
    bwd_kernel = partial(triton_kernel.backward, dy, q, k, v, None, None, norm, phi, eps, False)
    for bq, bk, bd, w, st in FWD_CONFIGS:
        if time.perf_counter() - t_start > args.budget_s:
            print("budget spent; stopping the forward sweep", flush=True)
            break
        tiles = {"block_q": bq, "block_k": bk, "block_d": bd, "num_warps": w, "num_stages": st}
        bench(f"fused fwd {tiles}", partial(fwd_kernel, **tiles))
    for bq, bk, w, st, stagger in BWD_CONFIGS:
        if time.perf_counter() - t_start > args.budget_s:
            print("budget spent; stopping the backward sweep", flush=True)
            break
        tiles = {"block_q": bq, "block_k": bk, "num_warps": w, "num_stages": st, "stagger": stagger}
        bench(f"fused bwd {tiles}", partial(bwd_kernel, **tiles))
    report["timings"] = {"seq_len": t, "batch": b, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    print(f"probe done in {time.perf_counter() - t_start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
