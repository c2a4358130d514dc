"""The coverage table (``hyla.attention.kernels.coverage.COVERAGE``) against what each backend does.

For every preset: a backend the table lists as covering it runs and equals the direct form (forward and
every gradient, float64, tiny sizes); one it lists as not covering it raises its error naming the cause.
The dtype, ``torch.vmap`` and first-order limits are checked the same way, and the former backend names
still select the same code. The Triton kernel runs under ``@pytest.mark.kernel`` (CUDA, or the interpreter).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from chosen import run_chosen
from hyla.attention import PRESETS, Attention, AttentionConfig, attention_preset
from hyla.attention.backend import AttentionCall, Backend
from hyla.attention.config import BACKEND_ALIASES, BACKENDS
from hyla.attention.dispatch import BY_NAME
from hyla.attention.functional import hypernetwork_attention
from hyla.attention.kernels import (
    COVERAGE,
    CpuKernelUnavailableError,
    FusedUnavailableError,
    covered_presets,
    fused_cpu_unsupported_reason,
    manual_backward_unsupported_reason,
)
from hyla.attention.kernels.coverage import covers_dtype, variant_unsupported_reason
from hyla.train.engines.vmap_rules import HAS_VMAP_RULES  # registers the C kernel's batching rule, as stacking does
from tiny import autograd_node_names, triton_device_or_skip

B, H, Q, K, E, D = 2, 3, 4, 5, 2, 3


#: backend -> the error it raises for a case it does not cover (asked for by name)
BACKEND_ERRORS: dict[str, type[Exception] | None] = {
    "direct": None,
    "chunked": None,
    "manual_backward": ValueError,
    "fused_cpu": CpuKernelUnavailableError,
    "fused": FusedUnavailableError,
}
CPU_BACKENDS = ("direct", "chunked", "manual_backward", "fused_cpu")


def _rel(a: Tensor, b: Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def _inputs(config: AttentionConfig, dtype: torch.dtype, device: torch.device) -> tuple[list[Tensor], Tensor]:
    """Leaves ``[q, k, v, bias(1xHxQxK)(, w_mid)]`` requiring grad, and a causal-with-offset bool mask."""
    gen = torch.Generator().manual_seed(0)
    shapes = [(B, H, Q, E), (B, H, K, E), (B, H, K, D), (1, H, Q, K)]
    if config.value_network == "hyper_deep":
        shapes.append((H, D, D))
    leaves = [torch.randn(*s, generator=gen, dtype=torch.float64).to(device, dtype).requires_grad_() for s in shapes]
    mask = (torch.arange(K)[None, :] <= torch.arange(Q)[:, None] + 1)[None, None].to(device)
    return leaves, mask


def _run(backend: str, config: AttentionConfig, leaves: list[Tensor], mask: Tensor) -> Tensor:
    """``backend`` by the one protocol: its ``covers`` first (its own error where it does not), then the call."""
    q, k, v, bias, *w_mid = leaves
    call = AttentionCall(q, k, v, config, mask, bias, w_mid[0] if w_mid else None, chunk_size=3)
    reason = BY_NAME[backend].covers(call)
    if reason is not None:
        raise BY_NAME[backend].unavailable(reason)
    return BY_NAME[backend](call)


def _check_equals_direct_form(backend: str, config: AttentionConfig, dtype: torch.dtype, device: torch.device) -> None:
    """``backend`` in ``dtype`` against the direct form in float64: output and the gradients of every input."""
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    leaves, mask = _inputs(config, dtype, device)
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    y = _run(backend, config, leaves, mask)
    ref = _run("direct", config, ref_leaves, mask)
    assert y.shape == ref.shape and y.dtype == dtype
    assert _rel(y, ref) < tol
    dy = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    got = torch.autograd.grad(y, leaves, dy.to(device, dtype))
    want = torch.autograd.grad(ref, ref_leaves, dy.to(device))
    for name, a, b in zip(("q", "k", "v", "bias", "w_mid"), got, want):
        assert _rel(a, b) < tol, name


def _skip_without_c_compiler() -> None:
    q = torch.zeros(1, 1, 1, 1)
    reason = fused_cpu_unsupported_reason(attention_preset("hyla"), q, q, q)
    if reason is not None:
        pytest.skip(reason)


def test_the_table_has_every_backend_and_the_aliases_name_backends() -> None:
    assert set(COVERAGE) == set(BACKENDS) - {"auto"} == set(BACKEND_ERRORS) == set(BY_NAME)
    assert set(BACKEND_ALIASES.values()) <= set(BACKENDS) and not set(BACKEND_ALIASES) & set(BACKENDS)


def test_covered_presets_as_documented() -> None:
    assert covered_presets("direct") == covered_presets("chunked") == tuple(PRESETS)
    kernel_presets = tuple(
        name for name, c in PRESETS.items() if c.value_network == "hyper" and c.normalization != "softmax"
    )
    assert "hyla_softmax" not in kernel_presets and "hyla_plus" not in kernel_presets and "hyla" in kernel_presets
    for backend in ("manual_backward", "fused"):
        assert covered_presets(backend) == kernel_presets
    # the C kernel computes a whole query row: softmax over its keys and the linear value network too
    row_presets = tuple(name for name, c in PRESETS.items() if c.value_network != "hyper_deep")
    assert {"softmax", "linear", "hyla_softmax", "hyla"} <= set(row_presets) and "hyla_plus" not in row_presets
    assert covered_presets("fused_cpu") == row_presets


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_cpu_backend_does_what_the_table_says(backend: str, preset: str) -> None:
    config = attention_preset(preset)
    reason = variant_unsupported_reason(backend, config)
    if reason is None:
        if backend == "fused_cpu":
            _skip_without_c_compiler()
        _check_equals_direct_form(backend, config, torch.float64, torch.device("cpu"))
        return
    error = BACKEND_ERRORS[backend]
    assert error is not None, f"{backend} is listed as not covering {preset} but has no error to raise"
    leaves, mask = _inputs(config, torch.float64, torch.device("cpu"))
    with pytest.raises(error, match=r"value_network|normalization"):
        _run(backend, config, leaves, mask)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_cpu_backend_dtypes_as_the_table_says(backend: str, dtype: torch.dtype) -> None:
    config = attention_preset("hyla")
    dtypes = COVERAGE[backend].dtypes
    if dtypes is None or dtype in dtypes:
        if backend == "fused_cpu":
            _skip_without_c_compiler()
        leaves, mask = _inputs(config, dtype, torch.device("cpu"))
        assert _run(backend, config, leaves, mask).dtype == dtype
        return
    error = BACKEND_ERRORS[backend]
    leaves, mask = _inputs(config, dtype, torch.device("cpu"))
    with pytest.raises(error, match="dtype"):  # type: ignore[arg-type]
        _run(backend, config, leaves, mask)


@pytest.mark.parametrize("backend", ["manual_backward", "fused_cpu"])
def test_vmap_as_the_table_says(backend: str) -> None:
    config = attention_preset("hyla")
    if backend == "fused_cpu":
        _skip_without_c_compiler()
    check = {
        "manual_backward": lambda q: manual_backward_unsupported_reason(config, q),
        "fused_cpu": lambda q: fused_cpu_unsupported_reason(config, q, q, q),
    }[backend]
    reasons: list[str | None] = []

    def probe(q: Tensor) -> Tensor:
        reasons.append(check(q))
        return q

    torch.vmap(probe)(torch.randn(2, 1, H, Q, E))
    runs_in_vmap = COVERAGE[backend].vmap and (backend != "fused_cpu" or HAS_VMAP_RULES)
    assert (reasons[0] is None) == runs_in_vmap, reasons


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_first_order_only_as_the_table_says(backend: str) -> None:
    if backend == "fused_cpu":
        _skip_without_c_compiler()
    config = attention_preset("hyla")
    leaves, mask = _inputs(config, torch.float64, torch.device("cpu"))
    y = _run(backend, config, leaves, mask)
    (dq,) = torch.autograd.grad(y.square().sum(), leaves[0], create_graph=True)
    if COVERAGE[backend].first_order_only:
        with pytest.raises(RuntimeError):
            torch.autograd.grad(dq.sum(), leaves[0])
    else:
        assert torch.autograd.grad(dq.sum(), leaves[0])[0].shape == leaves[0].shape


@pytest.mark.parametrize("backend", [*CPU_BACKENDS, "auto"])
def test_attention_dropout_runs_where_the_table_says_and_equals_the_direct_form(backend: str) -> None:
    """Training with dropout: a backend whose entry has ``dropout`` drops the same pairs itself (forward and
    parameter gradients equal the direct form's); any other leaves the step to the direct form (bit-equal)."""
    if backend in ("fused_cpu", "auto"):
        _skip_without_c_compiler()
    torch.manual_seed(0)
    x_BxTxD = torch.randn(2, 6, 12, dtype=torch.float64)
    attn = Attention(12, 3, "hyla", dropout=0.3, relative_position=True, backend=backend).double()
    ref = Attention(12, 3, "hyla", dropout=0.3, relative_position=True, backend="direct").double()
    ref.load_state_dict(attn.state_dict())
    outs = []
    for module in (attn, ref):
        torch.manual_seed(7)  # the same keep-mask
        y = module(x_BxTxD)
        y.square().sum().backward()
        outs.append(y)
    runs_itself = "fused_cpu" if backend == "auto" else backend
    in_kernel = any("fused_cpu_attention" in n for n in autograd_node_names(outs[0]))
    if COVERAGE[runs_itself].dropout and runs_itself != "direct":
        assert in_kernel, autograd_node_names(outs[0])
        assert _rel(outs[0], outs[1]) < 1e-12
        for (name, p), p_ref in zip(attn.named_parameters(), ref.parameters()):
            assert _rel(p.grad, p_ref.grad) < 1e-10, name
    else:
        assert not in_kernel and torch.equal(outs[0], outs[1])
        assert all(torch.equal(p.grad, q.grad) for p, q in zip(attn.parameters(), ref.parameters()))
    assert not torch.equal(outs[1], ref.eval()(x_BxTxD)), "the step did not drop any pair"


@pytest.mark.parametrize("preset", sorted(p for p in PRESETS if variant_unsupported_reason("fused", PRESETS[p])))
def test_fused_refuses_what_the_table_does_not_cover(preset: str) -> None:
    """No Triton or GPU needed: the variant is checked before anything else."""
    config = attention_preset(preset)
    leaves, mask = _inputs(config, torch.float32, torch.device("cpu"))
    with pytest.raises(FusedUnavailableError, match=r"value_network|normalization"):
        _run("fused", config, leaves, mask)


@pytest.fixture(scope="module")
def device() -> torch.device:
    return triton_device_or_skip()


@pytest.mark.kernel
@pytest.mark.parametrize("preset", covered_presets("fused"))
def test_fused_covers_what_the_table_says(device: torch.device, preset: str) -> None:
    _check_equals_direct_form("fused", attention_preset(preset), torch.float32, device)


@pytest.mark.kernel
def test_fused_dtypes_as_the_table_says(device: torch.device) -> None:
    config = attention_preset("hyla")
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        leaves, mask = _inputs(config, dtype, device)
        if dtype in (COVERAGE["fused"].dtypes or ()):
            assert _run("fused", config, leaves, mask).dtype == dtype
        else:
            with pytest.raises(FusedUnavailableError, match="dtype"):
                _run("fused", config, leaves, mask)


@pytest.mark.parametrize(("old", "new"), sorted(BACKEND_ALIASES.items()))
def test_former_backend_names_select_the_same_code(old: str, new: str) -> None:
    """Saved run configs and command lines may say ``reference`` or ``explicit``: same backend, same numbers."""
    torch.manual_seed(0)
    with pytest.warns(DeprecationWarning, match=f"backend='{old}' is deprecated; use backend='{new}'"):
        old_module = Attention(12, 3, "hyla", causal=True, backend=old)
    new_module = Attention(12, 3, "hyla", causal=True, backend=new)
    new_module.load_state_dict(old_module.state_dict())
    assert old_module.backend == new
    x = torch.randn(2, 5, 12)
    assert torch.equal(old_module(x), new_module(x))
    q = torch.randn(1, 2, 3, 4)
    with pytest.warns(DeprecationWarning):
        name_old, y_old = run_chosen(old, q, q, q, attention_preset("hyla"))
    name_new, y_new = run_chosen(new, q, q, q, attention_preset("hyla"))
    assert name_old == name_new and torch.equal(y_old, y_new)


def test_every_backend_in_the_table_follows_the_one_protocol() -> None:
    """One object per backend in ``COVERAGE``, each with ``covers(call)`` and ``backend(call)``: a covered call
    gives the direct form's heads, an uncovered variant a reason that names it."""
    for name, coverage in COVERAGE.items():
        backend = BY_NAME[name]
        assert isinstance(backend, Backend) and backend.name == name
        for preset, config in PRESETS.items():
            leaves, mask = _inputs(config, torch.float64, torch.device("cpu"))
            q, k, v, bias, *w_mid = (t.detach() for t in leaves)
            call = AttentionCall(q, k, v, config, mask, bias, w_mid[0] if w_mid else None, chunk_size=3)
            reason = backend.covers(call)
            variant_reason = variant_unsupported_reason(name, config)
            if variant_reason is not None:
                assert reason == variant_reason, (name, preset)
                continue
            if reason is not None:  # the machine's or the dtype's limits, which the other tests check
                assert not covers_dtype(name, torch.float64) or name in ("fused", "fused_cpu"), (name, reason)
                continue
            ref = hypernetwork_attention(q, k, v, config, mask_Bx1xQxK=mask, bias=bias, w_mid_HxDxD=call.w_mid_HxDxD)
            assert _rel(backend(call), ref[0]) < 1e-10, (name, preset)
        keep = torch.ones(1, 1, Q, K, dtype=torch.bool)
        q, k, v = (torch.randn(B, H, n, w, dtype=torch.float64) for n, w in ((Q, E), (K, E), (K, D)))
        dropping = AttentionCall(q, k, v, attention_preset("hyla"), dropout=0.5, dropout_keep_11xQxK=keep)
        if not coverage.dropout:  # (a machine's limit, e.g. no Triton, may be named first)
            assert backend.covers(dropping) is not None, name


def test_a_forward_chooses_its_backend_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Attention.forward`` and ``hyla.functional.attention`` ask ``choose`` once per call, and ``auto``'s choice
    asks each candidate's ``covers`` at most once."""
    import hyla
    import hyla.attention.dispatch as policy

    chosen: list[str] = []
    covered: list[str] = []
    real_choose = policy.choose

    def counting_choose(requested: str, call: AttentionCall) -> Backend:
        backend = real_choose(requested, call)
        chosen.append(backend.name)
        return backend

    monkeypatch.setattr(policy, "choose", counting_choose)
    for backend in BY_NAME.values():
        real_covers = type(backend).covers

        def counting_covers(self: Backend, call: AttentionCall, real: Callable = real_covers) -> str | None:
            covered.append(self.name)
            return real(self, call)

        monkeypatch.setattr(type(backend), "covers", counting_covers)
    x = torch.randn(2, 5, 12)
    for preset in ("hyla", "softmax", "hyla_plus"):
        chosen.clear()
        covered.clear()
        Attention(12, 3, preset, causal=True)(x)
        assert len(chosen) == 1, preset
        assert len(covered) == len(set(covered)), covered
        q = torch.randn(2, 3, 5, 4)
        chosen.clear()
        hyla.functional.attention(q, q, q, attention="hyla", is_causal=True)
        assert len(chosen) == 1
