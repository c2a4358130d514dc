"""Attention as a hypernetwork, direct (vectorized) form.

Shape letters: B batch, H heads, Q queries, K keys, E query/key head dim, D value head dim.
Masks are boolean with True where a query may attend to a key (``mask_and_bias`` turns a
``scaled_dot_product_attention``-style float mask into one). A query with no key to attend gets the empty
sum, 0, in every variant.

This is the readable, always-available implementation (``Attention(backend="direct")``): the kernels in
``hyla.attention.kernels`` are tested against it, and it is itself tested against the naive
per-(q, k) loop in ``hyla.attention.naive``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from hyla.attention.config import NONLINEARITIES, AttentionConfig

#: on a variant without softmax over keys, a float mask's entries at or below this (as rounded to the mask's
#: dtype) mean "not attended": added to the scores they would dominate RMSHead instead of removing the key
NOT_ATTENDED_AT_OR_BELOW = -1e4

_PHI: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "silu": F.silu,
    "gelu": F.gelu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "identity": lambda x: x,
}


def nonlinearity(name: str) -> Callable[[Tensor], Tensor]:
    """The value network's phi by name."""
    if name not in _PHI:
        raise ValueError(f"nonlinearity={name!r} is not valid; allowed values: {', '.join(NONLINEARITIES)}")
    return _PHI[name]


def attention_scores(q_BxHxQxE: Tensor, k_BxHxKxE: Tensor, bias: Tensor | None = None) -> Tensor:
    """Scaled dot-product scores ``(q / sqrt(E)).k`` plus an additive bias broadcastable to BxHxQxK.

    The query is scaled before the product, in the authors' order (flax's ``dot_product_attention``): one pass
    over the small query instead of one over the scores."""
    s_BxHxQxK = torch.einsum("bhqe,bhke->bhqk", q_BxHxQxE / math.sqrt(q_BxHxQxE.shape[-1]), k_BxHxKxE)
    if bias is not None:
        s_BxHxQxK = s_BxHxQxK + bias
    return s_BxHxQxK


def normalize_scores(
    s_BxHxQxK: Tensor, normalization: str, mask_Bx1xQxK: Tensor | None = None, rms_eps: float = 1e-6
) -> Tensor:
    """Turn scores into the latent code ``a_BxHxQxK``.

    ``softmax`` normalizes over keys (masked keys get weight 0; a query with no visible key gets an
    all-zero row instead of NaN). ``none`` and ``rms_head`` set masked pairs to 0 *before* normalizing;
    ``rms_head`` divides each (q, k) pair's vector of H scores by its RMS across heads.
    """
    if normalization == "softmax":
        if mask_Bx1xQxK is None:
            return torch.softmax(s_BxHxQxK, dim=-1)
        neg = torch.finfo(s_BxHxQxK.dtype).min
        a = torch.softmax(s_BxHxQxK.masked_fill(~mask_Bx1xQxK, neg), dim=-1)
        return a * mask_Bx1xQxK
    if mask_Bx1xQxK is not None:
        s_BxHxQxK = s_BxHxQxK * mask_Bx1xQxK
    if normalization == "none":
        return s_BxHxQxK
    if normalization == "rms_head":
        return s_BxHxQxK * torch.rsqrt(s_BxHxQxK.pow(2).mean(dim=1, keepdim=True) + rms_eps)
    raise ValueError(f"normalization={normalization!r} is not valid; allowed values: softmax, none, rms_head")


def visible_keys(mask_Bx1xQxK: Tensor | None, num_keys: int, dtype: torch.dtype) -> Tensor | float:
    """The number of keys each query sees (at least 1), broadcastable to ``B x H x Q x 1`` (``key_normalization``
    ``"count"`` divides the sum over keys by it)."""
    if mask_Bx1xQxK is None:
        return float(num_keys)
    return mask_Bx1xQxK.sum(dim=-1, keepdim=True).clamp(min=1).to(dtype)


