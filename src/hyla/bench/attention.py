"""``hyla bench attention``: time and peak memory of the attention core by sequence length.

For each T (batch B = batch_tokens / T, so B*T is fixed), H heads of d_head: forward and
forward+backward of the core (q, k, v -> heads) for

* ``hyla_direct`` (direct form, B*T*T*d hidden tensor), ``hyla_manual_backward`` (the same with a
  hand-derived backward; the former names ``hyla_reference`` and ``hyla_explicit`` are still accepted),
  ``hyla_fused_cpu`` (the C kernel ``backend="auto"`` runs on CPU; float32
  and float64 only, reported unavailable otherwise), ``hyla_chunked`` (blocks of queries),
  ``hyla_fused`` (the Triton kernel; CUDA, or CPU under ``TRITON_INTERPRET=1``, where it is
  reported as unavailable with the reason otherwise);
* ``sdpa_softmax`` (``F.scaled_dot_product_attention``; FlashAttention on CUDA), ``eager_softmax``,
  ``linear`` (no normalization).

Peak memory is ``torch.cuda.max_memory_allocated`` on CUDA (every (variant, T) in this process, its
allocations only), the growth of the process's peak RSS over its state after setup on CPU (each
(variant, T) in its own subprocess). Out-of-memory is
recorded, not fatal.
"""

from __future__ import annotations

import argparse
import csv
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from hyla.bench import device_label, positive_ints, require_device, require_writable

VARIANTS = (
    "hyla_direct",
    "hyla_manual_backward",
    "hyla_fused_cpu",
    "hyla_chunked",
    "hyla_fused",
    "sdpa_softmax",
    "eager_softmax",
    "linear",
)
#: former variant names, still accepted: old -> new
VARIANT_ALIASES = {"hyla_reference": "hyla_direct", "hyla_explicit": "hyla_manual_backward"}


def _core(variant: str, chunk_size: int):
    from hyla.attention import attention_preset
    from hyla.attention.functional import hypernetwork_attention
    from hyla.attention.kernels.chunked import chunked_hypernetwork_attention

    hyla = attention_preset("hyla")
    if variant == "hyla_direct":
        return lambda q, k, v: hypernetwork_attention(q, k, v, hyla)[0]
    if variant == "hyla_manual_backward":
        from hyla.attention.kernels import manual_backward_hypernetwork_attention

        return lambda q, k, v: manual_backward_hypernetwork_attention(q, k, v, hyla)
    if variant == "hyla_fused_cpu":
        from hyla.attention.kernels import fused_cpu_hypernetwork_attention

        return lambda q, k, v: fused_cpu_hypernetwork_attention(q, k, v, hyla)
    if variant == "hyla_chunked":
        return lambda q, k, v: chunked_hypernetwork_attention(q, k, v, hyla, chunk_size=chunk_size)
    if variant == "hyla_fused":
        from hyla.attention.kernels import fused_hypernetwork_attention

        return lambda q, k, v: fused_hypernetwork_attention(q, k, v, hyla)
    if variant == "sdpa_softmax":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v)
    if variant == "eager_softmax":
        return lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, -1) @ v
    if variant == "linear":
        return lambda q, k, v: hypernetwork_attention(q, k, v, attention_preset("linear"))[0]
    raise NotImplementedError(variant)


