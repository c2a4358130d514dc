"""Fused HYLA attention (``backend="fused"``): the wrapper that registers the Triton kernel of
``hyla.attention.kernels.triton.kernel`` as a ``torch.library`` custom op (autograd, ``torch.compile``,
fake tensors).

Public entry point: ``fused_hypernetwork_attention`` (same contract as the direct form's ``y``).
The kernel module is imported lazily, at the first launch, so importing this file needs neither Triton
nor a GPU; ``fused_unsupported_reason`` says, without launching anything, why a case cannot run
(the variants and dtypes it covers: ``COVERAGE["fused"]`` in ``hyla.attention.kernels.coverage``).

Two ops are registered:

* ``hyla::fused_attention(q, k, v, bias?, mask?, normalization, nonlinearity, eps) -> y``
* ``hyla::fused_attention_backward(dy, q, k, v, bias?, mask?, normalization, nonlinearity, eps,
  bias_grad) -> (dq, dk, dv, dbias)`` (``dbias`` is an empty tensor when ``bias_grad`` is False)

``bias`` is 4-D, broadcastable to ``BxHxQxK`` (each dim full or 1); ``mask`` is a 4-D bool tensor
broadcastable to ``Bx1xQxK`` (True = may attend). The wrapper brings lower-rank inputs to 4-D.
"""

from __future__ import annotations

import importlib.util
import os

import torch
from torch import Tensor

from hyla.attention.backend import AttentionCall, Backend, per_head_mask_reason
from hyla.attention.config import AttentionConfig
from hyla.attention.kernels.coverage import (
    COVERAGE,
    covers_dtype,
    dropout_unsupported_reason,
    dtype_names,
    variant_unsupported_reason,
)
from hyla.attention.kernels.errors import FusedUnavailableError

#: The size limits of the fused kernel, beyond ``COVERAGE["fused"]`` (``fused_unsupported_reason`` names
#: the cause of a case outside them).
MAX_HEADS = 32
MAX_HEAD_DIM = 128


#: looked up once: ``torch.compile`` refuses to trace ``importlib.util.find_spec``
_TRITON_INSTALLED: bool = importlib.util.find_spec("triton") is not None


def triton_available() -> bool:
    return _TRITON_INSTALLED


