"""The C kernel's tanh GELU (``hyla.ops.gelu``) against a float64 reference and torch's own, forward
and gradient, float32 and float64, on random inputs; what the models run; the setting that turns it off."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hyla.models.transformer import MLP, MoE
from hyla.ops import clib
from hyla.ops import gelu as gelu_module
from hyla.ops.gelu import gelu, gelu_path
from tiny import autograd_node_names

pytestmark = pytest.mark.float_sensitive

FP32_ULP = 2.0**-23


def _inputs(n: int, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Values over GELU's whole range: most within a few units, some far out on both sides."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=gen, dtype=torch.float64) * 3
    x[::17] *= 6
    return x.to(dtype), torch.randn(n, generator=gen, dtype=torch.float64).to(dtype)


def _reference(x: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """y and dx of torch's tanh GELU in float64 (an independent implementation of the same function)."""
    x64 = x.double().requires_grad_()
    y = F.gelu(x64, approximate="tanh")
    (dx,) = torch.autograd.grad(y, x64, dy.double())
    return y.detach(), dx


def _error_in_ulps(ours: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor) -> float:
    """The largest |ours - ref| in float32 ulps of ``scale`` (the size of the terms the result is made of)."""
    return ((ours.double() - ref).abs() / (scale.abs().clamp_min(2.0**-20) * FP32_ULP)).max().item()


@pytest.mark.parametrize("n", [1, 7, 8, 4099, 40_000])
def test_float32_forward_and_gradient_within_a_few_ulps_of_float64(n: int) -> None:
    x, dy = _inputs(n, torch.float32)
    y_ref, dx_ref = _reference(x, dy)
    x_grad = x.clone().requires_grad_()
    y = gelu(x_grad, approximate="tanh")
    (dx,) = torch.autograd.grad(y, x_grad, dy)
    assert "GeneratedBackwardFor_hyla_gelu_tanh_cpu_defaultBackward" in autograd_node_names(y)
    # y = x s: error relative to |x|; dx sums terms of size |dy| (1 + |x| u'(x)): error relative to that
    assert _error_in_ulps(y, y_ref, x) <= 4
    dx_scale = dy.double() * (1 + x.double().abs() * (1 + 0.134145 * x.double() ** 2))
    assert _error_in_ulps(dx, dx_ref, dx_scale) <= 8
    # torch's float32 GELU meets the same bounds: the kernel is as close to the function as torch is
    y_torch = F.gelu(x, approximate="tanh")
    assert _error_in_ulps(y_torch, y_ref, x) <= 4


def test_float64_matches_the_reference_and_gradcheck() -> None:
    x, dy = _inputs(1000, torch.float64, seed=1)
    y_ref, dx_ref = _reference(x, dy)
    x_grad = x.clone().requires_grad_()
    y = gelu(x_grad, approximate="tanh")
    (dx,) = torch.autograd.grad(y, x_grad, dy)
    torch.testing.assert_close(y, y_ref, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(dx, dx_ref, rtol=1e-12, atol=1e-12)
    small = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: gelu(t, approximate="tanh"), (small,))


def test_a_value_gives_the_same_bits_wherever_it_sits() -> None:
    """The tail of a pass is padded into one vector: a value's result depends on neither its position nor n."""
    x, _ = _inputs(1003, torch.float32, seed=2)
    whole = gelu(x, approximate="tanh")
    for start in (1, 5, 8, 999):
        assert torch.equal(gelu(x[start:].clone(), approximate="tanh"), whole[start:])


def test_any_layout_and_shape() -> None:
    x, _ = _inputs(6 * 7 * 11, torch.float32, seed=3)
    x_3d = x.view(6, 7, 11).transpose(0, 2)  # not contiguous
    y = gelu(x_3d, approximate="tanh")
    assert y.shape == x_3d.shape
    torch.testing.assert_close(y, gelu(x_3d.contiguous(), approximate="tanh"), rtol=0, atol=0)
    assert gelu(torch.empty(0, 4), approximate="tanh").shape == (0, 4)


def test_vmap_folds_the_runs_into_one_call() -> None:
    """As a stack's vmapped forward calls it, with autograd's backward after (what the stacked engine does)."""
    from hyla.train.engines import vmap_rules  # noqa: F401  (registers the batching rule, as stacking does)

    x, dy = _inputs(3 * 50, torch.float32, seed=4)
    x_Rx50, dy_Rx50 = x.view(3, 50), dy.view(3, 50)
    x_grad = x_Rx50.clone().requires_grad_()
    y = torch.func.vmap(lambda t: gelu(t, approximate="tanh"))(x_grad)
    (dx,) = torch.autograd.grad(y, x_grad, dy_Rx50)
    x_plain = x_Rx50.clone().requires_grad_()
    y_plain = gelu(x_plain, approximate="tanh")
    (dx_plain,) = torch.autograd.grad(y_plain, x_plain, dy_Rx50)
    assert torch.equal(y, y_plain) and torch.equal(dx, dx_plain)


def test_the_models_use_it_and_off_gives_torchs_gelu_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    mlp, moe = MLP(8, 16, "gelu", "tanh"), MoE(8, 16, num_experts=3, top_k=2, gelu_approximate="tanh")
    x = torch.randn(2, 5, 8)
    for module in (mlp, moe):
        assert "GeneratedBackwardFor_hyla_gelu_tanh_cpu_defaultBackward" in autograd_node_names(module(x))
    erf = MLP(8, 16, "gelu", "none")
    assert "GeneratedBackwardFor_hyla_gelu_tanh_cpu_defaultBackward" not in autograd_node_names(erf(x))
    fast = mlp(x)
    monkeypatch.setenv("HYLA_FAST_GELU", "off")
    assert gelu_path() == "torch"
    slow = mlp(x)
    assert "GeneratedBackwardFor_hyla_gelu_tanh_cpu_defaultBackward" not in autograd_node_names(slow)
    assert torch.equal(slow, mlp.fc2(F.gelu(mlp.fc1(x), approximate="tanh")))
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-6)
    assert not torch.equal(fast, slow) or fast.abs().max() == 0  # two implementations, not one called twice
    monkeypatch.setenv("HYLA_FAST_GELU", "fast")
    with pytest.raises(ValueError, match=r"HYLA_FAST_GELU='fast' is not valid; allowed values: auto, off"):
        mlp(x)


def test_without_a_compiler_torchs_gelu_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clib, "_LIBRARY", None)
    monkeypatch.setattr(clib, "_LOAD_ERROR", None)
    monkeypatch.setattr(clib, "_compiler", lambda: None)
    assert gelu_path() == "torch"
    x = torch.randn(4, 6)
    assert torch.equal(gelu(x, approximate="tanh"), F.gelu(x, approximate="tanh"))
    assert gelu_module.gelu_path() == "torch"
