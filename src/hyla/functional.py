"""``hyla.functional.attention``: every attention variant of the paper as one call, with the shapes and
conventions of ``torch.nn.functional.scaled_dot_product_attention``.

Example::

    y_BxHxQxD = hyla.functional.attention(q_BxHxQxE, k_BxHxKxE, v_BxHxKxD, is_causal=True, attention="hyla")

It takes the queries, keys and values after their projections (``hyla.Attention`` is the module with the
projections, and computes its heads by the same path: ``hyla.attention.functional.attend``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from hyla.attention import functional as fn
from hyla.attention.attend import attend
from hyla.attention.config import AttentionConfig, attention_preset, canonical_backend

__all__ = ["attention"]


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None = None,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    attention: str | AttentionConfig = "hyla",
    dropout_p: float = 0.0,
    training: bool = False,
    bias: Tensor | None = None,
    w_mid_HxDxD: Tensor | None = None,
    backend: str = "auto",
    chunk_size: int = 256,
) -> Tensor:
    """Multi-head attention of any variant on projected heads: ``B x H x Q x E``, ``B x H x K x E`` and
    ``B x H x K x D`` in, ``B x H x Q x D`` out, the heads before the output projection.

    With ``attention="softmax"`` it computes what ``scaled_dot_product_attention`` computes. The fastest
    backend that covers the case runs (``backend="auto"``, as ``hyla.Attention``'s; see the backends page),
    the direct form where none does.

    Masks: a bool ``attn_mask`` is True where a query may attend to a key; a float one is added to the
    scores, except that ``-inf`` removes its key exactly and, for a variant without softmax over keys
    (``linear``, ``hyla``, ...: adding a large negative number there would dominate the normalization, not
    remove the key), every entry at or below -1e4 does; such a variant refuses a float mask with other
    nonzero entries (``ValueError``: pass biases as ``bias``). A query with no key to attend gets 0 (the empty
    sum, in every variant and backend; SDPA in PyTorch 2.13 also gives 0, older releases NaN).

    Args:
        q: queries ``B x H x Q x E``, a floating dtype.
        k: keys ``B x H x K x E``, q's dtype and device.
        v: values ``B x H x K x D``, q's dtype and device.
        attn_mask: bool (True = attend) or float (added to the scores), broadcastable to ``B x H x Q x K``.
        is_causal: mask key ``j`` for query ``i`` where ``j > i`` (top-left aligned, as SDPA's); not with
            ``attn_mask`` (fold causality into it instead).
        scale: the scores' factor, default ``1 / sqrt(E)`` (every preset's, and SDPA's).
        attention: a preset name (``hyla.PRESETS``) or an ``AttentionConfig``.
        dropout_p: attention dropout's rate in ``[0, 1)``: while ``training``, (q, k) pairs of the latent
            code are dropped (one ``Q x K`` mask shared over batch and heads, as ``hyla.Attention`` drops them).
        training: apply ``dropout_p`` (default False: a call outside training never drops).
        bias: additive score bias (float) broadcastable to ``B x H x Q x K``, for every variant (e.g. a
            relative-position bias).
        w_mid_HxDxD: the extra generated layer of a ``hyper_deep`` variant (``hyla_plus``), ``H x D x D``;
            required there and only there.
        backend: ``auto`` | ``direct`` | ``manual_backward`` | ``fused_cpu`` | ``fused`` | ``chunked``, as
            ``hyla.Attention``'s.
        chunk_size: queries per block of ``backend="chunked"``.

    Returns:
        The attention heads ``B x H x Q x D`` in q's dtype.

    Raises:
        ValueError: an argument of the wrong kind, shape or value (the message names it).
    """
    config = _config(attention)
    backend = canonical_backend(backend)
    shape = _check_qkv(q, k, v)
    _, h, nq, nk = shape
    if not isinstance(is_causal, bool):
        raise ValueError(f"is_causal must be True or False, got {is_causal!r}")
    if is_causal and attn_mask is not None:
        raise ValueError("is_causal=True cannot be combined with attn_mask (as in SDPA): fold causality into attn_mask")
    if scale is not None and not (_is_number(scale) and math.isfinite(scale)):
        raise ValueError(f"scale must be a finite number or None (1 / sqrt(E)), got {scale!r}")
    if not (_is_number(dropout_p) and 0 <= dropout_p < 1):
        raise ValueError(f"dropout_p must be a number in [0, 1), got {dropout_p!r}")
    if not isinstance(training, bool):
        raise ValueError(f"training must be True or False, got {training!r}")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    _check_w_mid(w_mid_HxDxD, config, h, v.shape[3])
    for name, t in (("attn_mask", attn_mask), ("bias", bias)):
        if t is not None and (not isinstance(t, Tensor) or t.device != q.device):
            raise ValueError(f"{name} must be a tensor on q's device {q.device}, got {_describe(t)}")

    if bias is not None:
        bias = _checked_bias(bias, shape, q.dtype)
    mask = fn.causal_mask(nq, nk, q.device) if is_causal else None
    if attn_mask is not None:
        mask, bias = fn.mask_and_bias(attn_mask, config.normalization, shape, q.dtype, bias)
    if scale is not None:
        # every backend scales by 1 / sqrt(E) itself: folded into q, the default keeps their exact arithmetic
        factor = scale * math.sqrt(q.shape[3])
        q = q if factor == 1.0 else q * factor
    drops = training and dropout_p > 0
    keep = fn.draw_keep_mask(nq, nk, dropout_p, q.device) if drops else None
    y, _ = attend(
        q,
        k,
        v,
        config,
        mask=mask,
        bias=bias,
        backend=backend,
        w_mid_HxDxD=w_mid_HxDxD,
        chunk_size=chunk_size,
        dropout=dropout_p if drops else 0.0,
        dropout_keep_11xQxK=keep,
    )
    return y


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _config(attention: object) -> AttentionConfig:
    if isinstance(attention, AttentionConfig):
        return attention
    if not isinstance(attention, str):
        raise ValueError(f"attention must be a preset name or an AttentionConfig, got {_describe(attention)}")
    return attention_preset(attention)


def _describe(value: object) -> str:
    if isinstance(value, Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)} on {value.device}"
    return f"{type(value).__name__} {value!r}"


def _check_qkv(q: Tensor, k: Tensor, v: Tensor) -> tuple[int, int, int, int]:
    """``(B, H, Q, K)`` of well-formed q, k, v; else ValueError naming the argument."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor (batch, heads, tokens, head dim), got {_describe(t)}")
    if not q.is_floating_point():
        raise ValueError(f"q must have a floating dtype, got {q.dtype}")
    b, h, nq, e = q.shape
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"{name} must have q's dtype {q.dtype} and device {q.device}, got {_describe(t)}")
    if k.shape[:2] != (b, h) or k.shape[3] != e:
        raise ValueError(f"k must have shape (batch={b}, heads={h}, keys, E={e}), got {tuple(k.shape)}")
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(f"v must have shape (batch={b}, heads={h}, keys={k.shape[2]}, D), got {tuple(v.shape)}")
    return b, h, nq, k.shape[2]


