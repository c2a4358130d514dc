"""``key_normalization="count"`` (ours): every sum over keys divided by the number of keys the query sees, against
the naive loop that divides pair by pair, on the backends that compute it; the others refuse it by name."""

from __future__ import annotations

import pytest
import torch

from chosen import run_chosen
from hyla.attention import PRESETS, Attention, AttentionConfig, KVCache, attention_preset
from hyla.attention.backend import AttentionCall
from hyla.attention.dispatch import BY_NAME, choose
from hyla.attention.kernels.coverage import COVERAGE
from hyla.attention.naive import naive_attention
from hyla.models import TransformerConfig

COUNTED = sorted(name for name, config in PRESETS.items() if config.normalization != "softmax")
COMPUTING = sorted(name for name, cov in COVERAGE.items() if "count" in cov.key_normalizations)
REFUSING = sorted(name for name, cov in COVERAGE.items() if "count" not in cov.key_normalizations)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def make(preset: str, backend: str = "direct", dtype: torch.dtype = torch.float64, **kw: object) -> Attention:
    torch.manual_seed(0)
    m = Attention(6, 3, preset, head_dim_qk=2, head_dim_v=2, key_normalization="count", backend=backend, **kw)
    with torch.no_grad():  # non-zero biases so the test sees them
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return m.to(dtype)


PADDING = torch.tensor([[False, False, False, True, True], [False, True, False, False, False]])


def test_the_backends_split_into_computing_and_refusing() -> None:
    assert COMPUTING == ["chunked", "direct"]
    assert set(REFUSING) == set(COVERAGE) - set(COMPUTING)


@pytest.mark.parametrize("backend", COMPUTING)
@pytest.mark.parametrize("preset", COUNTED)
@pytest.mark.parametrize("masks", ["causal", "padding", "causal_padding"])
def test_counted_sums_match_the_naive_loop_forward_and_grad(preset: str, backend: str, masks: str) -> None:
    causal = masks.startswith("causal")
    m = make(preset, backend, causal=causal, chunk_size=2, relative_position=causal, num_buckets=4, max_distance=4)
    x = torch.randn(2, 5, 6, dtype=torch.float64, requires_grad=True)
    key_mask = ~PADDING if "padding" in masks else None
    out = m(x, key_mask=key_mask)
    ref, ref_latent = naive_attention(m, x, key_padding_mask=None if key_mask is None else ~key_mask)
    assert rel_err(out, ref) < 1e-10
    g = torch.randn_like(out)
    params = [x, *m.parameters()]
    for got, want in zip(torch.autograd.grad((out * g).sum(), params), torch.autograd.grad((ref * g).sum(), params)):
        torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-12)
    # the reference divides: its code is the plain code over each query's number of visible keys
    plain = Attention(
        6,
        3,
        preset,
        head_dim_qk=2,
        head_dim_v=2,
        causal=causal,
        relative_position=causal,
        num_buckets=4,
        max_distance=4,
    ).double()
    plain.load_state_dict(m.state_dict())
    _, plain_latent = plain(x, key_mask=key_mask, return_latent=True)
    visible = torch.ones(2, 1, 5, 5, dtype=torch.bool)
    if causal:
        visible = visible & torch.ones(5, 5, dtype=torch.bool).tril()
    if key_mask is not None:
        visible = visible & key_mask[:, None, None, :]
    count = visible.sum(-1, keepdim=True).clamp(min=1).double()
    torch.testing.assert_close(ref_latent, plain_latent / count, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("backend", COMPUTING)
@pytest.mark.parametrize("preset", ["linear", "hyla"])
def test_counted_sums_in_low_precision_stay_within_tolerance(
    preset: str, backend: str, dtype: torch.dtype, tol: float
) -> None:
    exact = make(preset, "direct", causal=True)
    low = make(preset, backend, dtype, causal=True, chunk_size=3)
    x = torch.randn(2, 7, 6, dtype=torch.float64)
    x_low = x.to(dtype).requires_grad_(True)
    x_exact = x_low.detach().double().requires_grad_(True)
    key_mask = torch.tensor([[True] * 5 + [False] * 2, [True, False] + [True] * 5])
    out_low, out_exact = low(x_low, key_mask=key_mask), exact(x_exact, key_mask=key_mask)
    assert rel_err(out_low.double(), out_exact) < tol
    g = torch.randn_like(out_exact)
    (grad_low,) = torch.autograd.grad((out_low * g.to(dtype)).sum(), x_low)
    (grad_exact,) = torch.autograd.grad((out_exact * g).sum(), x_exact)
    assert rel_err(grad_low.double(), grad_exact) < tol


@pytest.mark.parametrize("backend", REFUSING)
def test_the_kernels_refuse_counted_sums_by_name(backend: str) -> None:
    config = attention_preset("hyla", key_normalization="count")
    q, k, v = (torch.randn(1, 2, 4, 4) for _ in range(3))
    call = AttentionCall(q, k, v, config)
    reason = choose("direct", call).covers(call)
    assert reason is None
    assert "key_normalization='count'" in (BY_NAME[backend].covers(call) or "")
    if backend != "fused":  # the Triton kernel needs CUDA, which the refusal need not wait for
        with pytest.raises((ValueError, NotImplementedError), match="key_normalization='count'"):
            run_chosen(backend, q, k, v, config)


def test_auto_leaves_counted_sums_to_the_direct_form() -> None:
    # head dims of 4: auto would pick the C kernel for the plain sums
    q, k, v = (torch.randn(2, 4, 6, 4) for _ in range(3))
    mask = torch.ones(6, 6, dtype=torch.bool).tril()[None, None]
    name, y = run_chosen("auto", q, k, v, attention_preset("hyla", key_normalization="count"), mask=mask)
    assert name == "direct"
    _, want = run_chosen("direct", q, k, v, attention_preset("hyla", key_normalization="count"), mask=mask)
    torch.testing.assert_close(y, want)
    _, plain = run_chosen("direct", q, k, v, attention_preset("hyla"), mask=mask)
    assert not torch.allclose(y, plain)


@pytest.mark.parametrize("preset", ["linear", "hyla"])
def test_cached_decoding_counts_the_cached_keys(preset: str) -> None:
    m = make(preset, causal=True, rope=True).eval()
    x = torch.randn(2, 6, 6, dtype=torch.float64)
    full = m(x)
    cache = KVCache()
    steps = [m(x[:, :3], cache=cache)] + [m(x[:, t : t + 1], cache=cache) for t in range(3, 6)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


def test_softmax_with_counted_sums_is_refused_naming_the_allowed_value() -> None:
    with pytest.raises(ValueError, match="with normalization='softmax' the allowed value is 'none'"):
        AttentionConfig("softmax", "linear", key_normalization="count")
    with pytest.raises(ValueError, match="allowed values: none, count"):
        attention_preset("hyla", key_normalization="sum")
    with pytest.raises(ValueError, match="allowed value is 'none'"):
        TransformerConfig(vocab_size=10, output_dim=10, attention="hyla_softmax", key_normalization="count").validate()
