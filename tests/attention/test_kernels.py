"""Fused (Triton) and chunked HYLA kernels against the direct form, forward and every gradient.

Kernel tests (``@pytest.mark.kernel``) run on CUDA when there is one, else on CPU under the Triton
interpreter (``TRITON_INTERPRET=1``, as ``make test`` sets it) at tiny sizes; they skip with a reason
when Triton is missing or neither is available. Sizes are deliberately not multiples of the 16-wide
tiles. The reference runs in float64 on the same (upcast) inputs; errors are ``||out - ref|| / ||ref||``.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor

from chosen import run_chosen
from hyla.attention import Attention, attention_preset
from hyla.attention.backend import AttentionCall
from hyla.attention.config import NONLINEARITIES, AttentionConfig
from hyla.attention.dispatch import cuda_kernel_pays, fused_self_test
from hyla.attention.functional import hypernetwork_attention
from hyla.attention.kernels import (
    FusedUnavailableError,
    chunked_hypernetwork_attention,
    fused_hypernetwork_attention,
    fused_unsupported_reason,
)
from tiny import triton_device_or_skip

TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 1e-2}


def rel_err(out: Tensor, ref: Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


@pytest.fixture(scope="module")
def device() -> torch.device:
    return triton_device_or_skip()


@dataclass(frozen=True)
class Case:
    b: int = 2
    h: int = 3
    q: int = 21
    k: int = 19
    e: int = 4
    d: int = 5
    bias: tuple[int, ...] | None = None  # the bias's shape (broadcastable to b x h x q x k); None: no bias
    mask: str | None = None  # None | "causal" | "padding" | "both" | "empty_row"


def make_inputs(
    case: Case, dtype: torch.dtype, device: torch.device, seed: int = 0, bias_dtype: torch.dtype | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor | None]:
    """Random q, k, v (``dtype``, requiring grad), bias (``bias_dtype``, requiring grad) and bool mask."""
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype).requires_grad_()

    q, k, v = (
        rnd(case.b, case.h, case.q, case.e),
        rnd(case.b, case.h, case.k, case.e),
        rnd(case.b, case.h, case.k, case.d),
    )
    bias = None
    if case.bias is not None:
        bias = torch.randn(*case.bias, generator=gen).to(device=device, dtype=bias_dtype or torch.float32)
        bias.requires_grad_()
    mask = None
    if case.mask is not None:
        causal = torch.arange(case.k)[None, :] <= torch.arange(case.q)[:, None] + (case.k - case.q)
        keep = torch.ones(case.b, case.k, dtype=torch.bool)
        keep[-1, 2:5] = False  # padded keys of the last sequence
        if case.mask == "causal":
            mask = causal[None, None]
        elif case.mask == "padding":
            mask = keep[:, None, None, :]
        elif case.mask == "both":
            mask = causal[None, None] & keep[:, None, None, :]
        elif case.mask == "empty_row":  # one query sees no key at all
            mask = (causal[None, None] & keep[:, None, None, :]).clone()
            mask[0, 0, 3, :] = False
        mask = mask.to(device)
    return q, k, v, bias, mask


def check_against_reference(
    case: Case, config: AttentionConfig, dtype: torch.dtype, device: torch.device, grads: bool = True
) -> None:
    q, k, v, bias, mask = make_inputs(case, dtype, device)
    y = fused_hypernetwork_attention(q, k, v, config, mask_Bx1xQxK=mask, bias=bias)
    assert y.shape == (case.b, case.h, case.q, case.d) and y.dtype == dtype
    inputs = [t for t in (q, k, v, bias) if t is not None]
    ref_inputs = [t.detach().double().requires_grad_() for t in inputs]
    q64, k64, v64 = ref_inputs[:3]
    b64 = ref_inputs[3] if bias is not None else None
    ref, _ = hypernetwork_attention(q64, k64, v64, config, mask_Bx1xQxK=mask, bias=b64)
    tol = TOL[dtype]
    assert rel_err(y, ref) < tol, f"forward: {rel_err(y, ref):.2e}"
    if not grads:
        return
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(device=device, dtype=dtype)
    got = torch.autograd.grad(y, inputs, g)
    want = torch.autograd.grad(ref, ref_inputs, g.double())
    for name, a, b in zip(("q", "k", "v", "bias"), got, want):
        assert a.shape == b.shape and a.dtype == (dtype if name != "bias" else torch.float32)
        assert torch.isfinite(a).all(), name
        assert rel_err(a, b) < tol, f"d{name}: {rel_err(a, b):.2e}"


# ------------------------------------------------------------------------------------------ fused kernel
@pytest.mark.kernel
@pytest.mark.parametrize("phi", NONLINEARITIES)
def test_fused_every_nonlinearity_with_bias_and_mask(device: torch.device, phi: str) -> None:
    """RMSHead, relative-position-like bias 1xHxQxK, causal + key padding, Q != K, tiles with tails."""
    case = Case(bias=(1, 3, 21, 19), mask="both")
    check_against_reference(case, attention_preset("hyla", nonlinearity=phi), torch.float32, device)


@pytest.mark.kernel
@pytest.mark.parametrize(
    ("preset", "case"),
    [
        ("hyla", Case()),  # bidirectional, no bias, no mask
        ("hyla_no_rmshead", Case(bias=(2, 3, 21, 19), mask="padding")),  # normalization none, per-batch bias
        ("hyla_no_nonlinearity_no_rmshead", Case(q=17, k=40, mask="causal")),  # 3 key tiles, some skipped
        ("hyla", Case(b=1, h=1, q=9, k=33, e=2, d=2, bias=(1, 9, 33))),  # one head, 3-D bias, smallest dims
        ("hyla", Case(b=3, h=16, q=18, k=17, e=8, d=16, mask="empty_row", bias=(1, 1, 18, 17))),
        ("hyla_gelu", Case(b=1, h=32, q=5, k=7, e=3, d=6, bias=(1, 32, 1, 7))),  # bias over keys only
    ],
    ids=["plain", "no_rmshead", "causal_3_tiles", "one_head", "16_heads_empty_row", "32_heads"],
)
def test_fused_options_fp32(device: torch.device, preset: str, case: Case) -> None:
    check_against_reference(case, attention_preset(preset), torch.float32, device)


@pytest.mark.kernel
@pytest.mark.parametrize(("e", "d"), [(128, 3), (2, 128)])
def test_fused_largest_head_dims(device: torch.device, e: int, d: int) -> None:
    """Head dims up to 128 are computed right, or, on a GPU whose shared memory the float32 tiles
    outgrow (an H100's 227 KiB, measured), refused with FusedUnavailableError saying so; ``auto`` then
    falls back to the direct form. The interpreter has no shared-memory limit: there it must compute."""
    case = Case(b=1, h=2, q=17, k=5, e=e, d=d, bias=(1, 2, 17, 5), mask="causal")
    try:
        check_against_reference(case, attention_preset("hyla"), torch.float32, device)
    except FusedUnavailableError as err:
        assert device.type == "cuda", "only a GPU's shared memory can refuse a supported head dim"
        assert "bytes of shared memory" in str(err) and f"E={e}, D={d}" in str(err)


@pytest.mark.kernel
@pytest.mark.parametrize("phi", ["relu", "silu"])
def test_fused_bfloat16(device: torch.device, phi: str) -> None:
    """bf16 inputs (fp32 bias), fp32 accumulation: relative error < 2e-2 against float64."""
    case = Case(b=2, h=16, q=33, k=18, e=8, d=20, bias=(1, 16, 33, 18), mask="both")
    check_against_reference(case, attention_preset("hyla", nonlinearity=phi), torch.bfloat16, device)


@pytest.mark.kernel
def test_fused_float16_forward(device: torch.device) -> None:
    check_against_reference(Case(mask="causal"), attention_preset("hyla"), torch.float16, device, grads=False)


@pytest.mark.kernel
def test_fused_custom_op_registration(device: torch.device) -> None:
    """Schema, fake tensor, autograd registration and AOT dispatch of ``hyla::fused_attention``."""
    q, k, v, bias, mask = make_inputs(
        Case(b=1, h=2, q=5, k=6, e=3, d=4, bias=(1, 2, 5, 6), mask="both"), torch.float32, device
    )
    args = (q, k, v, bias, mask, "rms_head", "relu", 1e-6)
    torch.library.opcheck(torch.ops.hyla.fused_attention.default, args)


@pytest.mark.kernel
def test_fused_through_torch_compile(device: torch.device) -> None:
    """``torch.compile`` traces the custom op (fake kernel) in the forward and the backward."""
    cfg = attention_preset("hyla")
    case = Case(b=1, h=2, q=7, k=6, e=4, d=4, bias=(1, 2, 7, 6))
    q, k, v, bias, _ = make_inputs(case, torch.float32, device)

    def f(q: Tensor, k: Tensor, v: Tensor, bias: Tensor) -> Tensor:
        return fused_hypernetwork_attention(q, k, v, cfg, bias=bias).square().sum()

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    out = compiled(q, k, v, bias)
    grads = torch.autograd.grad(out, (q, k, v, bias))
    ref = f(q, k, v, bias)
    ref_grads = torch.autograd.grad(ref, (q, k, v, bias))
    assert rel_err(out, ref) < 1e-6
    assert all(rel_err(a, b) < 1e-6 for a, b in zip(grads, ref_grads))


@pytest.mark.kernel
def test_module_fused_equals_direct_form(device: torch.device) -> None:
    """The ``Attention`` module with relative positions, causal mask and key padding: output and all grads."""
    torch.manual_seed(0)
    ref = Attention(24, 4, "hyla", causal=True, relative_position=True, backend="direct").to(device)
    fused = Attention(24, 4, "hyla", causal=True, relative_position=True, backend="fused").to(device)
    fused.load_state_dict(ref.state_dict())
    x = torch.randn(2, 19, 24, device=device, requires_grad=True)
    pad = torch.zeros(2, 19, dtype=torch.bool, device=device)
    pad[1, -3:] = True
    a, b = ref(x, key_mask=~pad), fused(x, key_mask=~pad)
    assert rel_err(b, a) < 1e-4
    ga = torch.autograd.grad(a.square().sum(), [x, *ref.parameters()])
    gb = torch.autograd.grad(b.square().sum(), [x, *fused.parameters()])
    assert all(rel_err(y, z) < 1e-4 for y, z in zip(gb, ga))


@pytest.mark.kernel
def test_module_fused_under_bf16_autocast(device: torch.device) -> None:
    """Autocast gives the kernel bf16 q, k, v with an fp32 relative-position bias."""
    torch.manual_seed(0)
    ref = Attention(32, 4, "hyla", relative_position=True, backend="direct").to(device)
    fused = Attention(32, 4, "hyla", relative_position=True, backend="fused").to(device)
    fused.load_state_dict(ref.state_dict())
    x = torch.randn(2, 17, 32, device=device, requires_grad=True)
    want = ref(x)  # fp32
    with torch.autocast(device.type, dtype=torch.bfloat16):
        got, ref_bf16 = fused(x), ref(x)
    assert got.dtype == torch.bfloat16 and rel_err(got, want) < 2e-2
    g_want = torch.autograd.grad(want.sum(), [x, *ref.parameters()])
    g_got = torch.autograd.grad(got.float().sum(), [x, *fused.parameters()])
    g_ref_bf16 = torch.autograd.grad(ref_bf16.float().sum(), [x, *ref.parameters()])
    # autocast's own rounding (the projections) costs up to ~4e-2 here; the kernel must add little to it
    for a, b, c in zip(g_got, g_ref_bf16, g_want):
        assert rel_err(a, c) <= 1.5 * rel_err(b, c) + 1e-2


@pytest.mark.kernel
def test_fused_refuses_uncovered_cases(device: torch.device) -> None:
    q, k, v, _, _ = make_inputs(Case(), torch.float32, device)
    for preset in ("hyla_softmax", "hyla_plus", "softmax"):
        with pytest.raises(FusedUnavailableError, match="backend='fused' cannot run this case"):
            fused_hypernetwork_attention(q, k, v, attention_preset(preset))
    many = torch.randn(1, 33, 4, 2, device=device)
    assert "33 heads" in (fused_unsupported_reason(attention_preset("hyla"), many, many, many) or "")
    wide = torch.randn(1, 2, 4, 129, device=device)
    assert "E=129" in (fused_unsupported_reason(attention_preset("hyla"), wide, wide, wide) or "")
    q64 = q.detach().double()
    assert "float64" in (fused_unsupported_reason(attention_preset("hyla"), q64, q64, q64) or "")
    with pytest.raises(FusedUnavailableError):
        Attention(16, 2, "hyla_softmax", backend="fused").to(device)(torch.randn(1, 3, 16, device=device))


# ------------------------------------------------------------------------------------------ no kernel needed
def test_fused_says_why_without_interpreter_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    # distinct q, k, v: with one tensor for all three, a backend that swapped its arguments would pass
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 3, 4, generator=gen) for _ in range(3))
    reason = fused_unsupported_reason(attention_preset("hyla"), q, k, v)
    if importlib.util.find_spec("triton") is None:
        assert reason is not None and "triton is not installed" in reason
    else:
        assert reason is not None and "TRITON_INTERPRET=1" in reason
    with pytest.raises(FusedUnavailableError, match="backend='fused'"):
        run_chosen("fused", q, k, v, attention_preset("hyla"))
    name, y = run_chosen("auto", q, k, v, attention_preset("hyla"))  # CPU: a CPU backend, silently
    assert name in ("fused_cpu", "manual_backward", "direct")
    ref = hypernetwork_attention(q.double(), k.double(), v.double(), attention_preset("hyla"))[0]
    # float32 rounding over a few ops is ~1e-7 here; any two of q, k, v swapped is off by > 0.5
    assert y is not None and rel_err(y, ref) < 1e-5
    assert run_chosen("direct", q, k, v, attention_preset("hyla"))[0] == "direct"


def test_dispatch_and_fused_validate_inputs() -> None:
    q = torch.randn(2, 3, 5, 4)
    v = torch.randn(2, 3, 5, 6)
    cfg = attention_preset("hyla")
    with pytest.raises(ValueError, match="backend='flash' is not valid; allowed values: auto, direct, manual_backward"):
        run_chosen("flash", q, q, v, cfg)
    with pytest.raises(ValueError, match="k must have shape"):
        fused_hypernetwork_attention(q, torch.randn(2, 3, 5, 3), v, cfg)
    with pytest.raises(ValueError, match="mask must be a bool tensor"):
        fused_hypernetwork_attention(q, q, v, cfg, mask_Bx1xQxK=torch.ones(1, 1, 5, 5))
    with pytest.raises(ValueError, match="mask must broadcast"):
        fused_hypernetwork_attention(q, q, v, cfg, mask_Bx1xQxK=torch.ones(1, 3, 5, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="bias must be a float tensor broadcastable"):
        fused_hypernetwork_attention(q, q, v, cfg, bias=torch.randn(1, 2, 5, 5))
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        chunked_hypernetwork_attention(q, q, v, cfg, chunk_size=0)


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_chunked_matches_direct_form_fp32_and_bf16(chunk: int) -> None:
    """Chunked (pure torch): chunk sizes below, between and above Q; masks, bias; forward and grads."""
    case = Case(q=13, k=11, bias=(1, 3, 13, 11), mask="empty_row")
    cfg = attention_preset("hyla_silu")
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        q, k, v, bias, mask = make_inputs(case, dtype, torch.device("cpu"), bias_dtype=dtype)
        out = chunked_hypernetwork_attention(q, k, v, cfg, mask_Bx1xQxK=mask, bias=bias, chunk_size=chunk)
        ref_in = [t.detach().double().requires_grad_() for t in (q, k, v, bias)]
        ref, _ = hypernetwork_attention(*ref_in[:3], cfg, mask_Bx1xQxK=mask, bias=ref_in[3])
        assert rel_err(out, ref) < tol
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
        got = torch.autograd.grad(out, (q, k, v, bias), g)
        want = torch.autograd.grad(ref, ref_in, g.double())
        assert all(rel_err(a, b) < tol for a, b in zip(got, want))


@pytest.mark.parametrize("preset", ["hyla", "hyla_plus", "hyla_softmax"])
def test_module_chunked_equals_direct_form(preset: str) -> None:
    torch.manual_seed(0)
    ref = Attention(24, 4, preset, relative_position=True, backend="direct")
    chunked = Attention(24, 4, preset, relative_position=True, backend="chunked", chunk_size=4)
    chunked.load_state_dict(ref.state_dict())
    x = torch.randn(2, 10, 24, requires_grad=True)
    pad = torch.zeros(2, 10, dtype=torch.bool)
    pad[0, :2] = True
    a, b = ref(x, key_mask=~pad), chunked(x, key_mask=~pad)
    assert rel_err(b, a) < 1e-5
    ga = torch.autograd.grad(a.square().sum(), [x, *ref.parameters()])
    gb = torch.autograd.grad(b.square().sum(), [x, *chunked.parameters()])
    # softmax's key-bias gradient is exactly zero in theory (shift invariance): compare it absolutely
    assert all((y - z).norm() <= 1e-5 * max(z.norm().item(), 1.0) for y, z in zip(gb, ga))


@pytest.mark.kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_self_test_passes_for_a_working_kernel(device: torch.device, dtype: torch.dtype) -> None:
    q = torch.randn(2, 3, 5, 4, device=device, dtype=dtype)
    v = torch.randn(2, 3, 5, 6, device=device, dtype=dtype)
    for mask, bias in ((False, False), (True, True)):
        assert fused_self_test(q, v, attention_preset("hyla_silu"), with_mask=mask, with_bias=bias) is None


def test_auto_skips_a_kernel_whose_self_test_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel that raises (e.g. does not compile on this GPU) or computes wrong numbers is not used by
    ``auto``: the signature is remembered, a warning names the cause, and the direct form runs."""
    import hyla.attention.dispatch as policy

    q = torch.randn(1, 2, 4, 3)
    cfg = attention_preset("hyla")

    def broken(*args: object, **kwargs: object) -> Tensor:
        raise RuntimeError("PTX compilation failed")

    monkeypatch.setattr(policy, "fused_hypernetwork_attention", broken)
    monkeypatch.setattr(policy, "_SELF_TESTS", {})
    assert "RuntimeError: PTX compilation failed" in (fused_self_test(q, q, cfg, with_mask=True, with_bias=False) or "")
    monkeypatch.setattr(policy, "_WARNED", set())
    with pytest.warns(UserWarning, match="self-test failed for this signature: RuntimeError: PTX"):
        assert policy._checked(q, q, cfg, None, None) is False
    assert len(policy._SELF_TESTS) == 1

    def wrong(q: Tensor, k: Tensor, v: Tensor, config: AttentionConfig, **kwargs: object) -> Tensor:
        return hypernetwork_attention(q, k, v, config, **kwargs)[0] * 1.01

    monkeypatch.setattr(policy, "fused_hypernetwork_attention", wrong)
    assert "y differs from the direct form" in (fused_self_test(q, q, cfg, with_mask=False, with_bias=True) or "")


def test_auto_on_cuda_uses_the_direct_form_for_small_heads_and_short_sequences() -> None:
    """The Triton kernel pads head dims to 16; for the task models' head dims (4-8) at their lengths the
    direct form is faster (measured), for long sequences the kernel keeps memory linear."""

    def choice(b: int, h: int, t: int, e: int, d: int) -> str:
        q, v = torch.empty(b, h, t, e), torch.empty(b, h, t, d)
        return "fused" if cuda_kernel_pays(AttentionCall(q, q, v, attention_preset("hyla"))) else "direct"

    assert choice(128, 16, 36, 4, 4) == "direct"  # SRAVEN
    assert choice(128, 16, 36, 4, 16) == "fused"
    assert choice(8, 16, 2048, 4, 4) == "fused"  # 2^29 scores
    assert choice(8, 16, 2048, 64, 64) == "fused"


def test_fused_is_not_used_inside_vmap() -> None:
    """Stacked runs vmap the model; the custom op has no batching rule, so ``auto`` must not pick it."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    reasons: list[str | None] = []

    def attend(q: Tensor) -> Tensor:
        reasons.append(fused_unsupported_reason(attention_preset("hyla"), q, q, q))
        return q

    torch.vmap(attend)(torch.randn(3, 1, 2, 4, 4))
    assert reasons == ["inside torch.vmap (e.g. stacked runs): the op has no batching rule"]
