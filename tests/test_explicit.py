"""The explicit-backward HYLA form (``backend="explicit"``, ``auto`` on CPU) against the direct form."""

from __future__ import annotations

import pytest
import torch

from hyla.attention import Attention, attention_preset
from hyla.attention.functional import hypernetwork_attention
from hyla.attention.kernels import dispatch, explicit_hypernetwork_attention
from hyla.attention.kernels.explicit import explicit_unsupported_reason

B, H, Q, K, E, D = 3, 5, 7, 9, 3, 4
MASKS = {
    "none": None,
    "random_Bx1xQxK": lambda: torch.rand(B, 1, Q, K) > 0.3,
    "causal_1x1xQxK": lambda: (torch.arange(K)[None] <= torch.arange(Q)[:, None] + 2)[None, None],
    "padding_Bx1x1xK": lambda: torch.rand(B, 1, 1, K) > 0.3,
    "QxK": lambda: torch.rand(Q, K) > 0.3,
}
BIAS_SHAPES = {"none": None, "1xHxQxK": (1, H, Q, K), "HxQxK": (H, Q, K), "Hx1xK": (H, 1, K), "BxHxQxK": (B, H, Q, K)}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def _compare(config, mask, bias_shape, dtype=torch.float64, gen_seed=0) -> list[float]:
    """Relative errors of y and every gradient, explicit (in ``dtype``) vs the direct form in float64."""
    gen = torch.Generator().manual_seed(gen_seed)
    shapes = [(B, H, Q, E), (B, H, K, E), (B, H, K, D)] + ([bias_shape] if bias_shape else [])
    base = [torch.randn(*s, generator=gen, dtype=torch.float64) for s in shapes]
    ref_in = [t.clone().requires_grad_() for t in base]
    got_in = [t.to(dtype).requires_grad_() for t in base]
    bias_ref = ref_in[3] if bias_shape else None
    bias_got = got_in[3] if bias_shape else None
    y_ref, _ = hypernetwork_attention(*ref_in[:3], config, mask_Bx1xQxK=mask, bias=bias_ref)
    y_got = explicit_hypernetwork_attention(*got_in[:3], config, mask_Bx1xQxK=mask, bias=bias_got)
    dy = torch.randn(y_ref.shape, generator=gen, dtype=torch.float64)
    g_ref = torch.autograd.grad(y_ref, ref_in, dy)
    g_got = torch.autograd.grad(y_got, got_in, dy.to(dtype))
    return [_rel(y_got, y_ref)] + [_rel(a, b) for a, b in zip(g_got, g_ref)]


@pytest.mark.parametrize("normalization", ["rms_head", "none"])
@pytest.mark.parametrize("phi", ["relu", "silu", "gelu", "sigmoid", "tanh", "identity"])
def test_equals_direct_form_every_phi(normalization: str, phi: str) -> None:
    config = attention_preset("hyla", normalization=normalization, nonlinearity=phi)
    errors = _compare(config, MASKS["random_Bx1xQxK"](), (1, H, Q, K))
    assert max(errors) < 1e-12, errors


@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize("bias_name", list(BIAS_SHAPES))
def test_equals_direct_form_every_mask_and_bias(mask_name: str, bias_name: str) -> None:
    mask = MASKS[mask_name]() if MASKS[mask_name] else None
    errors = _compare(attention_preset("hyla"), mask, BIAS_SHAPES[bias_name])
    assert max(errors) < 1e-12, errors


def test_bfloat16_and_float32_tolerances() -> None:
    config = attention_preset("hyla")
    mask = MASKS["causal_1x1xQxK"]()
    assert max(_compare(config, mask, (1, H, Q, K), torch.float32)) < 1e-4
    assert max(_compare(config, mask, (1, H, Q, K), torch.bfloat16)) < 2e-2


def test_gradcheck() -> None:
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, n, 2, generator=gen, dtype=torch.float64, requires_grad=True) for n in (4, 5, 5))
    bias = torch.randn(3, 4, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(2, 1, 4, 5, generator=gen) > 0.2
    config = attention_preset("hyla_gelu")
    assert torch.autograd.gradcheck(
        lambda *t: explicit_hypernetwork_attention(*t[:3], config, mask_Bx1xQxK=mask, bias=t[3]), (q, k, v, bias)
    )


def test_auto_uses_it_on_cpu_and_module_matches_reference() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 6, 20)
    auto = Attention(20, 4, "hyla", relative_position=True, causal=True)
    ref = Attention(20, 4, "hyla", relative_position=True, causal=True, backend="reference")
    ref.load_state_dict(auto.state_dict())
    q, k, v = auto.project(x, None, 0)
    y = dispatch("auto", q, k, v, auto.config, bias=torch.zeros(4, 6, 6))
    assert y is not None and "ExplicitHyla" in type(y.grad_fn).__name__
    out_auto, out_ref = auto(x), ref(x)
    assert _rel(out_auto, out_ref) < 1e-5
    out_auto.square().sum().backward()
    out_ref.square().sum().backward()
    for (name, p), p_ref in zip(auto.named_parameters(), ref.parameters()):
        assert _rel(p.grad, p_ref.grad) < 1e-4, name


@pytest.mark.parametrize("preset", ["hyla_softmax", "hyla_plus", "softmax", "linear"])
def test_uncovered_presets_fall_back_or_raise(preset: str) -> None:
    config = attention_preset(preset)
    q, k, v = (torch.randn(1, 2, 3, 4) for _ in range(3))
    assert explicit_unsupported_reason(config) is not None
    if config.is_hyper:
        assert dispatch("auto", q, k, v, config) is None  # the direct form
    with pytest.raises(ValueError, match=r"value_network|normalization"):
        explicit_hypernetwork_attention(q, k, v, config)


def test_inside_vmap_auto_uses_the_direct_form() -> None:
    config = attention_preset("hyla")
    q, k, v = (torch.randn(2, 1, 3, 4, 2) for _ in range(3))

    def one(q, k, v):
        y = dispatch("auto", q, k, v, config)
        return hypernetwork_attention(q, k, v, config)[0] if y is None else y

    stacked = torch.vmap(one)(q, k, v)
    for r in range(2):
        assert _rel(stacked[r], hypernetwork_attention(q[r], k[r], v[r], config)[0]) < 1e-6


def test_double_backward_raises() -> None:
    q, k, v = (torch.randn(1, 2, 3, 2, dtype=torch.float64, requires_grad=True) for _ in range(3))
    y = explicit_hypernetwork_attention(q, k, v, attention_preset("hyla"))
    (dq,) = torch.autograd.grad(y.sum(), q, create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(dq.sum(), q)


def test_bad_backend_names_the_choices() -> None:
    with pytest.raises(ValueError, match="explicit"):
        Attention(8, 2, "hyla", backend="nope")


def test_cpu_allocator_tuning_applies_on_glibc_and_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    import platform

    from hyla.runtime import tune_cpu_allocator

    monkeypatch.setenv("HYLA_TUNE_MALLOC", "0")
    assert tune_cpu_allocator() is False
    monkeypatch.setenv("HYLA_TUNE_MALLOC", "1")
    expected = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert tune_cpu_allocator() is expected
