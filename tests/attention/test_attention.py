"""The attention family against the paper's equations: hypernetwork form, naive loop, masks, errors."""

from __future__ import annotations

import pytest
import torch

from hyla.attention import PRESETS, Attention, AttentionConfig, KVCache, attention_preset
from hyla.attention.functional import drop_pairs
from hyla.attention.naive import naive_attention
from hyla.attention.position import relative_position_bucket

ALL_PRESETS = sorted(PRESETS)
OPTION_SETS = {
    "plain": {},
    "causal_relpos": {"causal": True, "relative_position": True, "num_buckets": 6, "max_distance": 8},
    "rope": {"rope": True},
}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def make(preset: str, dim: int = 6, heads: int = 3, **kw: object) -> Attention:
    torch.manual_seed(0)
    m = Attention(dim, heads, preset, head_dim_qk=2, head_dim_v=2, **kw).double()
    with torch.no_grad():  # non-zero biases so the test sees them
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return m


@pytest.mark.parametrize("preset", ALL_PRESETS)
def test_hypernetwork_form_equals_module(preset: str) -> None:
    """out_q = sum_k W[q,k] x_k (+ generated biases): the value network materialized from the
    module's own weights reproduces the forward (softmax and linear MHA included)."""
    m = make(preset, relative_position=True, num_buckets=4, max_distance=4)
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    net = m.value_network_weights(x)
    assert rel_err(net(x), m(x)) < 1e-6
    if m.config.value_network == "linear":
        assert len(net.layers) == 1 and net.layers[0][0].shape == (2, 5, 5, 6, 6)  # W[q,k]: D_out x D_in


