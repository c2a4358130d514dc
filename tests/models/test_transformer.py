"""The task transformer: every preset learns, widths and options behave, errors are clear."""

from __future__ import annotations

import pytest
import torch

from hyla.attention import PRESETS
from hyla.models import Transformer, TransformerConfig, num_parameters


def tiny(**kw: object) -> TransformerConfig:
    base = dict(input_dim=3, output_dim=1, emb_dim=16, num_layers=2, num_heads=4, qk_dim=8, v_dim=8, mlp_dim=32)
    base.update(kw)
    return TransformerConfig(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_each_preset_learns_a_toy_in_context_task(preset: str) -> None:
    """Predict, at the last position, the sum of the first feature over the sequence: most of its
    variance comes from other tokens, so the loss can only fall this far by attending."""
    torch.manual_seed(0)
    model = Transformer(tiny(attention=preset))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(1)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.rand(64, 6, 3, generator=gen)
        return x, x[:, :, 0].sum(dim=1) - 3.0

    def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (model(x)[:, -1, 0] - y).pow(2).mean()

    x_eval, y_eval = batch()
    with torch.no_grad():
        before = loss_of(x_eval, y_eval).item()
    for _ in range(40):
        opt.zero_grad()
        loss_of(*batch()).backward()
        opt.step()
    with torch.no_grad():
        after = loss_of(x_eval, y_eval).item()
    assert after < 0.3 * before, (before, after)


def test_parameter_counts_equal_across_softmax_linear_hyla() -> None:
    counts = {
        p: num_parameters(Transformer(TransformerConfig(input_dim=8, attention=p)))
        for p in ("softmax", "linear", "hyla")
    }
    assert len(set(counts.values())) == 1, counts
    assert num_parameters(Transformer(TransformerConfig(input_dim=8, attention="hyla_plus"))) > counts["hyla"]


def test_width_multiplier_and_single_head() -> None:
    m = Transformer(TransformerConfig(input_dim=8, width_multiplier=2))
    c = m.cfg
    assert (c.emb_dim, c.num_heads, c.qk_dim, c.v_dim, c.mlp_dim) == (256, 32, 128, 128, 512)
    assert m.blocks[0].attn.head_dim_qk == 4  # d_head unchanged by width
    s = Transformer(TransformerConfig(input_dim=8, single_head=True))
    assert s.cfg.num_heads == 1 and s.blocks[0].attn.head_dim_qk == 64 and s.blocks[0].attn.head_dim_v == 64
    x = torch.randn(2, 36, 8)
    _, a = s.blocks[0].attn(s.embed(x), return_latent=True)
    assert a.shape == (2, 1, 36, 36)


def test_moe_routes_top_k_and_exposes_balancing_loss() -> None:
    torch.manual_seed(0)
    m = Transformer(tiny(moe_experts=5, moe_top_k=2))
    x = torch.randn(4, 6, 3)
    out = m(x)
    aux = m.aux_loss
    assert aux.ndim == 0 and aux.item() >= 0.99 * 2  # two layers, each >= 1 (1 when perfectly balanced)
    (out.sum() + aux).backward()
    assert m.blocks[0].ff.router.weight.grad.abs().sum() > 0
    gates = {}
    m.blocks[0].ff.hook_router.register_forward_hook(lambda mod, i, o: gates.setdefault("p", o))
    m(x)
    assert torch.allclose(gates["p"].sum(-1), torch.ones(4, 6))


def test_swiglu_rms_norm_tokens_and_tied_embeddings() -> None:
    cfg = TransformerConfig(
        vocab_size=11,
        output_dim=11,
        emb_dim=16,
        num_heads=2,
        qk_dim=8,
        v_dim=8,
        mlp_dim=32,
        num_layers=1,
        feedforward="swiglu",
        norm="rms",
        causal=True,
        rope=True,
        relative_position=False,
        tie_embeddings=True,
    )
    m = Transformer(cfg)
    tokens = torch.randint(0, 11, (2, 5))
    assert m(tokens).shape == (2, 5, 11)
    assert m.readout.weight is m.embed.weight


def test_hook_points_are_named_and_latent_codes_per_layer() -> None:
    m = Transformer(tiny())
    names = {n for n, _ in m.named_modules()}
    for expected in (
        "blocks.0.hook_resid_pre",
        "blocks.1.attn.hook_latent",
        "blocks.0.attn.hook_hidden",
        "hook_resid_final",
    ):
        assert expected in names
    codes = m.latent_codes(torch.randn(2, 6, 3))
    assert len(codes) == 2 and codes[0].shape == (2, 4, 6, 6)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"attention": "flash"}, "attention='flash' is unknown"),
        ({"feedforward": "relu"}, "feedforward='relu' is not valid"),
        ({"moe_experts": 3, "moe_top_k": 4}, "moe_top_k must be in 1..moe_experts=3"),
        ({"vocab_size": 5}, "exactly one of input_dim"),
        ({"norm": "batch"}, "norm='batch' is not valid"),
    ],
)
def test_bad_config(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Transformer(tiny(**kwargs))


@pytest.mark.parametrize("preset", ["softmax", "linear", "hyla", "hyla_plus"])
@pytest.mark.parametrize("causal", [False, True])
def test_last_positions_equals_slicing_the_full_output(preset: str, causal: bool) -> None:
    torch.manual_seed(0)
    m = Transformer(tiny(attention=preset, causal=causal, rope=True)).double()
    x = torch.randn(3, 7, 3, dtype=torch.float64)
    full = m(x)
    for p in (1, 3, 7):
        assert torch.allclose(m(x, last_positions=p), full[:, -p:], rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match=r"last_positions must be in 1\.\.7"):
        m(x, last_positions=8)


def test_relative_position_span_follows_the_config_or_the_sequence_length() -> None:
    """Unset, a task sizes the relative positions to its sequence length (the paper configs); an explicit
    value (the authors' fuzzy-logic model keeps 128) is kept; a model without a task gets 64."""
    from hyla.train.build import build_model, build_task
    from hyla.train.config import load_config

    def span(*overrides: str) -> tuple[int, int]:
        cfg = load_config("fuzzy_logic", list(overrides))
        c = build_model(cfg, build_task(cfg)).cfg
        return c.relative_position_buckets, c.relative_position_max_distance

    unset = ("model.relative_position_buckets=null", "model.relative_position_max_distance=null")
    assert span(*unset) == (32, 32)  # the sequence length of the fuzzy-logic task
    assert span() == (128, 128)  # hyla/configs/fuzzy_logic.yaml: the authors' 128
    assert span("model.relative_position_buckets=16", "model.relative_position_max_distance=20") == (16, 20)
    lone = Transformer(TransformerConfig(input_dim=3))
    assert (lone.cfg.relative_position_buckets, lone.cfg.relative_position_max_distance) == (64, 64)
    with pytest.raises(ValueError, match="relative_position_buckets must be >= 1 or null"):
        Transformer(TransformerConfig(input_dim=3, relative_position_buckets=0))
