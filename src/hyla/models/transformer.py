"""The paper's transformer for the synthetic tasks (pre-LN, non-causal, relative-position bias).

``Z = Attn(LN(X)) + X;  Y = FF(LN(Z)) + Z``; final LN; linear readout. Inputs are vectors (linear
embedding) or token ids (token embedding). Hook points name every residual-stream intermediate:
``blocks.{i}.hook_resid_pre``, ``blocks.{i}.hook_attn_out``, ``blocks.{i}.hook_resid_mid``,
``blocks.{i}.hook_ff_out``, ``hook_resid_final``; the attention's own hooks sit under ``blocks.{i}.attn``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hyla.attention import PRESETS, Attention, HookPoint, KVCache, attention_preset
from hyla.ops.gelu import gelu
from hyla.ops.moe import ExpertWeights, Routing, moe_experts

FEEDFORWARDS: tuple[str, ...] = ("gelu", "swiglu")
NORMS: tuple[str, ...] = ("layer", "rms")
INITS: tuple[str, ...] = ("torch", "flax")
GELU_APPROXIMATIONS: tuple[str, ...] = ("none", "tanh")
#: flax's lecun_normal draws from a normal truncated at 2 std; this restores the variance it cuts
_TRUNCATED_NORMAL_STD = 0.87962566103423978


#: relative-position buckets and max distance of a model that no task sizes
DEFAULT_RELATIVE_SPAN = 64


@dataclass
class TransformerConfig:
    """Architecture; widths are for ``width_multiplier=1`` (multiplied by it in ``resolved``).

    ``qk_dim`` and ``v_dim`` are totals split over heads (the paper's convention). ``single_head``
    keeps those totals in one head of full width (the paper's single-head comparison, Fig. 5C).
    Exactly one of ``input_dim`` (linear embedding of vectors) and ``vocab_size`` (token ids) is set.

    The paper's code (flax) differs from PyTorch's defaults in a few choices, each an option here:
    ``init="flax"`` (weights lecun normal, std ``1/sqrt(fan_in)``, zero biases),
    ``gelu_approximate="tanh"``, ``norm_eps=1e-6``, ``attention_dropout`` (on the latent code) and
    ``relative_position_bidirectional=False``.
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
    key_normalization: str = "none"  # none (the paper) | count (ours): sums over keys divided by the keys seen
    feedforward: str = "gelu"
    moe_experts: int = 0
    moe_top_k: int = 2
    norm: str = "layer"
    causal: bool = False
    relative_position: bool = True
    # None: the task's sequence length when a task sizes the model (hyla.train.build), else 64
    relative_position_buckets: int | None = None
    relative_position_max_distance: int | None = None
    relative_position_bidirectional: bool | None = None  # None: bidirectional unless causal
    attention_dropout: float = 0.0  # on the latent code while training (see hyla.Attention)
    rope: bool = False
    width_multiplier: int = 1
    single_head: bool = False
    tie_embeddings: bool = False
    # the paper code's language model divides its tied logits by sqrt(emb_dim) (CausalTransformer)
    scale_tied_logits: bool = False
    attention_backend: str = "auto"
    init: str = "torch"  # torch (PyTorch's defaults) | flax (the paper's code)
    gelu_approximate: str = "none"  # none | tanh (flax's nn.gelu)
    norm_eps: float = 1e-5  # torch's LayerNorm default; flax: 1e-6

    def validate(self) -> None:
        if (self.input_dim is None) == (self.vocab_size is None):
            raise ValueError("set exactly one of input_dim (vector inputs) and vocab_size (token inputs)")
        if self.attention not in PRESETS:
            raise ValueError(f"attention={self.attention!r} is unknown; allowed values: {', '.join(PRESETS)}")
        attention_preset(self.attention, key_normalization=self.key_normalization)  # its own clear error
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
        for name, allowed in (("init", INITS), ("gelu_approximate", GELU_APPROXIMATIONS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}={getattr(self, name)!r} is not valid; allowed values: {', '.join(allowed)}")
        if not 0 <= self.attention_dropout < 1:
            raise ValueError(f"attention_dropout must be in [0, 1), got {self.attention_dropout}")
        for name in ("relative_position_buckets", "relative_position_max_distance"):
            value = getattr(self, name)
            if value is not None and not value >= 1:
                raise ValueError(f"{name} must be >= 1 or null (the task's sequence length), got {value}")
        if not self.norm_eps > 0:
            raise ValueError(f"norm_eps must be > 0, got {self.norm_eps}")
        if self.width_multiplier < 1:
            raise ValueError(f"width_multiplier must be >= 1, got {self.width_multiplier}")
        if self.tie_embeddings and self.vocab_size is None:
            raise ValueError("tie_embeddings needs token inputs (vocab_size)")
        if self.scale_tied_logits and not self.tie_embeddings:
            raise ValueError("scale_tied_logits needs tie_embeddings=true")
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
                "relative_position_buckets": self.relative_position_buckets or DEFAULT_RELATIVE_SPAN,
                "relative_position_max_distance": self.relative_position_max_distance or DEFAULT_RELATIVE_SPAN,
            }
        )


def make_norm(kind: str, dim: int, eps: float = 1e-5) -> nn.Module:
    return nn.LayerNorm(dim, eps=eps) if kind == "layer" else nn.RMSNorm(dim, eps=eps)


class MLP(nn.Module):
    """GELU MLP or SwiGLU (``swiglu``: ``W2 (silu(W_g x) * W_1 x)``, no biases). A tanh GELU on the CPU is the
    C kernel's (``hyla.ops.gelu.gelu``)."""

    def __init__(self, dim: int, hidden: int, kind: str = "gelu", gelu_approximate: str = "none"):
        super().__init__()
        self.kind, self.gelu_approximate = kind, gelu_approximate
        bias = kind == "gelu"
        self.fc1 = nn.Linear(dim, hidden, bias=bias)
        self.gate = nn.Linear(dim, hidden, bias=False) if kind == "swiglu" else None
        self.fc2 = nn.Linear(hidden, dim, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        h = self.fc1(x)
        h = F.silu(self.gate(x)) * h if self.gate is not None else gelu(h, approximate=self.gelu_approximate)
        return self.fc2(h)


class MoE(nn.Module):
    """Mixture of ``num_experts`` GELU MLPs of the MLP's size with top-k softmax routing.

    Each token's top-k experts, combined with the renormalized top-k gate weights (``hyla.ops.moe``: routed on a
    CPU, every expert on every token where shapes must stay fixed). ``aux_loss`` after a
    forward is the Switch-Transformer load-balancing term ``E * sum_e f_e * P_e`` (1 when balanced).
    """

    #: parameters that are biases although 2-D (one row per expert): never weight-decayed by the paper
    bias_parameters: tuple[str, ...] = ("b1_ExM", "b2_ExD")

    def __init__(self, dim: int, hidden: int, num_experts: int, top_k: int, gelu_approximate: str = "none"):
        super().__init__()
        self.top_k, self.gelu_approximate = top_k, gelu_approximate
        self.router = nn.Linear(dim, num_experts, bias=False)
        self.w1_ExDxM = nn.Parameter(torch.randn(num_experts, dim, hidden) * dim**-0.5)
        self.b1_ExM = nn.Parameter(torch.zeros(num_experts, hidden))
        self.w2_ExMxD = nn.Parameter(torch.randn(num_experts, hidden, dim) * hidden**-0.5)
        self.b2_ExD = nn.Parameter(torch.zeros(num_experts, dim))
        self.aux_loss: Tensor = torch.zeros(())
        self.hook_router = HookPoint()

    def forward(self, x_BxTxD: Tensor) -> Tensor:
        probs_BxTxE = self.hook_router(torch.softmax(self.router(x_BxTxD), dim=-1))
        top_w_BxTxK, top_i_BxTxK = probs_BxTxE.topk(self.top_k, dim=-1)
        weights_BxTxK = top_w_BxTxK / top_w_BxTxK.sum(-1, keepdim=True)
        num_experts, x_NxD = probs_BxTxE.shape[-1], x_BxTxD.reshape(-1, x_BxTxD.shape[-1])
        routed_BxTxE = torch.zeros_like(probs_BxTxE).scatter(-1, top_i_BxTxK, 1.0)
        routed_frac_E = routed_BxTxE.mean(dim=(0, 1)) / self.top_k
        self.aux_loss = num_experts * (routed_frac_E * probs_BxTxE.mean(dim=(0, 1))).sum()
        routing = Routing(weights_BxTxK.reshape(-1, self.top_k), top_i_BxTxK.reshape(-1, self.top_k))
        experts = ExpertWeights(self.w1_ExDxM, self.b1_ExM, self.w2_ExMxD, self.b2_ExD)
        y_NxD = moe_experts(x_NxD, routing, experts, self.gelu_approximate)
        return y_NxD.reshape(x_BxTxD.shape)


class Block(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.norm1 = make_norm(cfg.norm, cfg.emb_dim, cfg.norm_eps)
        self.attn = Attention(
            cfg.emb_dim,
            cfg.num_heads,
            attention_preset(cfg.attention, key_normalization=cfg.key_normalization),
            qk_dim=cfg.qk_dim,
            v_dim=cfg.v_dim,
            causal=cfg.causal,
            relative_position=cfg.relative_position,
            num_buckets=cfg.relative_position_buckets,
            max_distance=cfg.relative_position_max_distance,
            relative_position_bidirectional=cfg.relative_position_bidirectional,
            rope=cfg.rope,
            dropout=cfg.attention_dropout,
            nonlinearity=cfg.nonlinearity,
            backend=cfg.attention_backend,
        )
        self.norm2 = make_norm(cfg.norm, cfg.emb_dim, cfg.norm_eps)
        self.ff: nn.Module = (
            MoE(cfg.emb_dim, cfg.mlp_dim, cfg.moe_experts, cfg.moe_top_k, cfg.gelu_approximate)
            if cfg.moe_experts
            else MLP(cfg.emb_dim, cfg.mlp_dim, cfg.feedforward, cfg.gelu_approximate)
        )
        for name in ("resid_pre", "attn_out", "resid_mid", "ff_out"):
            setattr(self, f"hook_{name}", HookPoint())

    def forward(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None = None,
        cache: KVCache | None = None,
        last_positions: int | None = None,
        dropout_keep: Tensor | None = None,
    ) -> Tensor:
        """``last_positions=P``: compute only the last P positions' outputs (queries), over all keys;
        ``dropout_keep``: the attention's dropout keep-mask (``Attention.forward``'s), or None: drawn."""
        x = self.hook_resid_pre(x)
        h = self.norm1(x)
        key_mask = None if key_padding_mask is None else ~key_padding_mask  # the attention's True = attend
        if last_positions is None:
            attn_out = self.attn(h, key_mask=key_mask, cache=cache, dropout_keep=dropout_keep)
        else:
            t = h.shape[1]
            attn_out = self.attn(
                h[:, t - last_positions :],
                h,
                key_mask=key_mask,
                q_offset=t - last_positions,
                dropout_keep=dropout_keep,
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
        self.norm = make_norm(c.norm, c.emb_dim, c.norm_eps)
        self.readout = nn.Linear(c.emb_dim, c.output_dim, bias=not c.tie_embeddings)
        if c.vocab_size is not None:
            # unit-norm token vectors; nn.Embedding's N(0, 1) would make tied logits start with std sqrt(emb_dim)
            nn.init.normal_(self.embed.weight, std=c.emb_dim**-0.5)
        if c.init == "flax":
            flax_init_(self)
        if c.tie_embeddings:
            self.readout.weight = self.embed.weight  # type: ignore[assignment]
        self.hook_resid_final = HookPoint()

    def forward(
        self,
        inputs: Tensor,
        key_padding_mask: Tensor | None = None,
        caches: list[KVCache] | None = None,
        last_positions: int | None = None,
        dropout_keeps: Sequence[Tensor] | None = None,
    ) -> Tensor:
        """``inputs``: ``B x T x input_dim`` floats or ``B x T`` token ids; returns ``B x T x output_dim``.

        ``last_positions=P`` returns only the last P positions (``B x P x output_dim``), equal to
        ``forward(inputs)[:, -P:]`` but cheaper: the last block computes only those queries.
        ``dropout_keeps``: in a training forward, the attention dropout keep-masks to use instead of drawing
        them, one per block whose attention drops, shaped as ``dropout_mask_shapes`` lists them.
        """
        if last_positions is not None and not 1 <= last_positions <= inputs.shape[1]:
            raise ValueError(f"last_positions must be in 1..{inputs.shape[1]} (sequence length), got {last_positions}")
        if last_positions is not None and caches is not None:
            raise ValueError("last_positions and caches cannot be combined")
        keeps = self._keeps_per_block(dropout_keeps)
        x = self.embed(inputs)
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            x = block(
                x,
                key_padding_mask,
                None if caches is None else caches[i],
                last_positions if i == last else None,
                keeps[i],
            )
        logits = self.readout(self.hook_resid_final(self.norm(x)))
        return logits * self.cfg.emb_dim**-0.5 if self.cfg.scale_tied_logits else logits

    def dropout_mask_shapes(self, seq_len: int, last_positions: int | None = None) -> list[tuple[int, int]]:
        """``(Q, K)`` of each attention dropout mask that a training forward of ``seq_len`` tokens draws,
        in the order it draws them (one per block whose attention drops; the last block has
        ``last_positions`` queries)."""
        last = len(self.blocks) - 1
        queries = [last_positions if i == last and last_positions is not None else seq_len for i in range(last + 1)]
        return [(q, seq_len) for q, block in zip(queries, self.blocks) if block.attn.dropout > 0]

    def _keeps_per_block(self, dropout_keeps: Sequence[Tensor] | None) -> list[Tensor | None]:
        """``dropout_keeps`` spread over the blocks: each dropping block's mask, None for the others."""
        dropping = [i for i, block in enumerate(self.blocks) if block.attn.dropout > 0]
        keeps: list[Tensor | None] = [None] * len(self.blocks)
        if dropout_keeps is None:
            return keeps
        if len(dropout_keeps) != len(dropping):
            raise ValueError(
                f"dropout_keeps must hold one mask per block whose attention drops ({len(dropping)}), "
                f"got {len(dropout_keeps)}"
            )
        for i, keep in zip(dropping, dropout_keeps):
            keeps[i] = keep
        return keeps

    @property
    def aux_loss(self) -> Tensor:
        """Sum of the MoE load-balancing terms of the last forward (0 without MoE)."""
        terms = [b.ff.aux_loss for b in self.blocks if isinstance(b.ff, MoE)]
        return torch.stack(terms).sum() if terms else torch.zeros((), device=self.readout.weight.device)

    def pop_aux_loss(self) -> Tensor:
        """``aux_loss``, the MoE layers then cleared of their terms. A stacked forward reads each run's
        term right after that run's call (under ``vmap`` it is batched); the template it calls must not keep
        it (a term in an autograd graph cannot be deep-copied into a lone run's model)."""
        aux = self.aux_loss
        for b in self.blocks:
            if isinstance(b.ff, MoE):
                b.ff.aux_loss = torch.zeros(())
        return aux

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


@torch.no_grad()
def flax_init_(model: nn.Module) -> None:
    """Re-initialize ``model`` as flax's defaults would (the paper's code), in module order.

    Linear weights and MoE expert weights: lecun normal (truncated at 2 std, std ``1/sqrt(fan_in)``);
    biases zero. Already as flax draws them, so left alone: token embeddings and relative-position
    tables (``default_embed_init``: normal, std ``1/sqrt(width)``), norms (ones, zeros). HYLA+'s
    generated layer is not in the paper's code and keeps its own init.
    """

    def lecun_(w: Tensor, fan_in: int) -> None:
        std = fan_in**-0.5 / _TRUNCATED_NORMAL_STD
        nn.init.trunc_normal_(w, std=std, a=-2 * std, b=2 * std)

    for module in model.modules():
        if isinstance(module, nn.Linear):
            lecun_(module.weight, module.in_features)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, MoE):
            lecun_(module.w1_ExDxM, module.w1_ExDxM.shape[1])
            lecun_(module.w2_ExMxD, module.w2_ExMxD.shape[1])
            nn.init.zeros_(module.b1_ExM)
            nn.init.zeros_(module.b2_ExD)


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
