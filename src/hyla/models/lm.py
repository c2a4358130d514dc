"""Causal language models from the task transformer: presets and sampling with a key/value cache.

A language model is a ``Transformer`` with token inputs, tied input/output embeddings, SwiGLU and causal
attention (any preset). Presets (model widths; the data and training sides live in ``hyla/configs/lm_*.yaml``):
``lm-tiny`` (CPU minutes), ``lm-small`` and ``lm-paper`` with RoPE and RMSNorm; ``lm-wiki``, the authors'
public WikiText model (``configs/wiki.py``: 8 layers, emb 128, 16 heads of 8, SwiGLU 256, LayerNorm, T5
relative-position bias, attention dropout 0.1, flax init, tied logits divided by ``sqrt(emb_dim)``).
``lm-paper`` is the paper's C4 model (6 layers, emb 512, 8 heads, mlp 2048); we read the paper's "qk/v 64" as
64 per head, i.e. 512 in total, the usual choice for emb 512 and 8 heads.

That reading is uncertain. The paper gives qk/v as totals for its task models, and the authors' public
WikiText config (16 heads, qk = v = 128 in total) uses heads of 8; read as a total, "qk/v 64" is
``model.qk_dim=64 model.v_dim=64`` (heads of 8). Parameters with a 32k vocabulary: 41.6M here, 36.1M
with heads of 8 (58.0M and 52.5M untied; counted as ``sum(p.numel() for p in Transformer(TransformerConfig(
vocab_size=32000, output_dim=32000, **preset)).parameters())``); the paper says ~50M.
The docs' language-modeling page compares the two head sizes at ``lm_tiny`` scale.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hyla.attention import KVCache
from hyla.models.transformer import Transformer

_LM_COMMON = dict(
    feedforward="swiglu", norm="rms", causal=True, rope=True, relative_position=False, tie_embeddings=True
)
LM_PRESETS: dict[str, dict[str, object]] = {
    "lm-tiny": dict(num_layers=2, emb_dim=128, num_heads=4, qk_dim=128, v_dim=128, mlp_dim=384, **_LM_COMMON),
    "lm-small": dict(num_layers=4, emb_dim=256, num_heads=4, qk_dim=256, v_dim=256, mlp_dim=1024, **_LM_COMMON),
    "lm-paper": dict(num_layers=6, emb_dim=512, num_heads=8, qk_dim=512, v_dim=512, mlp_dim=2048, **_LM_COMMON),
    "lm-wiki": dict(
        num_layers=8,
        emb_dim=128,
        num_heads=16,
        qk_dim=128,
        v_dim=128,
        mlp_dim=256,
        feedforward="swiglu",
        norm="layer",
        norm_eps=1e-6,
        causal=True,
        rope=False,
        relative_position=True,
        relative_position_buckets=128,
        relative_position_max_distance=128,
        relative_position_bidirectional=False,
        attention_dropout=0.1,
        init="flax",
        tie_embeddings=True,
        scale_tied_logits=True,
    ),
}


@torch.no_grad()
def generate(
    model: Transformer,
    prompt_ids: list[int],
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    eos_id: int | None = None,
    seed: int = 0,
) -> list[int]:
    """Sample a continuation token by token, reusing every layer's key/value cache.

    ``temperature=0`` is greedy decoding. Each new token costs one forward of a single position;
    HYLA's value network is recomputed from the cached keys and values for the new query.
    """
    if not prompt_ids:
        raise ValueError("prompt_ids must hold at least one token")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    device = model.readout.weight.device
    gen = torch.Generator(device).manual_seed(seed)
    caches = [KVCache() for _ in model.blocks]
    logits = model(torch.tensor([prompt_ids], device=device), caches=caches)[0, -1]
    out: list[int] = []
    for _ in range(max_new_tokens):
        token = _pick(logits, temperature, top_k, gen)
        out.append(token)
        if eos_id is not None and token == eos_id:
            break
        logits = model(torch.tensor([[token]], device=device), caches=caches)[0, -1]
    return out


def _pick(logits_V: Tensor, temperature: float, top_k: int | None, gen: torch.Generator) -> int:
    if temperature == 0:
        return int(logits_V.argmax())
    logits_V = logits_V.float() / temperature
    if top_k is not None:
        kth = logits_V.topk(min(top_k, logits_V.numel())).values[-1]
        logits_V = logits_V.masked_fill(logits_V < kth, float("-inf"))
    return int(torch.multinomial(torch.softmax(logits_V, -1), 1, generator=gen))
