"""The hypernetwork view of attention: the value network that each (query, key) pair's latent code generates,
materialized from an ``Attention``'s weights (small inputs only: memory B*Q*K*O*I)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor, nn

from hyla.attention import functional as fn
from hyla.attention.config import AttentionConfig


class AttentionWeights(Protocol):
    """What the view reads of a ``hyla.Attention`` (named here so that this module need not import it)."""

    config: AttentionConfig
    num_heads: int
    head_dim_v: int
    kv_dim: int
    out_dim: int
    v_proj: nn.Linear
    out_proj: nn.Linear
    w_mid_HxDxD: nn.Parameter | None


@dataclass
class GeneratedValueNetwork:
    """The key-query specific value network that the latent code generates, materialized.

    ``layers[i] = (weight_BxQxKxOxI, bias_BxQxKxO or None)``; ``phi`` follows every layer but the
    last. For ``linear`` there is one layer ``W[q,k] = sum_h a[h,q,k] W_out[h] @ W_val[h]``; for
    ``hyper`` two (``sum_h a_h W_val[h]`` then ``sum_h a_h W_out[h]``); ``hyper_deep`` has three.
    ``out_bias_O`` is the output projection's bias, added once per query.
    """

    layers: list[tuple[Tensor, Tensor | None]]
    phi: str
    out_bias_O: Tensor | None

    def __call__(self, context_BxKxC: Tensor) -> Tensor:
        """``out[q] = sum_k net_{q,k}(x_k) + out_bias``, computed from the materialized weights."""
        act = fn.nonlinearity(self.phi)
        h_BxQxKxI = context_BxKxC[:, None, :, :].expand(-1, self.layers[0][0].shape[1], -1, -1)
        for i, (w_BxQxKxOxI, b_BxQxKxO) in enumerate(self.layers):
            h_BxQxKxI = torch.einsum("bqkoi,bqki->bqko", w_BxQxKxOxI, h_BxQxKxI)
            if b_BxQxKxO is not None:
                h_BxQxKxI = h_BxQxKxI + b_BxQxKxO
            if i < len(self.layers) - 1:
                h_BxQxKxI = act(h_BxQxKxI)
        out_BxQxO = h_BxQxKxI.sum(dim=2)
        return out_BxQxO if self.out_bias_O is None else out_BxQxO + self.out_bias_O


def generated_value_network(
    attention: AttentionWeights, a: Tensor, key_counts: Tensor | float | None = None
) -> GeneratedValueNetwork:
    """The value network ``W[q,k]`` that the latent code ``a_BxHxQxK`` generates from ``attention``'s weights.

    ``key_counts`` (``key_normalization="count"``): the keys each query sees, broadcastable to ``B x H x Q x 1``;
    the sum over keys is a mean, so the last generated layer is generated from ``a / key_counts``."""
    h, dv = attention.num_heads, attention.head_dim_v
    w_val_HxDxC = attention.v_proj.weight.view(h, dv, attention.kv_dim)
    b_val_HxD = attention.v_proj.bias.view(h, dv) if attention.v_proj.bias is not None else None
    w_out_HxOxD = attention.out_proj.weight.view(attention.out_dim, h, dv).permute(1, 0, 2)
    out_bias = attention.out_proj.bias

    a_last = a if key_counts is None else a / key_counts

    def generate(w_HxOxI: Tensor, code: Tensor = a) -> Tensor:
        return torch.einsum("bhqk,hoi->bqkoi", code, w_HxOxI)

    def generate_bias(b_HxO: Tensor | None, code: Tensor = a) -> Tensor | None:
        return None if b_HxO is None else torch.einsum("bhqk,ho->bqko", code, b_HxO)

    if attention.config.value_network == "linear":
        w_HxOxC = torch.einsum("hod,hdc->hoc", w_out_HxOxD, w_val_HxDxC)
        b_HxO = None if b_val_HxD is None else torch.einsum("hod,hd->ho", w_out_HxOxD, b_val_HxD)
        layers = [(generate(w_HxOxC, a_last), generate_bias(b_HxO, a_last))]
    else:
        layers = [(generate(w_val_HxDxC), generate_bias(b_val_HxD))]
        if attention.w_mid_HxDxD is not None:
            layers.append((generate(attention.w_mid_HxDxD), None))
        layers.append((generate(w_out_HxOxD, a_last), None))
    return GeneratedValueNetwork(layers, attention.config.nonlinearity, out_bias)
