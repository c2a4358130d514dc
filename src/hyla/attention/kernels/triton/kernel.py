"""Triton kernels of fused HYLA attention (forward and backward), never materializing the hidden tensor.
Called by the custom ops of ``hyla.attention.kernels.triton.wrapper``, which import this module lazily.

Shape letters: B batch, H heads, Q queries, K keys, E query/key head dim, D value head dim. One program
holds *all heads* of a (query tile, key tile) pair, so RMSHead (the RMS across heads of each (q, k)
score vector) is exact. Heads, E and D are padded to powers of two >= 16 (``HP``, ``EP``, ``DP``) so
every contraction is a batched ``tl.dot`` (3-D operands, tensor cores on a GPU):

=========  =====================================================  ==========================================
step       math (per batch b)                                     batched dot
=========  =====================================================  ==========================================
scores     s[h,q,k] = q[h,q].k[h,k] / sqrt(E) + bias[h,q,k]       (h | q x e) @ (h | e x k)
mask       s[h,q,k] = 0 where the pair is masked (or out of range)
code       a = s / sqrt(mean_h s^2 + eps)  (``rms_head``); a = s (``none``)
hidden     u[q,k,d] = sum_h a[h,q,k] v[h,k,d];  g = phi(u)         (k | q x h) @ (k | h x d)
output     y[h,q,d] = sum_k a[h,q,k] g[q,k,d]                     (q | h x k) @ (q | k x d)
=========  =====================================================  ==========================================

Backward (recomputes a, u, g tile by tile; dy = dL/dy):

* dA[h,q,k] = sum_d dy[h,q,d] g[q,k,d]  +  sum_d du[q,k,d] v[h,k,d],  with
  du[q,k,d] = phi'(u[q,k,d]) * sum_h a[h,q,k] dy[h,q,d];
* dv[h,k,d] = sum_q a[h,q,k] du[q,k,d];
* RMSHead: ds[h] = (dA[h] - a[h] * mean_j(dA[j] a[j])) / n,  n = sqrt(mean_h s^2 + eps); masked -> 0;
* dbias = ds;  dq[h,q] = sum_k ds[h,q,k] k[h,k] / sqrt(E);  dk[h,k] = sum_q ds[h,q,k] q[h,q] / sqrt(E).

The backward grid runs over key tiles (dk, dv accumulate in registers over all query tiles); dq is added
atomically into an fp32 buffer. Nothing is saved by the forward but its inputs: the code is local to each
(q, k) pair, so there is no row statistic (unlike softmax's log-sum-exp).

Precision: dot operands are in the input dtype (bf16 / fp16 on tensor cores, fp32 with
``input_precision="ieee"``), accumulation and everything elementwise in fp32. Under
``TRITON_INTERPRET=1`` (CPU) numpy cannot multiply bf16, so operands are rounded to the input dtype
and multiplied in fp32: the same numbers a GPU's fp32-accumulating tensor cores produce.

Tile sizes: ``FWD_TILES`` / ``BWD_TILES`` below (``BLOCK_Q = BLOCK_K = 16``, forward ``BLOCK_D =
min(DP, 64)`` with one grid axis per D chunk), overridable per call. They are correct for every size.
On an H100, 16 x 16 tiles with 4 warps
forward and 8 backward were the fastest tried; larger tiles spill, and num_stages changed nothing.
Both kernels run an order of magnitude under the tensor cores' rate: each step is a chain of small 3-D
dots with a shared-memory round trip per permute. Where a signature needs more shared memory than
the GPU has (float32 with 16 heads of 64; head dim 128 in float32), the forward retries with narrower
value chunks, then both raise ``FusedUnavailableError``. The backward keeps the whole padded D per tile
(dk, dv accumulators of HP x 16 x EP and 16 x HP x DP); splitting dv into its own kernel over D chunks
is the first thing to try for speed and for the large cases.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.runtime.errors import OutOfResources

#: phi codes used by the kernels (order matters: the kernels branch on the index).
PHI_CODES: dict[str, int] = {"relu": 0, "silu": 1, "gelu": 2, "sigmoid": 3, "tanh": 4, "identity": 5}
#: normalization codes.
NORM_CODES: dict[str, int] = {"none": 0, "rms_head": 1}

#: Launch parameters (blocks: powers of two >= 16). Correct for any value. ``num_stages`` None is
#: Triton's default (the H100 probe found no difference between 1, 2 and the default).
FWD_TILES: dict[str, int | None] = {"block_q": 16, "block_k": 16, "block_d": 64, "num_warps": 8, "num_stages": None}
BWD_TILES: dict[str, int | None] = {"block_q": 16, "block_k": 16, "num_warps": 8, "num_stages": None}
#: backward programs start on staggered query tiles (fewer colliding atomic dq adds)
BWD_STAGGER: bool = True
#: forward launch signature -> the widest value chunk whose kernel fits in shared memory
_FWD_BLOCK_D_THAT_FITS: dict[tuple, int] = {}

#: True when the kernels below were built by the Triton interpreter (TRITON_INTERPRET=1 at import).
INTERPRETED: bool = (
    bool(triton.knobs.runtime.interpret)
    if hasattr(triton, "knobs")  # Triton >= 3.4; older versions read the variable at decoration time
    else os.environ.get("TRITON_INTERPRET", "0") == "1"
)


def _pad(n: int) -> int:
    """Smallest power of two >= max(n, 16): the smallest operand side ``tl.dot`` accepts."""
    return max(16, triton.next_power_of_2(n))


@triton.jit
def _phi(u, PHI: tl.constexpr):
    if PHI == 0:
        g = tl.maximum(u, 0.0)
    elif PHI == 1:
        g = u * tl.sigmoid(u)
    elif PHI == 2:
        g = 0.5 * u * (1.0 + tl.erf(u * 0.7071067811865476))
    elif PHI == 3:
        g = tl.sigmoid(u)
    elif PHI == 4:
        g = 2.0 * tl.sigmoid(2.0 * u) - 1.0
    else:
        g = u
    return g


@triton.jit
def _phi_grad(u, PHI: tl.constexpr):
    if PHI == 0:
        d = tl.where(u > 0.0, 1.0, 0.0)
    elif PHI == 1:
        sg = tl.sigmoid(u)
        d = sg * (1.0 + u * (1.0 - sg))
    elif PHI == 2:
        cdf = 0.5 * (1.0 + tl.erf(u * 0.7071067811865476))
        d = cdf + u * tl.exp(-0.5 * u * u) * 0.3989422804014327
    elif PHI == 3:
        sg = tl.sigmoid(u)
        d = sg * (1.0 - sg)
    elif PHI == 4:
        t = 2.0 * tl.sigmoid(2.0 * u) - 1.0
        d = 1.0 - t * t
    else:
        d = u * 0.0 + 1.0
    return d


@triton.jit
def _operand(x, DT: tl.constexpr, EMULATE: tl.constexpr):
    """``x`` as a dot operand in the input precision ``DT`` (rounded, kept fp32 under the interpreter).

    The interpreter truncates fp32 -> bf16 casts where a GPU rounds to nearest even, so under it the
    bf16 rounding is done by hand on the bits (finite values; the result is exact in bf16).
    """
    if EMULATE:
        if tl.bfloat16 == DT:
            bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            return bits.to(tl.float32, bitcast=True)
        else:
            return x.to(DT).to(tl.float32)
    else:
        return x.to(DT)


@triton.jit
def _latent_code(q3, kT3, bias3, valid, scale, eps, H: tl.constexpr, NORM: tl.constexpr, PREC: tl.constexpr):
    """``a_HPxBQxBK`` (the code) and ``r_BQxBK`` (1 / RMS across heads; ones for ``none``).

    Padded heads have zero q, k and bias, hence a zero score and code.
    """
    s = tl.dot(q3, kT3, input_precision=PREC) * scale + bias3
    s = tl.where(valid[None, :, :], s, 0.0)
    if NORM == 1:
        r = tl.rsqrt(tl.sum(s * s, axis=0) / H + eps)
    else:
        r = tl.sum(s * 0.0, axis=0) + 1.0
    return s * r[None, :, :], r


@triton.jit
def _hidden_pre(a, v3, DT: tl.constexpr, EMULATE: tl.constexpr, PREC: tl.constexpr, SPLIT: tl.constexpr):
    """``u_BKxBQxD = sum_h a[h,q,k] v[k,h,d]`` and ``a`` as a dot operand ``a_lo`` (input precision).

    With bf16/fp16 inputs (``SPLIT``) the code is split in two operands, ``a = a_hi + a_res``, and ``u``
    takes two dots: rounding ``a`` once moves ``u`` across phi's kink (relu) often enough to put the
    gradients at ~3e-2 relative error; the split brings them to ~3e-3 for one extra dot.
    """
    a_lo = _operand(a, DT, EMULATE)
    u = tl.dot(tl.permute(a_lo, (2, 1, 0)), v3, input_precision=PREC)
    if SPLIT:
        a_res = _operand(a - a_lo.to(tl.float32), DT, EMULATE)
        u = tl.dot(tl.permute(a_res, (2, 1, 0)), v3, u, input_precision=PREC)
    return u, a_lo


@triton.jit
def _offsets3(o0, o1, o2, s0, s1, s2):
    """Offsets of a 3-D tile: ``o0[:, None, None] * s0 + o1[None, :, None] * s1 + o2[None, None, :] * s2``."""
    return o0[:, None, None] * s0 + o1[None, :, None] * s1 + o2[None, None, :] * s2


@triton.jit
def _ok3(m0, m1, m2):
    return m0[:, None, None] & m1[None, :, None] & m2[None, None, :]


@triton.jit
def _valid_pairs(mask_ptr, sm_q, sm_k, offs_q, offs_k, q_ok, k_ok, HAS_MASK: tl.constexpr):
    """``BQ x BK`` bool: the pair is in range and (with a mask) may attend; ``mask_ptr`` at this batch."""
    valid = q_ok[:, None] & k_ok[None, :]
    if HAS_MASK:
        m = tl.load(mask_ptr + offs_q[:, None] * sm_q + offs_k[None, :] * sm_k, mask=valid, other=0)
        valid = valid & (m != 0)
    return valid


@triton.jit
def _bias_tile(bias_ptr, sb_h, sb_q, sb_k, offs_h, offs_q, offs_k, h_ok, valid, HAS_BIAS: tl.constexpr):
    """``HP x BQ x BK`` fp32 bias (0 outside ``valid``), or the scalar 0 without a bias."""
    if HAS_BIAS:
        offs = _offsets3(offs_h.to(tl.int64), offs_q, offs_k, sb_h, sb_q, sb_k)
        ok = h_ok[:, None, None] & valid[None, :, :]
        bias3 = tl.load(bias_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    else:
        bias3 = 0.0
    return bias3


@triton.jit
def _hyla_fwd_kernel(
    q_ptr, k_ptr, v_ptr, bias_ptr, mask_ptr, y_ptr,
    sq_b, sq_h, sq_q, sq_e,
    sk_b, sk_h, sk_k, sk_e,
    sv_b, sv_h, sv_k, sv_d,
    sb_b, sb_h, sb_q, sb_k,
    sm_b, sm_q, sm_k,
    sy_b, sy_h, sy_q, sy_d,
    Q, K, scale, eps,
    H: tl.constexpr, HP: tl.constexpr, E: tl.constexpr, EP: tl.constexpr, D: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
    NORM: tl.constexpr, PHI: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr,
    PREC: tl.constexpr, EMULATE: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    """Grid (query tiles, B, D chunks): ``y[b, :, q tile, d chunk]`` for all heads."""
    pid_q = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    pid_d = tl.program_id(2)
    DT: tl.constexpr = v_ptr.dtype.element_ty
    offs_h = tl.arange(0, HP)
    offs_q = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    offs_e = tl.arange(0, EP)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    h_ok = offs_h < H
    q_ok = offs_q < Q
    e_ok = offs_e < E
    d_ok = offs_d < D
    q_ptr += b * sq_b
    k_ptr += b * sk_b
    v_ptr += b * sv_b
    if HAS_BIAS:
        bias_ptr += b * sb_b
    if HAS_MASK:
        mask_ptr += b * sm_b

    q_offs = _offsets3(offs_h, offs_q, offs_e, sq_h, sq_q, sq_e)
    q3 = _operand(tl.load(q_ptr + q_offs, mask=_ok3(h_ok, q_ok, e_ok), other=0.0), DT, EMULATE)  # H x Q x E
    acc = tl.zeros((BLOCK_Q, HP, BLOCK_D), dtype=tl.float32)  # y as (q, h, d)

    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < K
        valid = _valid_pairs(mask_ptr, sm_q, sm_k, offs_q, offs_k, q_ok, k_ok, HAS_MASK)
        if tl.max(valid.to(tl.int32)) > 0:  # skip fully masked tiles (e.g. above a causal diagonal)
            kT_offs = _offsets3(offs_h, offs_e, offs_k, sk_h, sk_e, sk_k)
            kT3 = _operand(tl.load(k_ptr + kT_offs, mask=_ok3(h_ok, e_ok, k_ok), other=0.0), DT, EMULATE)
            bias3 = _bias_tile(bias_ptr, sb_h, sb_q, sb_k, offs_h, offs_q, offs_k, h_ok, valid, HAS_BIAS)
            a, _ = _latent_code(q3, kT3, bias3, valid, scale, eps, H, NORM, PREC)  # HP x BQ x BK
            v_offs = _offsets3(offs_k, offs_h, offs_d, sv_k, sv_h, sv_d)
            v3 = _operand(tl.load(v_ptr + v_offs, mask=_ok3(k_ok, h_ok, d_ok), other=0.0), DT, EMULATE)
            u, a_lo = _hidden_pre(a, v3, DT, EMULATE, PREC, SPLIT)  # BK x BQ x BD
            g = _operand(_phi(u, PHI), DT, EMULATE)
            acc = tl.dot(tl.permute(a_lo, (1, 0, 2)), tl.permute(g, (1, 0, 2)), acc, input_precision=PREC)

    y_offs = b * sy_b + _offsets3(offs_q, offs_h, offs_d, sy_q, sy_h, sy_d)
    tl.store(y_ptr + y_offs, _operand(acc, DT, EMULATE).to(DT), mask=_ok3(q_ok, h_ok, d_ok))


@triton.jit
def _hyla_bwd_kernel(
    q_ptr, k_ptr, v_ptr, bias_ptr, mask_ptr, dy_ptr, dq_ptr, dk_ptr, dv_ptr, db_ptr,
    sq_b, sq_h, sq_q, sq_e,
    sk_b, sk_h, sk_k, sk_e,
    sv_b, sv_h, sv_k, sv_d,
    sb_b, sb_h, sb_q, sb_k,
    sm_b, sm_q, sm_k,
    sdy_b, sdy_h, sdy_q, sdy_d,
    sdq_b, sdq_h, sdq_q, sdq_e,
    sdk_b, sdk_h, sdk_k, sdk_e,
    sdv_b, sdv_h, sdv_k, sdv_d,
    sdb_b, sdb_h, sdb_q, sdb_k,
    Q, K, scale, eps,
    H: tl.constexpr, HP: tl.constexpr, E: tl.constexpr, EP: tl.constexpr, D: tl.constexpr, DP: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
    NORM: tl.constexpr, PHI: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr,
    BIAS_GRAD: tl.constexpr, BIAS_ATOMIC: tl.constexpr, PREC: tl.constexpr, EMULATE: tl.constexpr,
    SPLIT: tl.constexpr, STAGGER: tl.constexpr,
):  # fmt: skip
    """Grid (key tiles, B): dk, dv of one key tile over all query tiles; dq (fp32) and dbias atomically."""
    pid_k = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    DT: tl.constexpr = v_ptr.dtype.element_ty
    offs_h = tl.arange(0, HP)
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    offs_e = tl.arange(0, EP)
    offs_d = tl.arange(0, DP)
    h_ok = offs_h < H
    k_ok = offs_k < K
    e_ok = offs_e < E
    d_ok = offs_d < D
    q_ptr += b * sq_b
    k_ptr += b * sk_b
    v_ptr += b * sv_b
    if HAS_BIAS:
        bias_ptr += b * sb_b
    if HAS_MASK:
        mask_ptr += b * sm_b
    dy_ptr += b * sdy_b
    dq_ptr += b * sdq_b
    if BIAS_GRAD:
        db_ptr += b * sdb_b

    hke_ok = _ok3(h_ok, k_ok, e_ok)
    k3 = tl.load(k_ptr + _offsets3(offs_h, offs_k, offs_e, sk_h, sk_k, sk_e), mask=hke_ok, other=0.0)
    k3 = _operand(k3, DT, EMULATE)  # HP x BK x EP
    kT3 = tl.permute(k3, (0, 2, 1))  # HP x EP x BK
    khd_ok = _ok3(k_ok, h_ok, d_ok)
    v3 = tl.load(v_ptr + _offsets3(offs_k, offs_h, offs_d, sv_k, sv_h, sv_d), mask=khd_ok, other=0.0)
    v3 = _operand(v3, DT, EMULATE)  # BK x HP x DP
    vT3 = tl.permute(v3, (0, 2, 1))  # BK x DP x HP

    dk_acc = tl.zeros((HP, BLOCK_K, EP), dtype=tl.float32)
    dv_acc = tl.zeros((BLOCK_K, HP, DP), dtype=tl.float32)
    n_q_tiles = tl.cdiv(Q, BLOCK_Q)
    for i in range(0, n_q_tiles):
        # programs start on different query tiles so that their atomic dq adds rarely collide
        q_tile = (i + pid_k * STAGGER) % n_q_tiles
        offs_q = q_tile * BLOCK_Q + tl.arange(0, BLOCK_Q)
        q_ok = offs_q < Q
        valid = _valid_pairs(mask_ptr, sm_q, sm_k, offs_q, offs_k, q_ok, k_ok, HAS_MASK)
        if tl.max(valid.to(tl.int32)) > 0:
            hqe_ok = _ok3(h_ok, q_ok, e_ok)
            q3 = tl.load(q_ptr + _offsets3(offs_h, offs_q, offs_e, sq_h, sq_q, sq_e), mask=hqe_ok, other=0.0)
            q3 = _operand(q3, DT, EMULATE)  # HP x BQ x EP
            dy_offs = _offsets3(offs_q, offs_h, offs_d, sdy_q, sdy_h, sdy_d)
            dy3 = _operand(tl.load(dy_ptr + dy_offs, mask=_ok3(q_ok, h_ok, d_ok), other=0.0), DT, EMULATE)
            bias3 = _bias_tile(bias_ptr, sb_h, sb_q, sb_k, offs_h, offs_q, offs_k, h_ok, valid, HAS_BIAS)
            a, r = _latent_code(q3, kT3, bias3, valid, scale, eps, H, NORM, PREC)  # HP x BQ x BK
            u, a_lo = _hidden_pre(a, v3, DT, EMULATE, PREC, SPLIT)  # BK x BQ x DP
            g = _operand(_phi(u, PHI), DT, EMULATE)
            # dA1[q,h,k] = sum_d dy[q,h,d] g[q,d,k];  dg[q,k,d] = sum_h a[q,k,h] dy[q,h,d]
            dA1 = tl.dot(dy3, tl.permute(g, (1, 2, 0)), input_precision=PREC)  # BQ x HP x BK
            dg = tl.dot(tl.permute(a_lo, (1, 2, 0)), dy3, input_precision=PREC)  # BQ x BK x DP
            du = _operand(tl.permute(dg, (1, 0, 2)) * _phi_grad(u, PHI), DT, EMULATE)  # BK x BQ x DP
            dv_acc = tl.dot(tl.permute(a_lo, (2, 0, 1)), du, dv_acc, input_precision=PREC)  # BK x HP x DP
            dA2 = tl.dot(du, vT3, input_precision=PREC)  # BK x BQ x HP
            dA = tl.permute(dA1, (1, 0, 2)) + tl.permute(dA2, (2, 1, 0))  # HP x BQ x BK
            if NORM == 1:
                c = tl.sum(dA * a, axis=0) / H
                ds = (dA - a * c[None, :, :]) * r[None, :, :]
            else:
                ds = dA
            ds = tl.where(valid[None, :, :] & h_ok[:, None, None], ds, 0.0)
            if BIAS_GRAD:
                db_offs = _offsets3(offs_h.to(tl.int64), offs_q, offs_k, sdb_h, sdb_q, sdb_k)
                if BIAS_ATOMIC:
                    tl.atomic_add(db_ptr + db_offs, ds, mask=_ok3(h_ok, q_ok, k_ok))
                else:
                    tl.store(db_ptr + db_offs, ds, mask=_ok3(h_ok, q_ok, k_ok))
            ds_lo = _operand(ds, DT, EMULATE)
            dq_part = tl.dot(ds_lo, k3, input_precision=PREC) * scale  # HP x BQ x EP
            dq_offs = _offsets3(offs_h, offs_q, offs_e, sdq_h, sdq_q, sdq_e)
            tl.atomic_add(dq_ptr + dq_offs, dq_part, mask=hqe_ok)
            dk_acc = tl.dot(tl.permute(ds_lo, (0, 2, 1)), q3, dk_acc, input_precision=PREC)  # HP x BK x EP

    dk_offs = b * sdk_b + _offsets3(offs_h, offs_k, offs_e, sdk_h, sdk_k, sdk_e)
    tl.store(dk_ptr + dk_offs, _operand(dk_acc * scale, DT, EMULATE).to(DT), mask=hke_ok)
    dv_offs = b * sdv_b + _offsets3(offs_k, offs_h, offs_d, sdv_k, sdv_h, sdv_d)
    tl.store(dv_ptr + dv_offs, _operand(dv_acc, DT, EMULATE).to(DT), mask=khd_ok)


# ---------------------------------------------------------------------------------------------- launchers
def _launch(kernel, grid: tuple[int, ...], args: tuple, meta: dict, num_stages: int | None) -> None:
    """Launch ``kernel``; if it needs more shared memory than the GPU has, raise
    ``FusedUnavailableError`` saying so (``auto`` then falls back).

    Fewer pipeline stages do not help: on an H100 the float32 forward needed the same 458,752 bytes with
    one stage as with Triton's default (the memory is the layout conversions' buffers, not the pipeline).
    """
    from hyla.attention.kernels.errors import FusedUnavailableError

    stages = {} if num_stages is None else {"num_stages": num_stages}
    try:
        kernel[grid](*args, **meta, **stages)
    except OutOfResources as err:
        raise FusedUnavailableError(
            f"the fused kernel needs {err.required} bytes of {err.name} for H={meta['H']} heads (padded to "
            f"{meta['HP']}), head dims E={meta['E']}, D={meta['D']} in {args[0].dtype}; this GPU has {err.limit}. "
            "Fewer heads or smaller head dims fit (bfloat16 fits more than float32); backend='auto' uses the "
            "direct form"
        ) from err


def _mask_strides(mask_Bx1xQxK: Tensor | None) -> tuple[Tensor | None, tuple[int, int, int]]:
    """The mask as uint8 (same bytes as bool) and its (batch, query, key) strides (0 where broadcast)."""
    if mask_Bx1xQxK is None:
        return None, (0, 0, 0)
    m = mask_Bx1xQxK.view(torch.uint8)
    s = m.stride()
    return m, (s[0] if m.shape[0] > 1 else 0, s[2] if m.shape[2] > 1 else 0, s[3] if m.shape[3] > 1 else 0)


def _bias_strides(bias_BxHxQxK: Tensor | None) -> tuple[int, int, int, int]:
    if bias_BxHxQxK is None:
        return (0, 0, 0, 0)
    return tuple(st if n > 1 else 0 for st, n in zip(bias_BxHxQxK.stride(), bias_BxHxQxK.shape))  # type: ignore[return-value]


def _meta(q: Tensor, v: Tensor, normalization: str, nonlinearity: str) -> dict:
    return {
        "H": q.shape[1],
        "HP": _pad(q.shape[1]),
        "E": q.shape[3],
        "EP": _pad(q.shape[3]),
        "D": v.shape[3],
        "NORM": NORM_CODES[normalization],
        "PHI": PHI_CODES[nonlinearity],
        # fp32: exact products (no tf32); bf16/fp16: the default (tensor cores; the option is moot)
        "PREC": "ieee" if v.dtype == torch.float32 else None,
        "EMULATE": INTERPRETED,
        "SPLIT": v.dtype != torch.float32,
    }


def forward(
    q_BxHxQxE: Tensor,
    k_BxHxKxE: Tensor,
    v_BxHxKxD: Tensor,
    bias_BxHxQxK: Tensor | None,
    mask_Bx1xQxK: Tensor | None,
    normalization: str,
    nonlinearity: str,
    eps: float,
    *,
    block_q: int | None = None,
    block_k: int | None = None,
    block_d: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> Tensor:
    """``y_BxHxQxD`` (dtype of v); ``bias`` (float) and ``mask`` (bool) are 4-D, broadcast dims of size 1."""
    b, h, nq, e = q_BxHxQxE.shape
    nk, d = k_BxHxKxE.shape[2], v_BxHxKxD.shape[3]
    y = torch.empty(b, h, nq, d, device=q_BxHxQxE.device, dtype=v_BxHxKxD.dtype)
    if nq == 0:
        return y
    if nk == 0:
        return y.zero_()
    block_q = block_q or FWD_TILES["block_q"]
    block_k = block_k or FWD_TILES["block_k"]
    block_d = min(_pad(d), block_d or FWD_TILES["block_d"])
    mask, sm = _mask_strides(mask_Bx1xQxK)
    grid = (triton.cdiv(nq, block_q), b, triton.cdiv(d, block_d))
    args = (
        q_BxHxQxE, k_BxHxKxE, v_BxHxKxD, bias_BxHxQxK, mask, y,
        *q_BxHxQxE.stride(), *k_BxHxKxE.stride(), *v_BxHxKxD.stride(), *_bias_strides(bias_BxHxQxK), *sm,
        *y.stride(),
        nq, nk, 1.0 / math.sqrt(e), eps,
    )  # fmt: skip
    meta = dict(
        BLOCK_D=block_d, BLOCK_Q=block_q, BLOCK_K=block_k,
        HAS_BIAS=bias_BxHxQxK is not None, HAS_MASK=mask is not None,
        **_meta(q_BxHxQxE, v_BxHxKxD, normalization, nonlinearity),
        num_warps=num_warps or FWD_TILES["num_warps"],
    )  # fmt: skip
    from hyla.attention.kernels.errors import FusedUnavailableError

    stages = num_stages or FWD_TILES["num_stages"]
    key = (q_BxHxQxE.device, q_BxHxQxE.dtype, stages, *sorted(meta.items()))
    meta["BLOCK_D"] = _FWD_BLOCK_D_THAT_FITS.get(key, block_d)
    while True:
        try:
            _launch(_hyla_fwd_kernel, (grid[0], b, triton.cdiv(d, meta["BLOCK_D"])), args, meta, stages)
            _FWD_BLOCK_D_THAT_FITS[key] = meta["BLOCK_D"]
            return y
        except FusedUnavailableError:  # out of shared memory: narrower value chunks need less
            if meta["BLOCK_D"] <= 16:
                raise
            meta["BLOCK_D"] //= 2


def backward(
    dy_BxHxQxD: Tensor,
    q_BxHxQxE: Tensor,
    k_BxHxKxE: Tensor,
    v_BxHxKxD: Tensor,
    bias_BxHxQxK: Tensor | None,
    mask_Bx1xQxK: Tensor | None,
    normalization: str,
    nonlinearity: str,
    eps: float,
    bias_grad: bool,
    *,
    block_q: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    stagger: bool | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """``(dq, dk, dv, dbias)``; dbias (fp32) has the bias's shape, None unless ``bias_grad``."""
    b, h, nq, e = q_BxHxQxE.shape
    nk, d = k_BxHxKxE.shape[2], v_BxHxKxD.shape[3]
    dq = torch.zeros(b, h, nq, e, device=q_BxHxQxE.device, dtype=torch.float32)
    dk = torch.zeros_like(k_BxHxKxE, memory_format=torch.contiguous_format)
    dv = torch.zeros_like(v_BxHxKxD, memory_format=torch.contiguous_format)
    bias_grad = bias_grad and bias_BxHxQxK is not None
    db = None
    if bias_grad:
        assert bias_BxHxQxK is not None
        db = torch.zeros(bias_BxHxQxK.shape[0], h, nq, nk, device=q_BxHxQxE.device, dtype=torch.float32)
    if nq and nk:
        mask, sm = _mask_strides(mask_Bx1xQxK)
        db_strides = (0, 0, 0, 0) if db is None else (db.stride(0) * (db.shape[0] > 1), *db.stride()[1:])
        dy = dy_BxHxQxD.to(v_BxHxKxD.dtype)
        block_q = block_q or BWD_TILES["block_q"]
        block_k = block_k or BWD_TILES["block_k"]
        grid = (triton.cdiv(nk, block_k), b)
        args = (
            q_BxHxQxE, k_BxHxKxE, v_BxHxKxD, bias_BxHxQxK, mask, dy, dq, dk, dv, db,
            *q_BxHxQxE.stride(), *k_BxHxKxE.stride(), *v_BxHxKxD.stride(), *_bias_strides(bias_BxHxQxK), *sm,
            *dy.stride(), *dq.stride(), *dk.stride(), *dv.stride(), *db_strides,
            nq, nk, 1.0 / math.sqrt(e), eps,
        )  # fmt: skip
        meta = dict(
            DP=_pad(d), BLOCK_Q=block_q, BLOCK_K=block_k,
            HAS_BIAS=bias_BxHxQxK is not None, HAS_MASK=mask is not None,
            BIAS_GRAD=bias_grad, BIAS_ATOMIC=db is not None and db.shape[0] == 1 and b > 1,
            STAGGER=int(BWD_STAGGER if stagger is None else stagger),
            **_meta(q_BxHxQxE, v_BxHxKxD, normalization, nonlinearity),
            num_warps=num_warps or BWD_TILES["num_warps"],
        )  # fmt: skip
        _launch(_hyla_bwd_kernel, grid, args, meta, num_stages or BWD_TILES["num_stages"])
    if db is not None:
        assert bias_BxHxQxK is not None
        dims = [i for i in (1, 2, 3) if bias_BxHxQxK.shape[i] == 1]
        db = db.sum(dim=dims, keepdim=True) if dims else db
    return dq.to(q_BxHxQxE.dtype), dk, dv, db
