"""The direct form as a backend: the vectorized arithmetic of ``hyla.attention.functional``, every variant,
device and dtype, and the only one that returns the latent code and passes the hook points."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from torch import Tensor

from hyla.attention.backend import AttentionCall, Backend
from hyla.attention.functional import attention_scores, drop_pairs, normalize_scores, value_network


class DirectFormHooks(NamedTuple):
    """What the direct form passes its intermediates through (``Attention``'s hook points): each returns the
    tensor to go on with, except ``hidden``'s, which is read only."""

    scores: Callable[[Tensor], Tensor]
    latent: Callable[[Tensor], Tensor]
    hidden: Callable[[Tensor], object]


class Direct(Backend):
    """Memory O(B * Q * K * D): the hidden tensor is materialized."""

    name = "direct"

    def covers(self, call: AttentionCall) -> str | None:
        return None

    def __call__(self, call: AttentionCall) -> Tensor:
        return self.with_latent(call)[0]

    def with_latent(self, call: AttentionCall, hooks: DirectFormHooks | None = None) -> tuple[Tensor, Tensor]:
        """``(y_BxHxQxD, a_BxHxQxK)``: the heads and the latent code, the intermediates through ``hooks``."""
        s = attention_scores(call.q_BxHxQxE, call.k_BxHxKxE, call.bias)
        if hooks is not None:
            s = hooks.scores(s)
        config = call.config
        a = normalize_scores(s, config.normalization, call.mask, config.rms_eps)
        if hooks is not None:
            a = hooks.latent(a)
        keep = call.dropout_keep_11xQxK
        a_used = a if keep is None else drop_pairs(a, call.dropout, keep)
        y, hidden = value_network(a_used, call.v_BxHxKxD, config.value_network, config.nonlinearity, call.w_mid_HxDxD)
        if hidden is not None and hooks is not None:
            hooks.hidden(hidden)
        return y, a


DIRECT = Direct()
