"""The routed mixture of experts (``hyla.ops.moe``) against the dense reference, forward and gradients, float64,
float32 and bfloat16, on random inputs; which form the model runs where; the setting that keeps the dense one."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from hyla.models.transformer import MoE
from hyla.ops.moe import ExpertWeights, Routing, moe_dense, moe_experts, moe_path, moe_routed
from tiny import autograd_node_names

pytestmark = pytest.mark.float_sensitive

#: relative error (norm of the difference / norm of the float64 value) a float32 result may have
FP32_TOL = 1e-5


def _problem(dtype: torch.dtype, experts: int = 5, top_k: int = 2, seed: int = 0, used: int | None = None) -> list:
    """Tokens routed to ``top_k`` distinct experts each (among the first ``used``), renormalized weights, and
    random expert parameters (biases not zero), as leaves that take gradients."""
    gen = torch.Generator().manual_seed(seed)
    n, d, m = 67, 12, 24
    logits = torch.randn(n, used or experts, generator=gen, dtype=torch.float64)
    top_w, top_i = logits.softmax(-1).topk(top_k, dim=-1)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    w1 = torch.randn(experts, d, m, generator=gen, dtype=torch.float64) * d**-0.5
    b1 = torch.randn(experts, m, generator=gen, dtype=torch.float64) * 0.1
    w2 = torch.randn(experts, m, d, generator=gen, dtype=torch.float64) * m**-0.5
    b2 = torch.randn(experts, d, generator=gen, dtype=torch.float64) * 0.1
    leaves = [t.to(dtype).requires_grad_() for t in (x, top_w / top_w.sum(-1, keepdim=True), w1, b1, w2, b2)]
    return [*leaves[:2], top_i, *leaves[2:]]


def _call(fn: Callable[..., Tensor], x: Tensor, weights: Tensor, experts: Tensor, *params: Tensor) -> Tensor:
    return fn(x, Routing(weights, experts), ExpertWeights(*params), approximate="tanh")


def _forward_and_grads(fn: Callable[..., Tensor], args: list, dy: Tensor) -> list[Tensor]:
    y = _call(fn, *args)
    leaves = [a for a in args if a.requires_grad]
    return [y.detach(), *torch.autograd.grad(y, leaves, dy.to(y.dtype))]


def _rel_err(ours: Tensor, ref: Tensor) -> float:
    return ((ours.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("used", [None, 3], ids=["all_experts", "two_idle"])
def test_routed_equals_dense_forward_and_gradients(used: int | None) -> None:
    dy = torch.randn(67, 12, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ref = _forward_and_grads(moe_dense, _problem(torch.float64, used=used), dy)
    names = ["y", "dx", "dweights", "dw1", "db1", "dw2", "db2"]
    for name, ours, exact in zip(names, _forward_and_grads(moe_routed, _problem(torch.float64, used=used), dy), ref):
        torch.testing.assert_close(ours, exact, rtol=1e-12, atol=1e-12, msg=f"float64 {name}")
    for name, ours, exact in zip(names, _forward_and_grads(moe_routed, _problem(torch.float32, used=used), dy), ref):
        assert _rel_err(ours, exact) < FP32_TOL, name
    if used is not None:  # experts no token chose: no gradient, in both forms
        assert ref[3][used:].abs().max() == 0 and ref[5][used:].abs().max() == 0


def test_routed_in_bfloat16_is_as_close_to_float64_as_dense_in_bfloat16() -> None:
    dy = torch.randn(67, 12, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    exact = _forward_and_grads(moe_dense, _problem(torch.float64), dy)
    routed = _forward_and_grads(moe_routed, _problem(torch.bfloat16), dy)
    dense = _forward_and_grads(moe_dense, _problem(torch.bfloat16), dy)
    for r, d, e in zip(routed, dense, exact):
        assert r.dtype == torch.bfloat16
        assert _rel_err(r, e) < 2 * _rel_err(d, e) + 1e-3  # bfloat16 keeps 8 bits: about 4e-3 a value


def test_moe_experts_routes_on_a_cpu_and_the_setting_keeps_dense(monkeypatch: pytest.MonkeyPatch) -> None:
    args = _problem(torch.float32)
    assert moe_path() == "routed"
    assert torch.equal(_call(moe_experts, *args), _call(moe_routed, *args))
    monkeypatch.setenv("HYLA_MOE_DISPATCH", "dense")
    assert moe_path() == "dense"
    assert torch.equal(_call(moe_experts, *args), _call(moe_dense, *args))
    monkeypatch.setenv("HYLA_MOE_DISPATCH", "sparse")
    with pytest.raises(ValueError, match=r"HYLA_MOE_DISPATCH='sparse' is not valid; allowed values: auto, dense"):
        _call(moe_experts, *args)


def test_under_vmap_it_stays_dense_and_equals_each_run_alone() -> None:
    stacked = [
        torch.stack([a.detach() for a in arrays])
        for arrays in zip(_problem(torch.float32, seed=0), _problem(torch.float32, seed=1))
    ]
    y = torch.vmap(lambda *a: _call(moe_experts, *a))(*stacked)
    for run in range(2):
        alone = _call(moe_dense, *(s[run] for s in stacked))
        torch.testing.assert_close(y[run], alone, rtol=1e-5, atol=1e-6)


def test_the_model_layer_matches_the_dense_form_with_its_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    moe = MoE(16, 32, num_experts=5, top_k=2, gelu_approximate="tanh")
    with torch.no_grad():  # biases not zero, so an expert's bias reaches only its own tokens
        moe.b1_ExM.normal_(0, 0.1)
        moe.b2_ExD.normal_(0, 0.1)
    x = torch.randn(4, 9, 16)
    grads, paths = [], []
    for setting in ("auto", "dense"):
        monkeypatch.setenv("HYLA_MOE_DISPATCH", setting)
        moe.zero_grad()
        y = moe(x)
        paths.append("IndexAddBackward0" in autograd_node_names(y))  # the routed form adds each expert's rows back
        (y * torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum().backward()
        grads.append([y.detach(), *(p.grad.clone() for p in moe.parameters())])
    assert paths == [True, False]
    for routed, dense in zip(*grads):
        assert _rel_err(routed, dense) < FP32_TOL
