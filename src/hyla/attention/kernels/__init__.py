"""Fast paths for the hyper value networks.

``dispatch`` returns the attention heads ``y_BxHxQxD`` or ``None`` when the caller should use the
direct form in :mod:`hyla.attention.functional`:

* ``reference`` (and ``auto`` for now): the direct form, memory O(B * Q * K * D);
* ``chunked``: :mod:`hyla.attention.kernels.chunked`, blocks of queries, memory O(B * chunk * K * D)
  in the forward and the backward, for long sequences on any device;
* ``fused``: a Triton kernel that never materializes the hidden tensor, not written yet.
"""

from __future__ import annotations

from torch import Tensor

from hyla.attention.config import AttentionConfig
from hyla.attention.kernels.chunked import chunked_hypernetwork_attention


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
    if backend in ("auto", "reference"):
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
    raise NotImplementedError(
        "backend='fused' (the Triton HYLA kernel) is not implemented yet; use backend='chunked' for bounded "
        "memory or backend='reference'"
    )
