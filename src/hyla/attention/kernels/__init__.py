"""Fast paths for the hyper value networks, chosen by ``Attention(backend=...)``.

``dispatch`` returns the attention heads ``y_BxHxQxD`` or ``None`` when the caller should use the
direct form in :mod:`hyla.attention.functional`:

* ``reference``: the direct form, memory O(B * Q * K * D) (the hidden tensor is materialized);
* ``chunked``: :mod:`hyla.attention.kernels.chunked`, pure PyTorch, ``chunk_size`` queries at a time,
  memory O(B * chunk * K * D) in the forward and (checkpointed) the backward, on any device;
* ``fused``: :mod:`hyla.attention.kernels.op`, a Triton kernel (forward and backward) that never
  materializes the hidden tensor, registered as the custom op ``hyla::fused_attention`` (autograd,
  ``torch.compile``). It runs on CUDA, or on CPU tensors under ``TRITON_INTERPRET=1`` (slow: for tests).
  It covers ``value_network="hyper"`` with ``normalization`` ``rms_head`` or ``none`` (every phi),
  float32 / bfloat16 / float16, up to 32 heads and head dims up to 128, any bias broadcastable to
  ``BxHxQxK`` and any bool mask broadcastable to ``Bx1xQxK``. Asked for a case outside that
  (``hyla_softmax``, ``hyla_plus``, 64 heads, CPU without the interpreter, ...), it raises
  :class:`FusedUnavailableError` (a ``NotImplementedError``) naming the cause;
* ``auto``: ``fused`` on CUDA tensors when the case is covered; otherwise the reference, with a
  one-time warning per cause when the tensors are on CUDA (on CPU the reference is the expected path
  and nothing is said).
"""

from __future__ import annotations

import warnings

from torch import Tensor

from hyla.attention.config import AttentionConfig
from hyla.attention.kernels.chunked import chunked_hypernetwork_attention
from hyla.attention.kernels.op import (
    FusedUnavailableError,
    fused_hypernetwork_attention,
    fused_unsupported_reason,
)

BACKENDS: tuple[str, ...] = ("auto", "reference", "fused", "chunked")

__all__ = [
    "BACKENDS",
    "FusedUnavailableError",
    "chunked_hypernetwork_attention",
    "dispatch",
    "fused_hypernetwork_attention",
    "fused_unsupported_reason",
]

_WARNED: set[str] = set()


def _warn_once(reason: str) -> None:
    if reason not in _WARNED:
        _WARNED.add(reason)
        warnings.warn(
            f"hyla attention backend='auto': the fused kernel does not cover this case ({reason}); "
            "using the reference (direct) form",
            stacklevel=3,
        )


def dispatch(
    backend: str,
    q_BxHxQxE: Tensor,
    k_BxHxKxE: Tensor,
    v_BxHxKxD: Tensor,
    config: AttentionConfig,
    *,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    w_mid_HxDxD: Tensor | None = None,
    chunk_size: int = 256,
) -> Tensor | None:
    """``y_BxHxQxD`` from the chosen backend, or None: use the direct form.

    ``mask`` is bool broadcastable to ``Bx1xQxK`` (True = may attend), ``bias`` broadcastable to
    ``BxHxQxK``; ``w_mid_HxDxD`` is the extra generated layer of ``hyper_deep`` (not fused).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not valid; allowed values: {', '.join(BACKENDS)}")
    if backend == "reference":
        return None
    if backend == "chunked":
        return chunked_hypernetwork_attention(
            q_BxHxQxE,
            k_BxHxKxE,
            v_BxHxKxD,
            config,
            mask_Bx1xQxK=mask,
            bias=bias,
            w_mid_HxDxD=w_mid_HxDxD,
            chunk_size=chunk_size,
        )
    q, k, v = q_BxHxQxE, k_BxHxKxE, v_BxHxKxD
    if backend == "fused":
        return fused_hypernetwork_attention(q, k, v, config, mask_Bx1xQxK=mask, bias=bias)
    # auto
    if q.device.type != "cuda":
        return None
    reason = fused_unsupported_reason(q, k, v, config, mask_Bx1xQxK=mask, bias=bias)
    if reason is not None:
        _warn_once(reason)
        return None
    return fused_hypernetwork_attention(q, k, v, config, mask_Bx1xQxK=mask, bias=bias)