def measure(
    variant: str,
    seq_len: int,
    batch_tokens: int,
    heads: int,
    head_dim: int,
    dtype: str,
    device: str,
    repeats: int,
    chunk_size: int,
) -> dict:
    """Run in a fresh process: forward and forward+backward medians (ms) and peak memory (MB)."""
    b = max(1, batch_tokens // seq_len)
    dt = getattr(torch, dtype)
    gen = torch.Generator(device).manual_seed(0)
    q, k, v = (
        torch.randn(b, heads, seq_len, head_dim, generator=gen, device=device, dtype=dt).requires_grad_()
        for _ in range(3)
    )
    if variant == "hyla_fused":
        from hyla.attention import attention_preset
        from hyla.attention.kernels import fused_unsupported_reason

        reason = fused_unsupported_reason(attention_preset("hyla"), q, k, v)
        if reason is not None:
            return {"status": f"unavailable: {reason}"}
    if variant == "hyla_fused_cpu":
        from hyla.attention import attention_preset
        from hyla.attention.kernels import fused_cpu_unsupported_reason

        reason = fused_cpu_unsupported_reason(attention_preset("hyla"), q, k, v)
        if reason is not None:
            return {"status": f"unavailable: {reason}"}
    fn = _core(variant, chunk_size)
    g = torch.randn(b, heads, seq_len, head_dim, generator=gen, device=device, dtype=dt)
    cuda = device.startswith("cuda")

    def timed(backward: bool) -> float:
        times = []
        for _ in range(repeats + 1):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            y = fn(q, k, v)
            if backward:
                y.backward(g)
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return 1000 * statistics.median(times[1:])

    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    try:
        fwd = timed(False)
        fwdbwd = timed(True)
    except torch.OutOfMemoryError:
        return {"status": "out of memory", "batch": b}
    peak = (
        torch.cuda.max_memory_allocated()
        if cuda
        else (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base_rss) * 1024
    ) / 2**20
    return {"status": "ok", "batch": b, "fwd_ms": fwd, "fwd_bwd_ms": fwdbwd, "peak_mb": peak}


def run(args: argparse.Namespace) -> int:
    require_device(args.device)
    seq_lens = positive_ints("--seq-lens", args.seq_lens)
    for option, path in (("--csv", args.csv), ("--json", args.json), ("--plot", args.plot)):
        require_writable(option, path)
    variants = [VARIANT_ALIASES.get(v, v) for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"--variants: unknown {unknown}; allowed values: {', '.join(VARIANTS)}")
    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    if not isinstance(getattr(torch, dtype, None), torch.dtype):
        raise SystemExit(f"--dtype {dtype!r} is not a torch dtype; e.g. float32, bfloat16, float16")
    device_name = device_label(args.device)
    rows = []
    print(
        f"device={device_name} dtype={dtype} heads={args.heads} head_dim={args.head_dim} "
        f"batch_tokens={args.batch_tokens}"
    )
    print(f"{'variant':20s} {'T':>6s} {'B':>4s} {'fwd ms':>9s} {'fwd+bwd ms':>11s} {'peak MB':>9s}")
    for t in seq_lens:
        for v in variants:
            if args.device.startswith("cuda"):  # CUDA peaks are per-allocation counts: one process serves
                try:
                    res = measure(
                        v, t, args.batch_tokens, args.heads, args.head_dim, dtype, args.device, args.repeats,
                        args.chunk_size,
                    )  # fmt: skip
                except Exception as err:
                    res = {"status": f"failed: {type(err).__name__}: {str(err).splitlines()[0][:120]}"}
                torch.cuda.empty_cache()
            else:
                call = (
                    "import json; from hyla.runtime import tune_cpu_allocator; tune_cpu_allocator(); "
                    f"from hyla.bench.attention import measure; print(json.dumps(measure({v!r}, {t}, "
                    f"{args.batch_tokens}, {args.heads}, {args.head_dim}, {dtype!r}, {args.device!r}, {args.repeats}, "
                    f"{args.chunk_size})))"
                )
                proc = subprocess.run([sys.executable, "-c", call], capture_output=True, text=True)
                if proc.returncode != 0:
                    res = {"status": "failed: " + (proc.stderr.strip().splitlines() or ["?"])[-1][:120]}
                else:
                    res = json.loads(proc.stdout.strip().splitlines()[-1])
            row = {"variant": v, "seq_len": t, **res}
            rows.append(row)
            if res["status"] == "ok":
                print(
                    f"{v:20s} {t:6d} {res['batch']:4d} {res['fwd_ms']:9.2f} {res['fwd_bwd_ms']:11.2f} "
                    f"{res['peak_mb']:9.1f}"
                )
            else:
                print(f"{v:20s} {t:6d}    - {res['status']}")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(
                f, fieldnames=["variant", "seq_len", "status", "batch", "fwd_ms", "fwd_bwd_ms", "peak_mb"]
            )
            w.writeheader()
            w.writerows(rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device_name, "dtype": dtype, "rows": rows}, indent=2))
    if args.plot:
        _plot(rows, Path(args.plot), device_name)
    return 0


def _plot(rows: list[dict], out: Path, device: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for v in dict.fromkeys(r["variant"] for r in rows):
        ok = [r for r in rows if r["variant"] == v and r["status"] == "ok"]
        if ok:
            axes[0].plot([r["seq_len"] for r in ok], [r["fwd_bwd_ms"] for r in ok], marker="o", label=v)
            axes[1].plot([r["seq_len"] for r in ok], [r["peak_mb"] for r in ok], marker="o", label=v)
    for ax, label in zip(axes, ("forward+backward (ms)", "peak memory (MB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T (B*T fixed)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.suptitle(f"attention core, {device}")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("attention", help="attention core time and memory by sequence length")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seq-lens", default="128,256,512,1024,2048,4096,8192")
    p.add_argument("--batch-tokens", type=int, default=16384, help="B*T, fixed across sequence lengths")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--chunk-size", type=int, default=128)
    p.add_argument("--csv")
    p.add_argument("--json")
    p.add_argument("--plot")
    p.set_defaults(func=run)
