"""Fused HYLA (and softmax attention) on CPU: the wrapper of a small C kernel (``hyla_cpu.c``, in ``hyla.ops``),
forward and backward.

Each (batch, query) row computes its scores for all heads and keys, their normalization, the generated value
network and its output in cache-sized scratch, so no ``B x H x Q x K`` tensor is ever written; the
backward recomputes the row (as FlashAttention does) instead of storing it. q, k, v, the output and
the gradients are read and written in the strides the model has (``B x T x H x E`` memory viewed as
``B x H x T x E``), so no transpose is copied on the way in or out. On the 2-core machine, one
thread, this makes the SRAVEN paper model's HYLA step 0.79x softmax's.

The C library (``hyla.ops.clib``) is built on first use; without a working compiler the kernel is unavailable
and ``backend="auto"`` uses ``hyla.attention.kernels.manual_backward`` instead. The kernel writes its vector
sums itself (8 lanes, a fixed order, no contracted multiply-adds under ``-std=c99``), so with ``phi`` relu or
identity its results do not depend on the ``-march`` target; the other phis call libm, whose results may.

Covers (``COVERAGE["fused_cpu"]`` in ``hyla.attention.kernels.coverage``) ``value_network`` ``hyper``
(HYLA's) and ``linear`` (standard multi-head attention's) with every ``normalization`` (softmax over a row's
keys with an exponential of its own: float32 within 2 ulp of ``exp``), every phi, float32 and float64, any
mask broadcastable to ``Bx1xQxK``, any bias broadcastable to ``1xHxQxK`` and attention dropout (a ``QxK``
keep-mask shared over batch and heads, as ``hyla.attention.functional.drop_pairs`` draws it); first-order
gradients;
the ops ``hyla::fused_cpu_attention`` and ``hyla::fused_cpu_attention_backward`` carry it through
autograd, ``torch.compile`` (opaque calls; the library is built while tracing if need be) and
``torch.vmap`` where its batching rule is registered (``hyla.train.engines.vmap_rules``: R stacked runs are folded
into the batch, one call).
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch
from torch import Tensor

from hyla.attention.backend import AttentionCall, Backend, per_head_mask_reason
from hyla.attention.config import AttentionConfig
from hyla.attention.kernels.coverage import COVERAGE, covers_dtype, dtype_names, variant_unsupported_reason
from hyla.attention.kernels.errors import CpuKernelUnavailableError
from hyla.ops.clib import BATCHED_OPS, DTYPES, library_problem, load_library

PHI_IDS = {"relu": 0, "silu": 1, "gelu": 2, "sigmoid": 3, "tanh": 4, "identity": 5}
NORM_IDS = {"none": 0, "rms_head": 1, "softmax": 2}  # NORM_NONE, NORM_RMS, NORM_SOFTMAX in the C source
#: the custom op's name (``BATCHED_OPS`` holds it once its ``torch.vmap`` rule is registered)
ATTENTION_OP = "hyla::fused_cpu_attention"


def fused_cpu_unsupported_reason(
    config: AttentionConfig,
    q_BxHxQxE: Tensor,
    k_BxHxKxE: Tensor,
    v_BxHxKxD: Tensor,
    mask_Bx1xQxK: Tensor | None = None,
    bias: Tensor | None = None,
) -> str | None:
    """None when ``fused_cpu_hypernetwork_attention`` can run this case, else why not."""
    reason = variant_unsupported_reason("fused_cpu", config)
    if reason is not None:
        return reason
    coverage = COVERAGE["fused_cpu"]
    tensors = (q_BxHxQxE, k_BxHxKxE, v_BxHxKxD, mask_Bx1xQxK, bias)
    vmap_unsupported = not (coverage.vmap and ATTENTION_OP in BATCHED_OPS) and not torch.compiler.is_compiling()
    if vmap_unsupported and any(t is not None and torch._C._functorch.is_batchedtensor(t) for t in tensors):
        return "inside torch.vmap without the op's batching rule (hyla.train.engines.vmap_rules registers it)"
    devices = coverage.devices
    if devices is not None and any(t is not None and t.device.type not in devices for t in tensors):
        return "tensors not on the CPU"
    dtypes = {t.dtype for t in (q_BxHxQxE, k_BxHxKxE, v_BxHxKxD)}
    if len(dtypes) > 1 or not covers_dtype("fused_cpu", q_BxHxQxE.dtype):
        return f"dtype {sorted(str(d) for d in dtypes)} (covered: {dtype_names('fused_cpu')})"
    if bias is not None and bias.dim() > 3 and any(n != 1 for n in bias.shape[:-3]):
        return f"a bias that varies over the batch (shape {tuple(bias.shape)}; covered: broadcastable to 1xHxQxK)"
    return library_problem() or None


def _pointer(t: Tensor | None) -> ctypes.c_void_p:
    return ctypes.c_void_p(None if t is None else t.data_ptr())


def _real(suffix: str) -> type:
    return ctypes.c_float if suffix == "f32" else ctypes.c_double


def _strides(t: Tensor) -> Any:
    return (ctypes.c_longlong * 4)(*t.stride())


def _call_c(
    direction: str,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    keep: Tensor | None,
    drop: Tensor | None,
    keep_prob: float,
    phi: int,
    norm: int,
    linear: bool,
    eps: float,
    threads: int,
    *buffers: Tensor | None,
) -> None:
    """``hyla_{direction}_{f32|f64}`` of ``hyla_cpu.c``: the inputs and settings both directions take, then
    ``buffers`` (forward: ``y``; backward: ``dy``, ``dq``, ``dk``, ``dv``, then ``dbias`` or None), each
    4-d one passed with its strides."""
    lib, suffix = load_library(), DTYPES[q.dtype]
    real = _real(suffix)
    keep_batched = int(keep is not None and keep.shape[0] > 1)
    b, h, nq, e = q.shape
    sizes = [ctypes.c_int(n) for n in (b, h, nq, k.shape[2], e, v.shape[3])]
    tail: list[Any] = []
    for t in buffers:
        tail.append(_pointer(t))
        if t is not None and t.dim() == 4:
            tail.append(_strides(t))
    failed = getattr(lib, f"hyla_{direction}_{suffix}")(
        _pointer(q), _strides(q), _pointer(k), _strides(k), _pointer(v), _strides(v), _pointer(bias),
        _pointer(keep), ctypes.c_int(keep_batched), _pointer(drop), real(keep_prob), *sizes,
        real(1.0 / e**0.5), ctypes.c_int(norm), ctypes.c_int(int(linear)), real(eps), ctypes.c_int(phi),
        ctypes.c_int(threads), *tail,
    )  # fmt: skip
    if failed:
        raise MemoryError("hyla fused CPU kernel: could not allocate its scratch")


def _output_like_heads_inside(b: int, h: int, t: int, d: int, like: Tensor) -> Tensor:
    """A fresh ``B x H x T x D`` tensor laid out as ``B x T x H x D`` in memory: the layout the model's
    output projection reads without a copy."""
    return torch.empty_strided((b, h, t, d), (t * h * d, d, h * d, 1), dtype=like.dtype, device=like.device)


# The kernel is registered as PyTorch custom ops (opaque to torch.compile, which traces the layout
# changes around them and calls the C code as is), with the backward as an op of its own.
@torch.library.custom_op(ATTENTION_OP, mutates_args=(), device_types="cpu")
def fused_cpu_attention_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    keep: Tensor | None,
    drop: Tensor | None,
    keep_prob: float,
    phi: int,
    norm: int,
    linear: bool,
    eps: float,
) -> Tensor:
    b, h, nq, _ = q.shape
    y = _output_like_heads_inside(b, h, nq, v.shape[3], q)
    _call_c("forward", q, k, v, bias, keep, drop, keep_prob, phi, norm, linear, eps, torch.get_num_threads(), y)
    return y


@fused_cpu_attention_op.register_fake
def _fused_cpu_attention_fake(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    keep: Tensor | None,
    drop: Tensor | None,
    keep_prob: float,
    phi: int,
    norm: int,
    linear: bool,
    eps: float,
) -> Tensor:
    return _output_like_heads_inside(q.shape[0], q.shape[1], q.shape[2], v.shape[3], q)


@torch.library.custom_op("hyla::fused_cpu_attention_backward", mutates_args=(), device_types="cpu")
def fused_cpu_attention_backward_op(
    dy: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    keep: Tensor | None,
    drop: Tensor | None,
    keep_prob: float,
    phi: int,
    norm: int,
    linear: bool,
    eps: float,
    bias_grad: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dbias = torch.empty_like(bias) if bias is not None and bias_grad else None
    threads = torch.get_num_threads()
    _call_c("backward", q, k, v, bias, keep, drop, keep_prob, phi, norm, linear, eps, threads, dy, dq, dk, dv, dbias)
    return dq, dk, dv, (dbias if dbias is not None else q.new_empty(0))


@fused_cpu_attention_backward_op.register_fake
def _fused_cpu_attention_backward_fake(
    dy: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    keep: Tensor | None,
    drop: Tensor | None,
    keep_prob: float,
    phi: int,
    norm: int,
    linear: bool,
    eps: float,
    bias_grad: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    dbias = torch.empty_like(bias) if bias is not None and bias_grad else q.new_empty(0)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dbias


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    q, k, v, bias, keep, drop, keep_prob, phi, norm, linear, eps = inputs
    ctx.save_for_backward(q, k, v, bias, keep, drop)
    ctx.keep_prob, ctx.phi, ctx.norm, ctx.linear, ctx.eps = keep_prob, phi, norm, linear, eps


def _backward(ctx: Any, dy: Tensor) -> tuple[Tensor | None, ...]:
    q, k, v, bias, keep, drop = ctx.saved_tensors
    bias_grad = bias is not None and ctx.needs_input_grad[3]
    dq, dk, dv, dbias = fused_cpu_attention_backward_op(
        dy, q, k, v, bias, keep, drop, ctx.keep_prob, ctx.phi, ctx.norm, ctx.linear, ctx.eps, bias_grad
    )
    return dq, dk, dv, (dbias if bias_grad else None), None, None, None, None, None, None, None


fused_cpu_attention_op.register_autograd(_backward, setup_context=_setup_context)


def fused_cpu_hypernetwork_attention(
    q_BxHxQxE: Tensor,
    k_BxHxKxE: Tensor,
    v_BxHxKxD: Tensor,
    config: AttentionConfig,
    *,
    mask_Bx1xQxK: Tensor | None = None,
    bias: Tensor | None = None,
    dropout_keep_11xQxK: Tensor | None = None,
    dropout: float = 0.0,
) -> Tensor:
    """``y_BxHxQxD`` of ``hypernetwork_attention`` by the fused CPU kernel.

    ``mask_Bx1xQxK`` is bool broadcastable to ``Bx1xQxK`` (True = may attend); ``bias`` broadcastable to
    ``1xHxQxK`` (its gradient is summed back to its shape). ``dropout_keep_11xQxK`` (bool, True = kept) with
    rate ``dropout``: attention dropout on the normalized code, as
    ``drop_pairs`` applies it. Raises ``CpuKernelUnavailableError``
    naming the cause for a case it does not cover (``fused_cpu_unsupported_reason``).
    """
    call = AttentionCall(
        q_BxHxQxE,
        k_BxHxKxE,
        v_BxHxKxD,
        config,
        mask_Bx1xQxK,
        bias,
        dropout=dropout,
        dropout_keep_11xQxK=dropout_keep_11xQxK,
    )
    reason = fused_cpu_unsupported_reason(config, *call.tensors)
    if reason is not None:
        raise FUSED_CPU.unavailable(reason)
    return FUSED_CPU(call)


def _launch(call: AttentionCall) -> Tensor:
    q_BxHxQxE, k_BxHxKxE, v_BxHxKxD, config = call.q_BxHxQxE, call.k_BxHxKxE, call.v_BxHxKxD, call.config
    mask_Bx1xQxK, bias, dropout_keep_11xQxK, dropout = call.mask, call.bias, call.dropout_keep_11xQxK, call.dropout
    dtype = q_BxHxQxE.dtype
    h, nq, nk = q_BxHxQxE.shape[1], q_BxHxQxE.shape[2], k_BxHxKxE.shape[2]
    keep = None
    if mask_Bx1xQxK is not None:  # (1 or B) x Q x K bytes
        mask4 = mask_Bx1xQxK.reshape((1,) * (4 - mask_Bx1xQxK.dim()) + tuple(mask_Bx1xQxK.shape))
        keep = mask4.expand(mask4.shape[0], 1, nq, nk).reshape(-1, nq, nk).to(torch.uint8).contiguous()
    bias_HxQxK = None
    if bias is not None:
        bias_HxQxK = bias.to(dtype).expand(*bias.shape[:-3], h, nq, nk).reshape(h, nq, nk).contiguous()
    drop = None
    if dropout_keep_11xQxK is not None:  # Q x K bytes
        if not 0 <= dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if dropout_keep_11xQxK.numel() != nq * nk:
            raise ValueError(
                f"dropout_keep_11xQxK must hold one entry per (query, key) pair, 1x1x{nq}x{nk}; "
                f"got shape {tuple(dropout_keep_11xQxK.shape)}"
            )
        drop = dropout_keep_11xQxK.reshape(nq, nk).to(torch.uint8).contiguous()
    return fused_cpu_attention_op(
        q_BxHxQxE,
        k_BxHxKxE,
        v_BxHxKxD,
        bias_HxQxK,
        keep,
        drop,
        1.0 - dropout,
        PHI_IDS[config.nonlinearity],
        NORM_IDS[config.normalization],
        config.value_network == "linear",
        config.rms_eps,
    )


class FusedCpu(Backend):
    """The C kernel: never writes a ``B x H x Q x K`` tensor; applies attention dropout itself."""

    name = "fused_cpu"

    def covers(self, call: AttentionCall) -> str | None:
        return per_head_mask_reason(call.mask) or fused_cpu_unsupported_reason(call.config, *call.tensors)

    def __call__(self, call: AttentionCall) -> Tensor:
        return _launch(call)

    def unavailable(self, reason: str) -> Exception:
        return CpuKernelUnavailableError(f"backend='fused_cpu' cannot run this case: {reason}")


FUSED_CPU = FusedCpu()
