"""Chunked direct form: blocks of queries at a time, memory O(B * chunk * K * D) instead of O(B * Q * K * D).

Exact for every variant: softmax normalizes over keys and RMSHead across heads, both per query row,
so a block of queries needs nothing from the others. With gradients enabled each block runs under
``torch.utils.checkpoint``, so the backward recomputes the block instead of keeping its hidden tensor:
the backward's memory is bounded by one block too.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from hyla.attention.backend import AttentionCall, Backend
from hyla.attention.config import AttentionConfig
from hyla.attention.functional import hypernetwork_attention
from hyla.attention.kernels.coverage import dropout_unsupported_reason, variant_unsupported_reason


def _rows(t: Tensor | None, start: int, stop: int) -> Tensor | None:
    """Slice the query dimension (-2) of a tensor broadcastable to B x H x Q x K."""
    if t is None or t.shape[-2] == 1:
        return t
    return t[..., start:stop, :]


def chunked_hypernetwork_attention(
    q_BxHxQxE: Tensor,
    k_BxHxKxE: Tensor,
    v_BxHxKxD: Tensor,
    config: AttentionConfig,
    *,
    mask_Bx1xQxK: Tensor | None = None,
    bias: Tensor | None = None,
    w_mid_HxDxD: Tensor | None = None,
    chunk_size: int = 256,
) -> Tensor:
    """``y_BxHxQxD`` of ``hypernetwork_attention``, block by block.

    ``chunk_size`` queries at a time (>= 1, else ValueError).
    ``mask_Bx1xQxK`` (bool, True = may attend) and ``bias`` (broadcastable to ``BxHxQxK``) are sliced per
    block of queries when they have a query dimension; ``w_mid_HxDxD`` is ``hyper_deep``'s extra layer.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    num_queries = q_BxHxQxE.shape[2]
    grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q_BxHxQxE, k_BxHxKxE, v_BxHxKxD, bias, w_mid_HxDxD)
    )

    def block(q: Tensor, mask: Tensor | None, b: Tensor | None) -> Tensor:
        y, _ = hypernetwork_attention(
            q, k_BxHxKxE, v_BxHxKxD, config, mask_Bx1xQxK=mask, bias=b, w_mid_HxDxD=w_mid_HxDxD
        )
        return y

    outs = []
    for start in range(0, num_queries, chunk_size):
        stop = min(start + chunk_size, num_queries)
        args = (q_BxHxQxE[:, :, start:stop], _rows(mask_Bx1xQxK, start, stop), _rows(bias, start, stop))
        outs.append(checkpoint(block, *args, use_reentrant=False) if grad else block(*args))
    return torch.cat(outs, dim=2)


class Chunked(Backend):
    """Memory O(B * chunk * K * D) in the forward and (checkpointed) the backward, on any device."""

    name = "chunked"

    def covers(self, call: AttentionCall) -> str | None:
        return variant_unsupported_reason(self.name, call.config) or dropout_unsupported_reason(
            self.name, call.dropout_keep_11xQxK
        )

    def __call__(self, call: AttentionCall) -> Tensor:
        return chunked_hypernetwork_attention(
            call.q_BxHxQxE,
            call.k_BxHxKxE,
            call.v_BxHxKxD,
            call.config,
            mask_Bx1xQxK=call.mask,
            bias=call.bias,
            w_mid_HxDxD=call.w_mid_HxDxD,
            chunk_size=call.chunk_size,
        )


CHUNKED = Chunked()
