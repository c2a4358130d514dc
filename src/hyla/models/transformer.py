"""The paper's transformer for the synthetic tasks (pre-LN, non-causal, relative-position bias).

``Z = Attn(LN(X)) + X;  Y = FF(LN(Z)) + Z``; final LN; linear readout. Inputs are vectors (linear
embedding) or token ids (token embedding). Hook points name every residual-stream intermediate:
``blocks.{i}.hook_resid_pre``, ``blocks.{i}.hook_attn_out``, ``blocks.{i}.hook_resid_mid``,
``blocks.{i}.hook_ff_out``, ``hook_resid_final``; the attention's own hooks sit under ``blocks.{i}.attn``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hyla.attention import PRESETS, Attention, HookPoint, KVCache, attention_preset

FEEDFORWARDS: tuple[str, ...] = ("gelu", "swiglu")
NORMS: tuple[str, ...] = ("layer", "rms")


@dataclass
class TransformerConfig:
    """Architecture; widths are for ``width_multiplier=1`` (multiplied by it in :meth:`resolved`).

    ``qk_dim`` and ``v_dim`` are totals split over heads (the paper's convention). ``single_head``
    keeps those totals in one head of full width (the paper's single-head comparison, Fig. 5C).
    Exactly one of ``input_dim`` (linear embedding of vectors) and ``vocab_size`` (token ids) is set.
    """

    output_dim: int = 8
    input_dim: int | None = None
    vocab_size: int | None = None
    emb_dim: int = 128
    num_layers: int = 4
    num_heads: int = 16
    qk_dim: int = 64
    v_dim: int = 64
    mlp_dim: int = 256
    attention: str = "hyla"
    nonlinearity: str | None = None
    feedforward: str = "gelu"
    moe_experts: int = 0
    moe_top_k: int = 2
    norm: str = "layer"
    causal: bool = False
    relative_position: bool = True
    relative_position_buckets: int = 64
    relative_position_max_distance: int = 64
    rope: bool = False
    width_multiplier: int = 1
    single_head: bool = False
    tie_embeddings: bool = False
    attention_backend: str = "auto"

    def validate(self) -> None:
        if (self.input_dim is None) == (self.vocab_size is None):
            raise ValueError("set exactly one of input_dim (vector inputs) and vocab_size (token inputs)")
        if self.attention not in PRESETS:
            raise ValueError(f"attention={self.attention!r} is unknown; allowed values: {', '.join(PRESETS)}")
        if self.feedforward not in FEEDFORWARDS:
            raise ValueError(
                f"feedforward={self.feedforward!r} is not valid; allowed values: {', '.join(FEEDFORWARDS)}"
            )
        if self.norm not in NORMS:
            raise ValueError(f"norm={self.norm!r} is not valid; allowed values: {', '.join(NORMS)}")
        if self.moe_experts < 0 or (self.moe_experts and not 1 <= self.moe_top_k <= self.moe_experts):
            raise ValueError(
                f"moe_top_k must be in 1..moe_experts={self.moe_experts}, got {self.moe_top_k} (moe_experts=0: no MoE)"
            )
        if self.width_multiplier < 1:
            raise ValueError(f"width_multiplier must be >= 1, got {self.width_multiplier}")
        if self.tie_embeddings and self.vocab_size is None:
            raise ValueError("tie_embeddings needs token inputs (vocab_size)")
        if self.tie_embeddings and self.vocab_size != self.output_dim:
            raise ValueError(
                f"tie_embeddings needs output_dim == vocab_size, got {self.output_dim} != {self.vocab_size}"
            )

    def resolved(self) -> TransformerConfig:
        """The concrete widths: width multiplier applied (heads, emb, qk, v, mlp), single head."""
        self.validate()
        w = self.width_multiplier
        heads = 1 if self.single_head else self.num_heads * w
        return TransformerConfig(
            **{
                **self.__dict__,
                "emb_dim": self.emb_dim * w,
                "num_heads": heads,
                "qk_dim": self.qk_dim * w,
                "v_dim": self.v_dim * w,
                "mlp_dim": self.mlp_dim * w,
                "width_multiplier": 1,
                "single_head": False,
            }
        )


def make_norm(kind: str, dim: int) -> nn.Module:
    return nn.LayerNorm(dim) if kind == "layer" else nn.RMSNorm(dim)


class MLP(nn.Module):
    """GELU MLP or SwiGLU (``swiglu``: ``W2 (silu(W_g x) * W_1 x)``, no biases)."""

    def __init__(self, dim: int, hidden: int, kind: str = "gelu"):
        super().__init__()
        self.kind = kind
        bias = kind == "gelu"
        self.fc1 = nn.Linear(dim, hidden, bias=bias)
        self.gate = nn.Linear(dim, hidden, bias=False) if kind == "swiglu" else None
        self.fc2 = nn.Linear(hidden, dim, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        h = self.fc1(x)
        h = F.silu(self.gate(x)) * h if self.gate is not None else F.gelu(h)
        return self.fc2(h)


class MoE(nn.Module):
    """Mixture of ``num_experts`` GELU MLPs of the MLP's size with top-k softmax routing.

    Every expert is evaluated on every token (the experts are small, so dense evaluation is faster
    than gathering) and combined with the renormalized top-k gate weights. ``aux_loss`` after a
    forward is the Switch-Transformer load-balancing term ``E * sum_e f_e * P_e`` (1 when balanced).
    """

    def __init__(self, dim: int, hidden: int, num_experts: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.router = nn.Linear(dim, num_experts, bias=False)
        self.w1_ExDxM = nn.Parameter(torch.randn(num_experts, dim, hidden) * dim**-0.5)
        self.b1_ExM = nn.Parameter(torch.zeros(num_experts, hidden))
        self.w2_ExMxD = nn.Parameter(torch.randn(num_experts, hidden, dim) * hidden**-0.5)
        self.b2_ExD = nn.Parameter(torch.zeros(num_experts, dim))
        self.aux_loss: Tensor = torch.zeros(())
        self.hook_router = HookPoint()

    def forward(self, x_BxTxD: Tensor) -> Tensor:
        probs_BxTxE = self.hook_router(torch.softmax(self.router(x_BxTxD), dim=-1))
        top_w, top_i = probs_BxTxE.topk(self.top_k, dim=-1)
        gates_BxTxE = torch.zeros_like(probs_BxTxE).scatter(-1, top_i, top_w / top_w.sum(-1, keepdim=True))
        h = F.gelu(torch.einsum("btd,edm->btem", x_BxTxD, self.w1_ExDxM) + self.b1_ExM)
        y_BxTxExD = torch.einsum("btem,emd->bted", h, self.w2_ExMxD) + self.b2_ExD
        num_experts = probs_BxTxE.shape[-1]
        routed_frac_E = (gates_BxTxE > 0).float().mean(dim=(0, 1)) / self.top_k
        self.aux_loss = num_experts * (routed_frac_E * probs_BxTxE.mean(dim=(0, 1))).sum()
        return torch.einsum("bte,bted->btd", gates_BxTxE, y_BxTxExD)


class Block(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.norm1 = make_norm(cfg.norm, cfg.emb_dim)
        self.attn = Attention(
            cfg.emb_dim,
            cfg.num_heads,
            attention_preset(cfg.attention),
            qk_dim=cfg.qk_dim,
            v_dim=cfg.v_dim,
            causal=cfg.causal,
            relative_position=cfg.relative_position,
            num_buckets=cfg.relative_position_buckets,
            max_distance=cfg.relative_position_max_distance,
            rope=cfg.rope,
            nonlinearity=cfg.nonlinearity,
            backend=cfg.attention_backend,
        )
        self.norm2 = make_norm(cfg.norm, cfg.emb_dim)
        self.ff: nn.Module = (
            MoE(cfg.emb_dim, cfg.mlp_dim, cfg.moe_experts, cfg.moe_top_k)
            if cfg.moe_experts
            else MLP(cfg.emb_dim, cfg.mlp_dim, cfg.feedforward)
        )
        for name in ("resid_pre", "attn_out", "resid_mid", "ff_out"):
            setattr(self, f"hook_{name}", HookPoint())

    def forward(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None = None,
        cache: KVCache | None = None,
        last_positions: int | None = None,
    ) -> Tensor:
        """``last_positions=P``: compute only the last P positions' outputs (queries), over all keys."""
        x = self.hook_resid_pre(x)
        h = self.norm1(x)
        if last_positions is None:
            attn_out = self.attn(h, key_padding_mask=key_padding_mask, cache=cache)
        else:
            t = h.shape[1]
            attn_out = self.attn(
                h[:, t - last_positions :], h, key_padding_mask=key_padding_mask, q_offset=t - last_positions
            )
            x = x[:, t - last_positions :]
        z = self.hook_resid_mid(x + self.hook_attn_out(attn_out))
        return z + self.hook_ff_out(self.ff(self.norm2(z)))


class Transformer(nn.Module):
    """Embedding, ``num_layers`` pre-LN blocks, final norm, linear readout (``B x T x output_dim``)."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg.resolved()
        c = self.cfg
        self.embed: nn.Module = (
            nn.Linear(c.input_dim, c.emb_dim) if c.input_dim is not None else nn.Embedding(c.vocab_size, c.emb_dim)  # type: ignore[arg-type]
        )
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.num_layers))
        self.norm = make_norm(c.norm, c.emb_dim)
        self.readout = nn.Linear(c.emb_dim, c.output_dim, bias=not c.tie_embeddings)
        if c.vocab_size is not None:
            # unit-norm token vectors; nn.Embedding's N(0, 1) would make tied logits start with std sqrt(emb_dim)
            nn.init.normal_(self.embed.weight, std=c.emb_dim**-0.5)
        if c.tie_embeddings:
            self.readout.weight = self.embed.weight  # type: ignore[assignment]
        self.hook_resid_final = HookPoint()

    def forward(
        self,
        inputs: Tensor,
        key_padding_mask: Tensor | None = None,
        caches: list[KVCache] | None = None,
        last_positions: int | None = None,
    ) -> Tensor:
        """``inputs``: ``B x T x input_dim`` floats or ``B x T`` token ids; returns ``B x T x output_dim``.

        ``last_positions=P`` returns only the last P positions (``B x P x output_dim``), equal to
        ``forward(inputs)[:, -P:]`` but cheaper: the last block computes only those queries.
        """
        if last_positions is not None and not 1 <= last_positions <= inputs.shape[1]:
            raise ValueError(f"last_positions must be in 1..{inputs.shape[1]} (sequence length), got {last_positions}")
        if last_positions is not None and caches is not None:
            raise ValueError("last_positions and caches cannot be combined")
        x = self.embed(inputs)
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            x = block(
                x,
                key_padding_mask,
                None if caches is None else caches[i],
                last_positions if i == last else None,
            )
        return self.readout(self.hook_resid_final(self.norm(x)))

    @property
    def aux_loss(self) -> Tensor:
        """Sum of the MoE load-balancing terms of the last forward (0 without MoE)."""
        terms = [b.ff.aux_loss for b in self.blocks if isinstance(b.ff, MoE)]
        return torch.stack(terms).sum() if terms else torch.zeros((), device=self.readout.weight.device)

    def latent_codes(self, inputs: Tensor) -> list[Tensor]:
        """The latent code ``a_BxHxTxT`` of every layer (no gradient)."""
        codes: list[Tensor] = []
        handles = [
            b.attn.hook_latent.register_forward_hook(lambda m, i, o: codes.append(o.detach())) for b in self.blocks
        ]
        try:
            with torch.no_grad():
                self.forward(inputs)
        finally:
            for h in handles:
                h.remove()
        return codes


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
