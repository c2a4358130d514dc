"""Fast paths for the hyper value networks (fused Triton kernel, chunked reference).

``dispatch`` returns the attention heads ``y_BxHxQxD`` or ``None`` when the caller should use the
direct form in :mod:`hyla.attention.functional`.
"""

from __future__ import annotations

from torch import Tensor

from hyla.attention.config import AttentionConfig


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
) -> Tensor | None:
    if backend in ("auto", "reference"):
        return None
    raise NotImplementedError(f"backend={backend!r} is not available yet")
