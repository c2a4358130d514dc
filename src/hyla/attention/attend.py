"""The one path from q, k, v to the attention heads: the backend ``hyla.attention.dispatch.choose`` picks, run
on the call. ``hyla.Attention`` and ``hyla.functional.attention`` both call it."""

from __future__ import annotations

from torch import Tensor

from hyla.attention.backend import AttentionCall
from hyla.attention.config import AttentionConfig
from hyla.attention.direct import DIRECT, DirectFormHooks
from hyla.attention.functional import visible_keys


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
    """The attention heads by the backend chosen for this call (``choose``), or by the direct form.

    Args:
        q_BxHxQxE: queries.
        k_BxHxKxE: keys.
        v_BxHxKxD: values.
        config: the variant.
        mask: bool, True where a query may attend to a key, broadcastable to ``B x H x Q x K`` (the kernels
            take masks shared over heads, ``B x 1 x Q x K``; one that varies over heads takes a backend that
            covers it).
        bias: additive score bias broadcastable to ``B x H x Q x K``.
        backend: one of ``hyla.attention.config.BACKENDS`` (canonical: the callers map former names once).
        w_mid_HxDxD: the extra generated layer of ``hyper_deep``.
        chunk_size: queries per block of the ``chunked`` backend.
        dropout: attention dropout's rate (applied where ``dropout_keep_11xQxK`` is given).
        dropout_keep_11xQxK: the pairs dropout keeps (``draw_keep_mask``), or None: no dropout.
        direct_form: take the direct form whatever the backend (for the latent code or hooks).
        hooks: the direct form's intermediates pass through these.

    Returns:
        ``(y_BxHxQxD, a_BxHxQxK)``; the latent code ``a`` only from the direct form, else None. With
        ``config.key_normalization="count"`` the heads are divided here, after whichever backend summed over keys
        (every backend computes the plain sums; the one sum over keys of each variant becomes a mean).
    """
    call = AttentionCall(
        q_BxHxQxE, k_BxHxKxE, v_BxHxKxD, config, mask, bias, w_mid_HxDxD, dropout, dropout_keep_11xQxK, chunk_size
    )
    if not direct_form and backend != "direct":
        # imported on first use: a model that only ever takes the direct form loads no kernel wrapper
        from hyla.attention.dispatch import choose

        chosen = choose(backend, call)
        if chosen is not DIRECT:
            return _key_normalized(chosen(call), call), None
    y, a = DIRECT.with_latent(call, hooks)
    return _key_normalized(y, call), a


def _key_normalized(y_BxHxQxD: Tensor, call: AttentionCall) -> Tensor:
    if call.config.key_normalization == "count":
        return y_BxHxQxD / visible_keys(call.mask, call.k_BxHxKxE.shape[-2], y_BxHxQxD.dtype)
    return y_BxHxQxD