def draw_keep_mask(
    num_queries: int, num_keys: int, p: float, device: torch.device, generator: torch.Generator | None = None
) -> Tensor:
    """A keep-mask of attention dropout, bool ``1 x 1 x Q x K`` (True = kept with probability ``1 - p``), one for
    the whole batch and every head, drawn from ``generator`` (default: torch's default generator of ``device``).
    A caller that must choose the masks (a stack of runs, each drawing from its own generator) passes them to
    ``Attention.forward(dropout_keep=...)`` instead."""
    shape = (1, 1, num_queries, num_keys)
    # generator=None selects torch.rand's generator overload, which torch.compile cannot trace with a
    # symbolic size (the query count differs between layers): pass a generator only when there is one
    uniform = (
        torch.rand(shape, device=device) if generator is None else torch.rand(shape, device=device, generator=generator)
    )
    return uniform >= p


def drop_pairs(a_BxHxQxK: Tensor, p: float, keep_11xQxK: Tensor | None = None) -> Tensor:
    """Attention dropout on the latent code: kept pairs scaled by ``1 / (1 - p)``, the others zero;
    ``keep_11xQxK`` drawn by ``draw_keep_mask`` unless given.

    One multiplier ``keep / (1 - p)`` in the code's dtype, as the authors' code (flax) makes it: one pass over
    the code instead of two."""
    if keep_11xQxK is None:
        keep_11xQxK = draw_keep_mask(*a_BxHxQxK.shape[-2:], p, a_BxHxQxK.device)
    return a_BxHxQxK * (keep_11xQxK.to(a_BxHxQxK.dtype) / (1 - p))


