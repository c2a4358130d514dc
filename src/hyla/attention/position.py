"""Position information for attention: T5 relative-position score bias and rotary embeddings."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def relative_position_bucket(
    relative_position_QxK: Tensor, bidirectional: bool, num_buckets: int, max_distance: int
) -> Tensor:
    """T5 bucketing of ``key_pos - query_pos``: exact for small distances, log-spaced up to
    ``max_distance``, everything beyond shares the last bucket. Bidirectional halves the buckets
    between keys before and after the query; unidirectional maps keys after the query to bucket 0."""
    n = -relative_position_QxK
    bucket = torch.zeros_like(n)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (n < 0).long() * num_buckets
        n = n.abs()
    else:
        n = n.clamp(min=0)
    max_exact = max(num_buckets // 2, 1)
    is_small = n < max_exact
    # log-spaced buckets for the far distances (T5); clamp(min=1) only guards log(0) on the small branch
    ratio = max(max_distance / max_exact, 1.0 + 1e-6)
    large = (
        max_exact + (torch.log(n.clamp(min=1).float() / max_exact) / math.log(ratio) * (num_buckets - max_exact)).long()
    )
    large = large.clamp(max=num_buckets - 1)
    return bucket + torch.where(is_small, n, large)


class RelativePositionBias(nn.Module):
    """Learned per-head additive score bias indexed by T5 relative-position buckets.

    Returns ``bias_HxQxK`` for a query block at positions ``q_offset .. q_offset+Q-1`` against keys at
    ``0 .. K-1`` (the offset serves incremental decoding).
    """

    def __init__(self, num_heads: int, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = True):
        super().__init__()
        if num_buckets < 2:
            raise ValueError(f"num_buckets must be >= 2, got {num_buckets}")
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.bidirectional = bidirectional
        self.embedding_HxN = nn.Parameter(torch.randn(num_heads, num_buckets) * num_buckets**-0.5)

    def forward(self, num_queries: int, num_keys: int, q_offset: int = 0) -> Tensor:
        device = self.embedding_HxN.device
        q_pos = torch.arange(q_offset, q_offset + num_queries, device=device)
        k_pos = torch.arange(num_keys, device=device)
        buckets_QxK = relative_position_bucket(
            k_pos[None, :] - q_pos[:, None], self.bidirectional, self.num_buckets, self.max_distance
        )
        return self.embedding_HxN[:, buckets_QxK]


def rope_angles(
    positions_T: Tensor, head_dim: int, base: float = 10000.0, dtype: torch.dtype = torch.float32
) -> tuple[Tensor, Tensor]:
    """Cosines and sines (T x head_dim/2) of the rotary embedding, computed in ``dtype`` (>= fp32)."""
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even query/key head dim, got {head_dim}")
    dtype = torch.float64 if dtype == torch.float64 else torch.float32
    inv_freq = base ** (-torch.arange(0, head_dim, 2, device=positions_T.device, dtype=dtype) / head_dim)
    angles_TxE2 = positions_T.to(dtype)[:, None] * inv_freq[None, :]
    return angles_TxE2.cos(), angles_TxE2.sin()


def apply_rope(x_BxHxTxE: Tensor, cos_TxE2: Tensor, sin_TxE2: Tensor) -> Tensor:
    """Rotate consecutive feature pairs (half-split convention) by position-dependent angles."""
    x1, x2 = x_BxHxTxE.chunk(2, dim=-1)
    cos, sin = cos_TxE2.to(x_BxHxTxE.dtype), sin_TxE2.to(x_BxHxTxE.dtype)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