def _check_w_mid(w_mid_HxDxD: Tensor | None, config: AttentionConfig, heads: int, head_dim_v: int) -> None:
    if config.value_network != "hyper_deep":
        if w_mid_HxDxD is not None:
            raise ValueError(f"w_mid_HxDxD is for value_network='hyper_deep' only, not {config.value_network!r}")
        return
    if not isinstance(w_mid_HxDxD, Tensor) or tuple(w_mid_HxDxD.shape) != (heads, head_dim_v, head_dim_v):
        raise ValueError(
            f"w_mid_HxDxD must be a tensor of shape (heads={heads}, D={head_dim_v}, D={head_dim_v}) for "
            f"value_network='hyper_deep', got {_describe(w_mid_HxDxD)}"
        )


def _checked_bias(bias: Tensor, shape: tuple[int, int, int, int], dtype: torch.dtype) -> Tensor:
    if not bias.is_floating_point() or bias.dim() > 4:
        raise ValueError(f"bias must be a float tensor broadcastable to {shape}, got {_describe(bias)}")
    try:
        fits = torch.broadcast_shapes(bias.shape, shape) == torch.Size(shape)
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(f"bias must broadcast to (batch, heads, queries, keys) = {shape}, got {tuple(bias.shape)}")
    return bias.to(dtype)