@pytest.mark.parametrize("options", sorted(OPTION_SETS))
@pytest.mark.parametrize("preset", ALL_PRESETS)
def test_preset_matches_naive_loop_forward_and_grad(preset: str, options: str) -> None:
    m = make(preset, **OPTION_SETS[options])
    x = torch.randn(2, 4, 6, dtype=torch.float64, requires_grad=True)
    out, latent = m(x, return_latent=True)
    ref_out, ref_latent = naive_attention(m, x)
    assert rel_err(out, ref_out) < 1e-10
    assert rel_err(latent, ref_latent) < 1e-10
    g = torch.randn_like(out)
    params = [x, *m.parameters()]
    grads = torch.autograd.grad((out * g).sum(), params)
    ref_grads = torch.autograd.grad((ref_out * g).sum(), params)
    for got, want in zip(grads, ref_grads):
        # absolute floor: some gradients vanish in exact arithmetic (a key bias under softmax)
        assert torch.allclose(got, want, rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("preset", ALL_PRESETS)
def test_gradcheck(preset: str) -> None:
    m = make(preset, causal=True)
    x = torch.randn(1, 3, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda inp: m(inp), (x,), eps=1e-6, atol=1e-5)


def test_cross_attention_with_padding_matches_naive_loop() -> None:
    m = make("hyla", kv_dim=5)
    x = torch.randn(2, 3, 6, dtype=torch.float64)
    ctx = torch.randn(2, 4, 5, dtype=torch.float64)
    pad = torch.tensor([[False, False, True, False], [False, True, True, False]])
    out = m(x, ctx, key_mask=~pad)
    assert out.shape == (2, 3, 6)
    ref, _ = naive_attention(m, x, ctx, key_padding_mask=pad)
    assert rel_err(out, ref) < 1e-10


@pytest.mark.parametrize("preset", ALL_PRESETS)
def test_causality_gradient_is_exactly_zero(preset: str) -> None:
    m = make(preset, causal=True, relative_position=True)
    x = torch.randn(1, 6, 6, dtype=torch.float64, requires_grad=True)
    out = m(x)
    for t in range(6):
        (grad,) = torch.autograd.grad(out[0, t].sum(), x, retain_graph=True)
        assert torch.all(grad[0, t + 1 :] == 0), f"output {t} depends on a later input"
    assert grad.abs().sum() > 0  # the last output does see the inputs


@pytest.mark.parametrize("preset", ALL_PRESETS)
def test_padded_keys_change_nothing(preset: str) -> None:
    m = make(preset)
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[0, 3:] = True
    pad[1, 1] = True
    x2 = x.clone()
    x2[pad] = 100 * torch.randn_like(x2[pad])
    out1, out2 = m(x, key_mask=~pad), m(x2, key_mask=~pad)
    keep = ~pad
    assert torch.allclose(out1[keep], out2[keep], rtol=0, atol=1e-12)
    assert not torch.allclose(out1[pad], out2[pad])  # the padded queries themselves did change


def test_rms_head_normalizes_across_heads_not_keys() -> None:
    m = make("hyla", dim=8, heads=4)
    x = torch.randn(3, 7, 8, dtype=torch.float64)
    seen = {}
    m.hook_scores.register_forward_hook(lambda mod, inp, out: seen.setdefault("s", out))
    _, a = m(x, return_latent=True)
    ms_scores = seen["s"].pow(2).mean(dim=1)
    ms_heads = a.pow(2).mean(dim=1)  # = ms / (ms + eps): 1 up to the epsilon
    assert torch.allclose(ms_heads, ms_scores / (ms_scores + m.config.rms_eps), rtol=0, atol=1e-12)
    ms_keys = a.pow(2).mean(dim=-1)
    assert not torch.allclose(ms_keys, torch.ones_like(ms_keys), atol=1e-2)


def test_masked_pairs_are_zero_before_rms_normalization() -> None:
    m = make("hyla", causal=True)
    x = torch.randn(1, 4, 6, dtype=torch.float64)
    _, a = m(x, return_latent=True)
    assert torch.all(a[0, :, torch.triu_indices(4, 4, 1)[0], torch.triu_indices(4, 4, 1)[1]] == 0)


def test_softmax_rows_sum_to_one_and_fully_masked_rows_are_zero() -> None:
    m = make("softmax")
    x = torch.randn(2, 4, 6, dtype=torch.float64)
    pad = torch.zeros(2, 4, dtype=torch.bool)
    pad[1] = True
    _, a = m(x, key_mask=~pad, return_latent=True)
    assert torch.allclose(a[0].sum(-1), torch.ones(3, 4, dtype=torch.float64))
    assert torch.all(a[1] == 0) and torch.isfinite(a).all()


def test_single_head_code_is_a_scalar_and_rms_head_is_its_sign() -> None:
    m = make("hyla", dim=6, heads=1)
    x = torch.randn(1, 4, 6, dtype=torch.float64)
    _, a = m(x, return_latent=True)
    assert a.shape == (1, 1, 4, 4)
    assert torch.allclose(a.abs(), torch.ones_like(a), atol=1e-4)


@pytest.mark.parametrize("preset", ["softmax", "linear", "hyla", "hyla_plus", "hyla_softmax"])
def test_kv_cache_decoding_equals_full_recompute(preset: str) -> None:
    m = make(preset, causal=True, rope=True, relative_position=True)
    x = torch.randn(2, 6, 6, dtype=torch.float64)
    full = m(x)
    cache = KVCache()
    steps = [m(x[:, :2], cache=cache)] + [m(x[:, t : t + 1], cache=cache) for t in range(2, 6)]
    assert rel_err(torch.cat(steps, dim=1), full) < 1e-12


def test_hooks_read_and_edit_the_latent_code() -> None:
    m = make("hyla")
    x = torch.randn(2, 4, 6, dtype=torch.float64)
    seen = {}
    handle = m.hook_latent.register_forward_hook(lambda mod, inp, out: seen.setdefault("a", out))
    out, a = m(x, return_latent=True)
    handle.remove()
    assert torch.equal(seen["a"], a)
    handle = m.hook_latent.register_forward_hook(lambda mod, inp, out: torch.zeros_like(out))
    zeroed = m(x)
    handle.remove()
    assert torch.allclose(zeroed, m.out_proj.bias.expand_as(zeroed))  # no code, no value network
    assert not torch.allclose(out, zeroed)


def test_parameter_counts_equal_across_main_variants() -> None:
    counts = {p: sum(t.numel() for t in Attention(32, 4, p).parameters()) for p in PRESETS if p != "hyla_plus"}
    assert len(set(counts.values())) == 1, counts
    assert sum(t.numel() for t in Attention(32, 4, "hyla_plus").parameters()) > counts["hyla"]


def test_t5_buckets_known_values() -> None:
    rel = torch.arange(-10, 11)
    b = relative_position_bucket(rel, bidirectional=True, num_buckets=8, max_distance=8)
    # 4 buckets per direction, 2 exact then log-spaced; keys before the query (rel < 0) in 0..3
    assert b[10].item() == 0 and b[9].item() == 1 and b[11].item() == 5
    assert set(b[:10].tolist()) <= {0, 1, 2, 3} and set(b[11:].tolist()) <= {4, 5, 6, 7}
    assert b[0].item() == 3 and b[-1].item() == 7  # beyond max_distance: the last bucket
    assert torch.all(b[:10].diff() <= 0) and torch.all(b[11:].diff() >= 0)  # monotone in |distance|


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dim": 10, "num_heads": 3}, "qk_dim=10 must be a positive multiple of num_heads=3"),
        ({"dim": 8, "num_heads": 2, "attention": "hyperbolic"}, "attention preset 'hyperbolic' is unknown"),
        ({"dim": 8, "num_heads": 2, "nonlinearity": "swish"}, "nonlinearity='swish' is not valid; allowed"),
        ({"dim": 8, "num_heads": 2, "backend": "cuda"}, "backend='cuda' is not valid"),
        ({"dim": 8, "num_heads": 2, "qk_dim": 8, "head_dim_qk": 4}, "either qk_dim"),
        ({"dim": 6, "num_heads": 2, "rope": True, "qk_dim": 6}, "rope=True needs an even"),
    ],
)
def test_bad_constructor_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Attention(**kwargs)


