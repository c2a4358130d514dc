"""The one path from q, k, v to the attention heads: the backend ``hyla.attention.dispatch`` chooses, else the
direct form of ``hyla.attention.functional``. ``hyla.Attention`` and ``hyla.functional.attention`` both call it."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from torch import Tensor

from hyla.attention.config import AttentionConfig
from hyla.attention.functional import attention_scores, drop_pairs, normalize_scores, value_network


class DirectFormHooks(NamedTuple):
    """What the direct form passes its intermediates through (``Attention``'s hook points): each returns the
    tensor to go on with, except ``hidden``'s, which is read only."""

    scores: Callable[[Tensor], Tensor]
    latent: Callable[[Tensor], Tensor]
    hidden: Callable[[Tensor], object]


def attend(
    q_BxHxQxE: Tensor,
    k_BxHxKxE: Tensor,
    v_BxHxKxD: Tensor,
    config: AttentionConfig,
    *,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    backend: str = "auto",
    w_mid_HxDxD: Tensor | None = None,
    chunk_size: int = 256,
    dropout: float = 0.0,
    dropout_keep_11xQxK: Tensor | None = None,
    direct_form: bool = False,
    hooks: DirectFormHooks | None = None,
) -> tuple[Tensor, Tensor | None]:
    """The attention heads by the backend that ``hyla.attention.dispatch.dispatch`` chooses, else by the
    direct form: the one path of ``Attention`` and ``hyla.functional.attention``.

    Args:
        q_BxHxQxE: queries.
        k_BxHxKxE: keys.
        v_BxHxKxD: values.
        config: the variant.
        mask: bool, True where a query may attend to a key, broadcastable to ``B x H x Q x K`` (the kernels
            take masks shared over heads, ``B x 1 x Q x K``; one that varies over heads takes a backend that
            covers it).
        bias: additive score bias broadcastable to ``B x H x Q x K``.
        backend: one of ``hyla.attention.config.BACKENDS``.
        w_mid_HxDxD: the extra generated layer of ``hyper_deep``.
        chunk_size: queries per block of the ``chunked`` backend.
        dropout: attention dropout's rate (applied where ``dropout_keep_11xQxK`` is given).
        dropout_keep_11xQxK: the pairs dropout keeps (``dropout_keep_mask``), or None: no dropout.
        direct_form: take the direct form whatever the backend (for the latent code or hooks).
        hooks: the direct form's intermediates pass through these.

    Returns:
        ``(y_BxHxQxD, a_BxHxQxK)``; the latent code ``a`` only from the direct form, else None.
    """
    if not direct_form and backend != "direct":
        # imported on first use: a model that never dispatches does not load the kernels' wrappers
        from hyla.attention.dispatch import dispatch

        y = dispatch(
            backend,
            q_BxHxQxE,
            k_BxHxKxE,
            v_BxHxKxD,
            config,
            mask=mask,
            bias=bias,
            w_mid_HxDxD=w_mid_HxDxD,
            chunk_size=chunk_size,
            dropout_keep_11xQxK=dropout_keep_11xQxK,
            dropout=dropout,
        )
        if y is not None:
            return y, None
    s = attention_scores(q_BxHxQxE, k_BxHxKxE, bias)
    if hooks is not None:
        s = hooks.scores(s)
    a = normalize_scores(s, config.normalization, mask, config.rms_eps)
    if hooks is not None:
        a = hooks.latent(a)
    a_used = drop_pairs(a, dropout, dropout_keep_11xQxK) if dropout_keep_11xQxK is not None else a
    y, hidden = value_network(a_used, v_BxHxKxD, config.value_network, config.nonlinearity, w_mid_HxDxD)
    if hidden is not None and hooks is not None:
        hooks.hidden(hidden)
    return y, a