def value_network(
    a_BxHxQxK: Tensor,
    v_BxHxKxD: Tensor,
    value_network: str,
    phi: str = "relu",
    w_mid_HxDxD: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Apply the generated value network; returns ``(y_BxHxQxD, hidden_BxQxKxD or None)``.

    * ``linear``: ``y[h,q] = sum_k a[h,q,k] v[h,k]`` (standard MHA before the output projection).
    * ``hyper``: ``hidden[q,k] = phi(sum_h a[h,q,k] v[h,k])``, ``y[h,q] = sum_k a[h,q,k] hidden[q,k]``.
    * ``hyper_deep`` (HYLA+): an extra generated layer between the two,
      ``hidden2[q,k] = phi(sum_h a[h,q,k] W_mid[h] hidden[q,k])``.

    The returned hidden tensor is the last hidden layer of the value network (B x Q x K x D); it is
    what makes the direct form's memory grow as B*T*T*D.
    """
    if value_network == "linear":
        return torch.einsum("bhqk,bhkd->bhqd", a_BxHxQxK, v_BxHxKxD), None
    act = nonlinearity(phi)
    hidden_BxQxKxD = act(torch.einsum("bhqk,bhkd->bqkd", a_BxHxQxK, v_BxHxKxD))
    if value_network == "hyper_deep":
        if w_mid_HxDxD is None:
            raise ValueError("value_network='hyper_deep' needs w_mid_HxDxD (the extra generated layer)")
        mixed_BxQxKxHxD = torch.einsum("bqkd,hed->bqkhe", hidden_BxQxKxD, w_mid_HxDxD)
        hidden_BxQxKxD = act(torch.einsum("bhqk,bqkhe->bqke", a_BxHxQxK, mixed_BxQxKxHxD))
    elif value_network != "hyper":
        raise ValueError(f"value_network={value_network!r} is not valid; allowed values: linear, hyper, hyper_deep")
    return torch.einsum("bhqk,bqkd->bhqd", a_BxHxQxK, hidden_BxQxKxD), hidden_BxQxKxD


def hypernetwork_attention(
    q_BxHxQxE: Tensor,
    k_BxHxKxE: Tensor,
    v_BxHxKxD: Tensor,
    config: AttentionConfig,
    *,
    mask_Bx1xQxK: Tensor | None = None,
    bias: Tensor | None = None,
    w_mid_HxDxD: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Direct form of every attention variant: returns ``(y_BxHxQxD, a_BxHxQxK)``, the sums over keys as they are
    (``config.key_normalization`` is applied by ``hyla.attention.attend.attend``, after any backend)."""
    s = attention_scores(q_BxHxQxE, k_BxHxKxE, bias)
    a = normalize_scores(s, config.normalization, mask_Bx1xQxK, config.rms_eps)
    y, _ = value_network(a, v_BxHxKxD, config.value_network, config.nonlinearity, w_mid_HxDxD)
    return y, a


def causal_mask(num_queries: int, num_keys: int, device: torch.device | str | None = None, q_offset: int = 0) -> Tensor:
    """Bool ``1 x 1 x Q x K``, True where key ``j <= q_offset + i`` for query ``i``: query ``i`` sits at position
    ``q_offset + i`` of the keys; ``q_offset=0`` is ``scaled_dot_product_attention``'s ``is_causal`` (top-left)."""
    q_pos = torch.arange(q_offset, q_offset + num_queries, device=device)
    return (torch.arange(num_keys, device=device)[None, :] <= q_pos[:, None])[None, None]


def _broadcasts_to(shape: torch.Size, target: tuple[int, ...]) -> bool:
    try:
        return len(shape) <= len(target) and torch.broadcast_shapes(shape, target) == torch.Size(target)
    except RuntimeError:
        return False


def mask_and_bias(
    attn_mask: Tensor,
    normalization: str,
    shape_BxHxQxK: tuple[int, int, int, int],
    dtype: torch.dtype,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """What a ``scaled_dot_product_attention``-style ``attn_mask`` means here: ``(mask, bias)``, a bool mask
    (True = may attend) and the additive score bias ``bias`` with the mask's own bias added (in ``dtype``), or
    None when neither holds one, both broadcastable to ``shape_BxHxQxK``.

    A bool ``attn_mask`` is the mask. A float one is added to the scores, as SDPA adds it, except that an entry
    that must remove its key does so exactly: ``-inf`` for every variant (so a query whose keys are all
    ``-inf`` gets 0, as with a bool mask, not softmax's NaN), and, without softmax over keys (``none``,
    ``rms_head``), any entry at or below ``NOT_ATTENDED_AT_OR_BELOW``, since there a large negative score
    dominates the normalization instead of vanishing. Such a variant cannot read a finite nonzero entry as a
    mask, so a float mask with one is refused (pass additive biases as a bias instead). The values are looked at
    once (on CUDA a host sync): where that matters, pass a bool mask.

    Args:
        attn_mask: bool or float, broadcastable to ``shape_BxHxQxK``.
        normalization: the variant's normalization (``softmax``, ``none``, ``rms_head``).
        shape_BxHxQxK: the scores' shape.
        dtype: the scores' dtype, which the bias takes.
        bias: a score bias the caller already has, or None.

    Returns:
        The bool mask and the bias (None when the mask holds no bias).

    Raises:
        ValueError: a mask of another dtype or shape, or finite nonzero entries without softmax.
    """
    if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
        raise ValueError(
            f"attn_mask must be bool (True = attend) or float (added to the scores), got dtype {attn_mask.dtype}"
        )
    if not _broadcasts_to(attn_mask.shape, shape_BxHxQxK):
        raise ValueError(
            f"attn_mask must broadcast to (batch, heads, queries, keys) = {tuple(shape_BxHxQxK)}, "
            f"got {tuple(attn_mask.shape)}"
        )
    if attn_mask.dtype == torch.bool:
        return attn_mask, bias
    if normalization == "softmax":
        not_attended = torch.isneginf(attn_mask)
    else:  # the limit in the mask's own dtype: -1e4 in bfloat16 is -9984
        not_attended = attn_mask <= torch.tensor(NOT_ATTENDED_AT_OR_BELOW, dtype=attn_mask.dtype).item()
    # one look at the values (a host sync on CUDA): a mask of only 0 and "not attended" holds no bias, which
    # spares a pass over the scores and lets the C kernel take a mask that varies over the batch; softmax keeps
    # a mask that asks for its gradient (SDPA gives one) as a bias
    wants_grad = normalization == "softmax" and attn_mask.requires_grad
    if not wants_grad and bool((not_attended | (attn_mask == 0)).all()):
        return ~not_attended, bias
    if normalization == "softmax":
        mask_bias = attn_mask.masked_fill(not_attended, 0.0).to(dtype)
        return ~not_attended, mask_bias if bias is None else bias + mask_bias
    raise ValueError(
        f"attn_mask: normalization={normalization!r} has no softmax over keys, so a float mask must hold only 0 "
        f"(attend) and values <= {NOT_ATTENDED_AT_OR_BELOW:g} or -inf (not attended); pass score biases as bias"
    )
