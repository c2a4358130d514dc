"""``key_normalization="count"`` (ours): the sum over keys divided by the number of keys the query sees, against
the naive loop, which divides each query's sum, and against the plain module divided explicitly; on every
backend (``attend`` divides what any backend summed), with causal and padding masks."""

from __future__ import annotations

import pytest
import torch

from hyla.attention import PRESETS, Attention, AttentionConfig, KVCache, attention_preset
from hyla.attention.backend import AttentionCall
from hyla.attention.dispatch import BY_NAME
from hyla.attention.kernels.coverage import COVERAGE, covered_presets
from hyla.attention.naive import naive_attention
from hyla.models import TransformerConfig

COUNTED = sorted(name for name, config in PRESETS.items() if config.normalization != "softmax")
#: every backend with the counted presets it covers
CASES = [
    pytest.param(backend, preset, marks=[pytest.mark.kernel] if backend == "fused" else [])  # the Triton tier
    for backend in sorted(COVERAGE)
    for preset in COUNTED
    if preset in covered_presets(backend)
]
PADDING = torch.tensor([[True, True, True, False, False], [True, False, True, True, True]])  # True = attend


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def make(preset: str, key_normalization: str = "count", **kw: object) -> Attention:
    torch.manual_seed(0)
    options = dict(head_dim_qk=2, head_dim_v=2, relative_position=True, num_buckets=4, max_distance=4)
    m = Attention(6, 3, preset, key_normalization=key_normalization, **{**options, **kw})  # type: ignore[arg-type]
    with torch.no_grad():  # non-zero biases so the test sees them
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return m


def skip_unless_runs(backend: str, preset: str, dtype: torch.dtype) -> None:
    q = torch.zeros(2, 3, 5, 2, dtype=dtype)
    call = AttentionCall(q, q, q, attention_preset(preset, key_normalization="count"), mask=PADDING[:, None, None])
    reason = BY_NAME[backend].covers(call)
    if reason is not None:
        pytest.skip(f"{backend} does not run here: {reason}")


@pytest.mark.parametrize("masks", ["causal", "padding", "causal_padding"])
@pytest.mark.parametrize("backend, preset", CASES)
def test_counted_sum_matches_the_naive_loop_and_the_explicit_divide(backend: str, preset: str, masks: str) -> None:
    dtype = torch.float64 if backend != "fused" else torch.float32
    skip_unless_runs(backend, preset, dtype)
    causal = masks.startswith("causal")
    key_mask = PADDING if "padding" in masks else None
    m = make(preset, causal=causal, backend=backend, chunk_size=2).to(dtype)
    x = torch.randn(2, 5, 6, dtype=dtype, requires_grad=True)
    out = m(x, key_mask=key_mask)
    ref, _ = naive_attention(m, x, key_padding_mask=None if key_mask is None else ~key_mask)
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    assert rel_err(out, ref) < tol
    g = torch.randn_like(out)
    params = [x, *m.parameters()]
    for got, want in zip(torch.autograd.grad((out * g).sum(), params), torch.autograd.grad((ref * g).sum(), params)):
        assert rel_err(got, want) < 10 * tol
    # explicitly: out = W (y / n) + b, so (out - b) * n is the plain module's output less its bias
    plain = make(preset, "none", causal=causal, backend="direct").to(dtype)
    plain.load_state_dict(m.state_dict())
    visible = torch.ones(2, 5, 5, dtype=torch.bool)
    if causal:
        visible = visible & torch.ones(5, 5, dtype=torch.bool).tril()
    if key_mask is not None:
        visible = visible & key_mask[:, None, :]
    count = visible.sum(-1, keepdim=True).clamp(min=1).to(dtype)
    b = m.out_proj.bias
    assert rel_err((out - b) * count, plain(x, key_mask=key_mask) - b) < tol


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("backend", ["direct", "chunked"])
@pytest.mark.parametrize("preset", ["linear", "hyla"])
def test_counted_sum_in_low_precision_stays_within_tolerance(
    preset: str, backend: str, dtype: torch.dtype, tol: float
) -> None:
    exact = make(preset, causal=True).double()
    low = make(preset, causal=True, backend=backend, chunk_size=3).to(dtype)
    x_low = torch.randn(2, 5, 6).to(dtype).requires_grad_(True)
    x_exact = x_low.detach().double().requires_grad_(True)
    out_low, out_exact = low(x_low, key_mask=PADDING), exact(x_exact, key_mask=PADDING)
    assert rel_err(out_low, out_exact) < tol
    g = torch.randn_like(out_exact)
    (grad_low,) = torch.autograd.grad((out_low * g.to(dtype)).sum(), x_low)
    (grad_exact,) = torch.autograd.grad((out_exact * g).sum(), x_exact)
    assert rel_err(grad_low, grad_exact) < tol


@pytest.mark.parametrize("preset", ["linear", "hyla", "hyla_plus"])
def test_the_generated_value_network_takes_the_mean_over_keys(preset: str) -> None:
    m = make(preset, causal=True).double()
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    assert rel_err(m.value_network_weights(x, key_mask=PADDING)(x), m(x, key_mask=PADDING)) < 1e-10


@pytest.mark.parametrize("preset", ["linear", "hyla"])
def test_cached_decoding_counts_the_cached_keys(preset: str) -> None:
    m = make(preset, causal=True, rope=True).double().eval()
    x = torch.randn(2, 6, 6, dtype=torch.float64)
    full = m(x)
    cache = KVCache()
    steps = [m(x[:, :3], cache=cache)] + [m(x[:, t : t + 1], cache=cache) for t in range(3, 6)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


def test_softmax_with_a_counted_sum_is_refused_naming_the_allowed_value() -> None:
    with pytest.raises(ValueError, match="with normalization='softmax' the allowed value is 'none'"):
        AttentionConfig("softmax", "linear", key_normalization="count")
    with pytest.raises(ValueError, match="allowed values: none, count"):
        attention_preset("hyla", key_normalization="sum")
    with pytest.raises(ValueError, match="allowed value is 'none'"):
        TransformerConfig(vocab_size=10, output_dim=10, attention="hyla_softmax", key_normalization="count").validate()
