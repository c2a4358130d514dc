"""HYLA (or any preset) as a HuggingFace ``transformers`` attention implementation.

    import hyla.integrations.huggingface as hyla_hf
    hyla_hf.register()                                  # attn_implementation="hyla"
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="hyla")

The model keeps its own projections, positions and cache; only the attention over the projected heads is
``hyla.functional.attention``. Needs the ``huggingface`` extra (``pip install 'hyla[huggingface]'``).
"""

from __future__ import annotations

import functools
from typing import Any

from torch import Tensor, nn

from hyla.attention.config import AttentionConfig
from hyla.attention.functional import causal_mask


def repeat_heads(x_BxGxTxE: Tensor, groups: int) -> Tensor:
    """Grouped-query heads ``B x G x T x E`` repeated to ``B x (G groups) x T x E``: HYLA normalizes the latent
    code across all heads, so each query head needs its own copy of its group's keys and values."""
    return x_BxGxTxE if groups == 1 else x_BxGxTxE.repeat_interleave(groups, dim=1)


def hyla_attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    *,
    attention: str | AttentionConfig = "hyla",
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """The ``AttentionInterface`` function: ``B x H x Q x E`` queries, ``B x G x K x E`` keys and values, a bool
    mask (True = attend) or None (then causal if the module is) -> ``B x Q x H x D`` and no weights."""
    from hyla.functional import attention as hyla_attention

    groups = getattr(module, "num_key_value_groups", 1)
    key, value = repeat_heads(key, groups), repeat_heads(value, groups)
    if attention_mask is not None:  # as transformers' own implementations: a cache may be longer than its keys
        attention_mask = attention_mask[..., : key.shape[2]]
    elif kwargs.get("is_causal", getattr(module, "is_causal", False)):
        # transformers leaves out a purely causal mask (SDPA's shortcut); its queries are the last ones of the keys
        nq, nk = query.shape[2], key.shape[2]
        attention_mask = causal_mask(nq, nk, query.device, q_offset=nk - nq)
    y_BxHxQxD = hyla_attention(
        query,
        key,
        value,
        attention_mask,
        scale=scaling,
        attention=attention,
        dropout_p=dropout,
        training=module.training,
    )
    return y_BxHxQxD.transpose(1, 2).contiguous(), None


def register(name: str = "hyla", attention: str | AttentionConfig = "hyla") -> str:
    """Register ``attention`` (a preset name or config) as ``attn_implementation=name``, with SDPA's boolean mask
    function (True = attend). Returns ``name``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, functools.partial(hyla_attention_forward, attention=attention))
    AttentionMaskInterface.register(name, sdpa_mask)  # True = attend; a causal mask left out is rebuilt above
    return name