def interpreter_enabled() -> bool:
    """``TRITON_INTERPRET=1``: Triton kernels run on CPU tensors (slowly: a correctness tool)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def fused_unsupported_reason(
    config: AttentionConfig,
    q_BxHxQxE: Tensor,
    k_BxHxKxE: Tensor,
    v_BxHxKxD: Tensor,
    mask_Bx1xQxK: Tensor | None = None,
    bias: Tensor | None = None,
) -> str | None:
    """None when the fused kernel can run this case, else a sentence saying why not."""
    reason = variant_unsupported_reason("fused", config)
    if reason is not None:
        return reason
    coverage = COVERAGE["fused"]
    if not triton_available():
        return "triton is not installed (pip install 'hyla[kernels]')"
    if not coverage.vmap and any(_is_batched(t) for t in (q_BxHxQxE, k_BxHxKxE, v_BxHxKxD)):
        return "inside torch.vmap (e.g. stacked runs): the op has no batching rule"
    device = q_BxHxQxE.device
    if device.type == "cpu":  # beyond the covered devices: the interpreter, for tests
        if not interpreter_enabled():
            return "CPU tensors need TRITON_INTERPRET=1 (the Triton interpreter; slow, for testing)"
        from hyla.attention.kernels.triton import kernel

        if not kernel.INTERPRETED:
            return "hyla.attention.kernels.triton.kernel was imported before TRITON_INTERPRET=1 was set"
    elif coverage.devices is not None and device.type not in coverage.devices:
        return f"device {device.type!r} (the kernel runs on CUDA, or on CPU under TRITON_INTERPRET=1)"
    tensors = {"q": q_BxHxQxE, "k": k_BxHxKxE, "v": v_BxHxKxD}
    for name, t in tensors.items():
        if t.device != device:
            return f"{name} is on {t.device}, q on {device}"
    dtypes = {t.dtype for t in tensors.values()}
    if len(dtypes) > 1:
        return f"q, k, v have different dtypes {sorted(str(d) for d in dtypes)}"
    if not covers_dtype("fused", q_BxHxQxE.dtype):
        return f"dtype {q_BxHxQxE.dtype} (the kernel covers {dtype_names('fused')})"
    heads, e, d = q_BxHxQxE.shape[1], q_BxHxQxE.shape[3], v_BxHxKxD.shape[3]
    if heads > MAX_HEADS:
        return f"{heads} heads (the kernel covers 1..{MAX_HEADS})"
    if e > MAX_HEAD_DIM or d > MAX_HEAD_DIM:
        return f"head dims E={e}, D={d} (the kernel covers 1..{MAX_HEAD_DIM})"
    for name, t in (("mask", mask_Bx1xQxK), ("bias", bias)):
        if t is not None and t.device != device:
            return f"{name} is on {t.device}, q on {device}"
    return None


def _is_batched(t: Tensor) -> bool:
    """A functorch BatchedTensor, i.e. we are inside ``torch.vmap``."""
    return torch._C._functorch.is_batchedtensor(t)


def _check_shapes(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"q, k, v must be 4-D (B x H x T x dim), got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    b, h, nq, e = q.shape
    if k.shape[:2] != (b, h) or k.shape[3] != e:
        raise ValueError(f"k must have shape (B={b}, H={h}, K, E={e}), got {tuple(k.shape)}")
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(f"v must have shape (B={b}, H={h}, K={k.shape[2]}, D), got {tuple(v.shape)}")
    nk = k.shape[2]
    if mask is not None:
        if mask.dtype != torch.bool:
            raise ValueError(f"mask must be a bool tensor (True = may attend), got dtype {mask.dtype}")
        if mask.dim() > 4 or not _broadcasts(mask.shape, (b, 1, nq, nk)):
            raise ValueError(f"mask must broadcast to (B={b}, 1, Q={nq}, K={nk}), got {tuple(mask.shape)}")
    if bias is not None and (
        bias.dim() > 4 or not bias.is_floating_point() or not _broadcasts(bias.shape, (b, h, nq, nk))
    ):
        raise ValueError(
            f"bias must be a float tensor broadcastable to (B={b}, H={h}, Q={nq}, K={nk}), "
            f"got {bias.dtype} {tuple(bias.shape)}"
        )


def _broadcasts(shape: torch.Size | tuple[int, ...], target: tuple[int, ...]) -> bool:
    """``shape`` (right-aligned) has every dim equal to the target's or 1."""
    return all(s in (1, t) for s, t in zip(reversed(tuple(shape)), reversed(target)))


def _to_4d(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.reshape((1,) * (4 - t.dim()) + tuple(t.shape))


# ---------------------------------------------------------------------------------------------- the ops
@torch.library.custom_op("hyla::fused_attention", mutates_args=())
def _fused_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    mask: Tensor | None,
    normalization: str,
    nonlinearity: str,
    eps: float,
) -> Tensor:
    from hyla.attention.kernels.triton import kernel

    return kernel.forward(q, k, v, bias, mask, normalization, nonlinearity, eps)


@_fused_attention.register_fake
def _fused_attention_fake(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    mask: Tensor | None,
    normalization: str,
    nonlinearity: str,
    eps: float,
) -> Tensor:
    return q.new_empty((q.shape[0], q.shape[1], q.shape[2], v.shape[3]), dtype=v.dtype)