def test_bad_forward_arguments() -> None:
    m = Attention(8, 2, "hyla", kv_dim=4)
    x = torch.randn(2, 3, 8)
    with pytest.raises(ValueError, match="key_mask must be a bool tensor of shape"):
        m(x, torch.randn(2, 5, 4), key_mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"context must have shape \(batch, keys, kv_dim=4\)"):
        m(x, torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match=r"x must have shape \(batch, queries, dim=8\)"):
        m(torch.randn(2, 3, 4), torch.randn(2, 5, 4))
    with pytest.raises(ValueError, match="attn_bias must broadcast"):
        m(x, torch.randn(2, 5, 4), attn_bias=torch.randn(3, 3, 5))
    with pytest.raises(ValueError, match="normalization='l2'"):
        AttentionConfig(normalization="l2")  # type: ignore[arg-type]
    assert attention_preset("hyla", nonlinearity="silu").nonlinearity == "silu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_attention_dropout_keeps_the_codes_dtype_and_scales_the_kept_pairs(dtype: torch.dtype) -> None:
    """One multiplier ``keep / (1 - p)`` in the code's dtype (a float32 multiplier would lift a bfloat16 code to
    float32): kept pairs scaled by ``1 / (1 - p)`` within the dtype's rounding, dropped pairs exactly zero."""
    gen = torch.Generator().manual_seed(0)
    a_BxHxQxK = torch.randn(2, 3, 5, 7, generator=gen).to(dtype)
    keep_11xQxK = torch.rand(1, 1, 5, 7, generator=gen) >= 0.3
    dropped = drop_pairs(a_BxHxQxK, 0.3, keep_11xQxK)
    assert dropped.dtype == dtype and keep_11xQxK.any() and not keep_11xQxK.all()
    assert (dropped.masked_select(~keep_11xQxK.expand_as(dropped)) == 0).all()
    expected = (a_BxHxQxK.double() * keep_11xQxK / 0.7).to(dtype)
    rtol = {torch.bfloat16: 1.6e-2, torch.float32: 2.4e-7, torch.float64: 4.5e-16}[dtype]  # two roundings
    torch.testing.assert_close(dropped, expected, rtol=rtol, atol=0)
