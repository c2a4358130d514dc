"""The naive per-(query, key) loop of every attention variant: slow and obviously correct.

It reads only the module's parameter tensors and spells the paper's equations out pair by pair:
for each (b, q, k) it computes the H scores, normalizes them, builds the generated value-network
weights ``W[q,k]`` from the latent code and applies them to ``x_k``. Use tiny sizes (it loops in Python).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from hyla.attention import functional as fn
from hyla.attention.module import Attention


def _rotate(vec_E: Tensor, position: int, base: float) -> Tensor:
    """RoPE of one vector, half-split convention: pair (i, i + E/2) rotated by pos * base^(-2i/E)."""
    half = vec_E.shape[0] // 2
    out = vec_E.clone()
    for i in range(half):
        theta = position * base ** (-2 * i / vec_E.shape[0])
        c, s = math.cos(theta), math.sin(theta)
        out[i] = vec_E[i] * c - vec_E[i + half] * s
        out[i + half] = vec_E[i] * s + vec_E[i + half] * c
    return out


def naive_attention(
    module: Attention,
    x_BxQxD: Tensor,
    context_BxKxC: Tensor | None = None,
    *,
    key_padding_mask: Tensor | None = None,
    attn_bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """``(out_BxQxO, latent_BxHxQxK)`` computed pair by pair from ``module``'s weights."""
    kv = x_BxQxD if context_BxKxC is None else context_BxKxC
    B, Q, _ = x_BxQxD.shape
    K = kv.shape[1]
    H, E, D = module.num_heads, module.head_dim_qk, module.head_dim_v
    cfg = module.config
    phi = fn.nonlinearity(cfg.nonlinearity)

    def proj(lin: torch.nn.Linear, vec: Tensor, h: int, width: int) -> Tensor:
        w = lin.weight[h * width : (h + 1) * width]
        out = w @ vec
        return out if lin.bias is None else out + lin.bias[h * width : (h + 1) * width]

    bias_HxQxK = None
    if module.relative_position is not None:
        bias_HxQxK = module.relative_position(Q, K)

    latent = x_BxQxD.new_zeros(B, H, Q, K)
    visible_per_batch = []
    for b in range(B):
        visible = [[True] * K for _ in range(Q)]
        visible_per_batch.append(visible)
        for q in range(Q):
            for k in range(K):
                if module.causal and k > q:
                    visible[q][k] = False
                if key_padding_mask is not None and bool(key_padding_mask[b, k]):
                    visible[q][k] = False
        scores = [[[None] * K for _ in range(Q)] for _ in range(H)]
        for h in range(H):
            for q in range(Q):
                qv = proj(module.q_proj, x_BxQxD[b, q], h, E)
                if module.rope:
                    qv = _rotate(qv, q, module.rope_base)
                for k in range(K):
                    kvec = proj(module.k_proj, kv[b, k], h, E)
                    if module.rope:
                        kvec = _rotate(kvec, k, module.rope_base)
                    s = torch.dot(qv, kvec) / math.sqrt(E)
                    if bias_HxQxK is not None:
                        s = s + bias_HxQxK[h, q, k]
                    if attn_bias is not None:
                        s = s + attn_bias.expand(B, H, Q, K)[b, h, q, k]
                    scores[h][q][k] = s
        for q in range(Q):
            for k in range(K):
                if cfg.normalization == "softmax":
                    for h in range(H):
                        row = [scores[h][q][j] for j in range(K) if visible[q][j]]
                        if not visible[q][k]:
                            latent[b, h, q, k] = 0.0
                        else:
                            m = max(float(r.detach()) for r in row)
                            latent[b, h, q, k] = torch.exp(scores[h][q][k] - m) / sum(torch.exp(r - m) for r in row)
                else:
                    vec_H = torch.stack([scores[h][q][k] for h in range(H)])
                    if not visible[q][k]:
                        vec_H = vec_H * 0.0
                    if cfg.normalization == "rms_head":
                        vec_H = vec_H / torch.sqrt((vec_H**2).mean() + cfg.rms_eps)
                    latent[b, :, q, k] = vec_H

    # the generated value network per pair, then out_q = sum_k net_{q,k}(x_k) + b_out
    w_out = module.out_proj.weight  # O x (H*D)
    outs = []
    for b in range(B):
        rows = []
        for q in range(Q):
            acc = x_BxQxD.new_zeros(module.out_dim)
            for k in range(K):
                a_H = latent[b, :, q, k]
                v_H = [proj(module.v_proj, kv[b, k], h, D) for h in range(H)]
                if cfg.value_network == "linear":
                    for h in range(H):
                        acc = acc + a_H[h] * (w_out[:, h * D : (h + 1) * D] @ v_H[h])
                    continue
                hidden = phi(sum(a_H[h] * v_H[h] for h in range(H)))
                if cfg.value_network == "hyper_deep":
                    w_mid = sum(a_H[h] * module.w_mid_HxDxD[h] for h in range(H))
                    hidden = phi(w_mid @ hidden)
                w2 = sum(a_H[h] * w_out[:, h * D : (h + 1) * D] for h in range(H))
                acc = acc + w2 @ hidden
            if cfg.key_normalization == "count":  # the sum over keys as a mean over the keys this query sees
                acc = acc / max(sum(visible_per_batch[b][q]), 1)
            if module.out_proj.bias is not None:
                acc = acc + module.out_proj.bias
            rows.append(acc)
        outs.append(torch.stack(rows))
    return torch.stack(outs), latent