@torch.library.custom_op("hyla::fused_attention_backward", mutates_args=())
def _fused_attention_backward(
    dy: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    mask: Tensor | None,
    normalization: str,
    nonlinearity: str,
    eps: float,
    bias_grad: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    from hyla.attention.kernels.triton import kernel

    grads = kernel.backward(dy, q, k, v, bias, mask, normalization, nonlinearity, eps, bias_grad)
    dq, dk, dv, db = grads
    if db is None:
        return dq, dk, dv, q.new_empty(0)
    assert bias is not None
    return dq, dk, dv, db.to(bias.dtype)


@_fused_attention_backward.register_fake
def _fused_attention_backward_fake(
    dy: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    mask: Tensor | None,
    normalization: str,
    nonlinearity: str,
    eps: float,
    bias_grad: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    db = bias.new_empty(bias.shape) if bias_grad and bias is not None else q.new_empty(0)
    # contiguous like the real kernel's outputs, whatever the inputs' strides (Inductor checks them)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), db


def _setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: Tensor) -> None:
    q, k, v, bias, mask, normalization, nonlinearity, eps = inputs
    ctx.save_for_backward(q, k, v, bias, mask)
    ctx.normalization, ctx.nonlinearity, ctx.eps = normalization, nonlinearity, eps  # type: ignore[attr-defined]


def _backward(ctx: torch.autograd.function.FunctionCtx, dy: Tensor) -> tuple[Tensor | None, ...]:
    q, k, v, bias, mask = ctx.saved_tensors  # type: ignore[attr-defined]
    bias_grad = bias is not None and ctx.needs_input_grad[3]  # type: ignore[attr-defined]
    dq, dk, dv, db = _fused_attention_backward(
        dy,
        q,
        k,
        v,
        bias,
        mask,
        ctx.normalization,
        ctx.nonlinearity,
        ctx.eps,
        bias_grad,  # type: ignore[attr-defined]
    )
    return dq, dk, dv, (db if bias_grad else None), None, None, None, None


_fused_attention.register_autograd(_backward, setup_context=_setup_context)


# ---------------------------------------------------------------------------------------------- public
def fused_hypernetwork_attention(
    q_BxHxQxE: Tensor,
    k_BxHxKxE: Tensor,
    v_BxHxKxD: Tensor,
    config: AttentionConfig,
    *,
    mask_Bx1xQxK: Tensor | None = None,
    bias: Tensor | None = None,
) -> Tensor:
    """``y_BxHxQxD`` of ``hyla.attention.functional.hypernetwork_attention``, fused (Triton).

    Args:
        q_BxHxQxE, k_BxHxKxE, v_BxHxKxD: queries, keys, values; one dtype (float32, bfloat16, float16),
            on CUDA (or CPU under ``TRITON_INTERPRET=1``); H <= 32, E, D <= 128.
        config: ``value_network="hyper"``, ``normalization`` ``"rms_head"`` or ``"none"``, any phi.
        mask_Bx1xQxK: bool, True where a query may attend to a key, broadcastable to ``Bx1xQxK`` (a causal
            ``1x1xQxK``, a key padding ``Bx1x1xK``, or both combined); key tiles masked for a whole query
            tile are skipped.
        bias: additive score bias (any float dtype) broadcastable to ``BxHxQxK``, e.g. ``1xHxQxK``
            relative positions; it gets a gradient when it requires one.

    Raises:
        ValueError: on malformed shapes or dtypes.
        FusedUnavailableError: when the case is outside the kernel (see ``fused_unsupported_reason``).
    """
    _check_shapes(q_BxHxQxE, k_BxHxKxE, v_BxHxKxD, mask_Bx1xQxK, bias)
    q, k, v = q_BxHxQxE, k_BxHxKxE, v_BxHxKxD
    reason = fused_unsupported_reason(config, q, k, v, mask_Bx1xQxK, bias)
    if reason is not None:
        raise FUSED.unavailable(reason)
    return launch_fused(q, k, v, config, mask_Bx1xQxK=mask_Bx1xQxK, bias=bias)


def launch_fused(
    q_BxHxQxE: Tensor,
    k_BxHxKxE: Tensor,
    v_BxHxKxD: Tensor,
    config: AttentionConfig,
    *,
    mask_Bx1xQxK: Tensor | None = None,
    bias: Tensor | None = None,
) -> Tensor:
    """``fused_hypernetwork_attention`` without its checks, for callers that made them already."""
    return _fused_attention(
        q_BxHxQxE,
        k_BxHxKxE,
        v_BxHxKxD,
        _to_4d(bias),
        _to_4d(mask_Bx1xQxK),
        config.normalization,
        config.nonlinearity,
        float(config.rms_eps),
    )


class Fused(Backend):
    """The Triton kernel: never materializes the hidden tensor (CUDA, or CPU under ``TRITON_INTERPRET=1``)."""

    name = "fused"

    def covers(self, call: AttentionCall) -> str | None:
        return (
            per_head_mask_reason(call.mask)
            or fused_unsupported_reason(call.config, *call.tensors)
            or dropout_unsupported_reason(self.name, call.dropout_keep_11xQxK)
        )

    def __call__(self, call: AttentionCall) -> Tensor:
        q, k, v = call.q_BxHxQxE, call.k_BxHxKxE, call.v_BxHxKxD
        _check_shapes(q, k, v, call.mask, call.bias)
        return launch_fused(q, k, v, call.config, mask_Bx1xQxK=call.mask, bias=call.bias)

    def unavailable(self, reason: str) -> Exception:
        return FusedUnavailableError(
            f"backend='fused' cannot run this case: {reason}. Use backend='auto' (falls back to the "
            "direct form), 'chunked' or 'direct'."
        )


FUSED = Fused()
