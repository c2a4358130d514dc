"""The CPU paths of HYLA against the direct form: ``fused_cpu`` (C kernel; what ``auto`` uses on CPU)
and ``manual_backward`` (hand-derived backward in PyTorch ops; the fallback for what the kernel does not
cover)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from chosen import run_chosen
from hyla.attention import Attention, attention_preset
from hyla.attention.backend import AttentionCall
from hyla.attention.direct import DIRECT
from hyla.attention.dispatch import choose, cpu_auto_choice
from hyla.attention.functional import (
    attention_scores,
    drop_pairs,
    hypernetwork_attention,
    normalize_scores,
    value_network,
)
from hyla.attention.kernels import (
    CpuKernelUnavailableError,
    fused_cpu_hypernetwork_attention,
    fused_cpu_unsupported_reason,
    manual_backward_hypernetwork_attention,
    manual_backward_unsupported_reason,
)
from hyla.attention.kernels.c import wrapper as c_wrapper
from hyla.ops import clib
from tiny import autograd_node_names, torch_threads

#: every test here compares CPU code paths against each other (tolerances in each test)
pytestmark = pytest.mark.float_sensitive

IMPLEMENTATIONS = {
    "manual_backward": manual_backward_hypernetwork_attention,
    "fused_cpu": fused_cpu_hypernetwork_attention,
}

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


def _compare(impl, config, mask, bias_shape, dtype=torch.float64, gen_seed=0) -> list[float]:
    """Relative errors of y and every gradient, ``impl`` (in ``dtype``) vs the direct form in float64."""
    gen = torch.Generator().manual_seed(gen_seed)
    shapes = [(B, H, Q, E), (B, H, K, E), (B, H, K, D)] + ([bias_shape] if bias_shape else [])
    base = [torch.randn(*s, generator=gen, dtype=torch.float64) for s in shapes]
    ref_in = [t.clone().requires_grad_() for t in base]
    got_in = [t.to(dtype).requires_grad_() for t in base]
    bias_ref = ref_in[3] if bias_shape else None
    bias_got = got_in[3] if bias_shape else None
    y_ref, _ = hypernetwork_attention(*ref_in[:3], config, mask_Bx1xQxK=mask, bias=bias_ref)
    y_got = IMPLEMENTATIONS[impl](*got_in[:3], config, mask_Bx1xQxK=mask, bias=bias_got)
    dy = torch.randn(y_ref.shape, generator=gen, dtype=torch.float64)
    g_ref = torch.autograd.grad(y_ref, ref_in, dy)
    g_got = torch.autograd.grad(y_got, got_in, dy.to(dtype))
    return [_rel(y_got, y_ref)] + [_rel(a, b) for a, b in zip(g_got, g_ref)]


@pytest.mark.parametrize("impl", list(IMPLEMENTATIONS))
@pytest.mark.parametrize("normalization", ["rms_head", "none"])
@pytest.mark.parametrize("phi", ["relu", "silu", "gelu", "sigmoid", "tanh", "identity"])
def test_equals_direct_form_every_phi(impl: str, normalization: str, phi: str) -> None:
    config = attention_preset("hyla", normalization=normalization, nonlinearity=phi)
    errors = _compare(impl, config, MASKS["random_Bx1xQxK"](), (1, H, Q, K))
    assert max(errors) < 1e-12, errors


@pytest.mark.parametrize("impl", list(IMPLEMENTATIONS))
@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize("bias_name", list(BIAS_SHAPES))
def test_equals_direct_form_every_mask_and_bias(impl: str, mask_name: str, bias_name: str) -> None:
    mask = MASKS[mask_name]() if MASKS[mask_name] else None
    if impl == "fused_cpu" and bias_name == "BxHxQxK":
        with pytest.raises(CpuKernelUnavailableError, match="varies over the batch"):
            _compare(impl, attention_preset("hyla"), mask, BIAS_SHAPES[bias_name])
        return
    errors = _compare(impl, attention_preset("hyla"), mask, BIAS_SHAPES[bias_name])
    assert max(errors) < 1e-12, errors


@pytest.mark.parametrize("impl", list(IMPLEMENTATIONS))
def test_float32_tolerance(impl: str) -> None:
    mask = MASKS["causal_1x1xQxK"]()
    assert max(_compare(impl, attention_preset("hyla"), mask, (1, H, Q, K), torch.float32)) < 1e-4


def test_bfloat16_manual_backward_and_not_fused_cpu() -> None:
    config, mask = attention_preset("hyla"), MASKS["causal_1x1xQxK"]()
    assert max(_compare("manual_backward", config, mask, (1, H, Q, K), torch.bfloat16)) < 2e-2
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 3, 4, generator=gen).to(torch.bfloat16) for _ in range(3))
    assert "float32, float64" in fused_cpu_unsupported_reason(config, q, k, v)
    name, y = run_chosen("auto", q, k, v, config)  # auto: manual_backward for what the C kernel does not cover
    assert name == "manual_backward" and y.dtype == torch.bfloat16
    # bfloat16 keeps 8 significant bits: the error is ~1e-2 (at most 1.3e-2 over 200 seeds); any two of
    # q, k, v swapped is off by > 0.2 (distinct tensors so that a swap would show)
    assert _rel(y, hypernetwork_attention(q.double(), k.double(), v.double(), config)[0]) < 2e-2


def test_fused_cpu_same_result_with_one_or_many_threads() -> None:
    config, mask = attention_preset("hyla"), MASKS["random_Bx1xQxK"]()
    with torch_threads(1):
        one = _compare("fused_cpu", config, mask, (H, Q, K))
    with torch_threads(max(torch.get_num_threads(), 3)):
        many = _compare("fused_cpu", config, mask, (H, Q, K))
    assert max(one) < 1e-12 and max(many) < 1e-12, (one, many)


@pytest.mark.parametrize("impl", list(IMPLEMENTATIONS))
def test_gradcheck(impl: str) -> None:
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, n, 2, generator=gen, dtype=torch.float64, requires_grad=True) for n in (4, 5, 5))
    bias = torch.randn(3, 4, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(2, 1, 4, 5, generator=gen) > 0.2
    config = attention_preset("hyla_gelu")
    assert torch.autograd.gradcheck(
        lambda *t: IMPLEMENTATIONS[impl](*t[:3], config, mask_Bx1xQxK=mask, bias=t[3]), (q, k, v, bias)
    )


@pytest.mark.parametrize(
    ("preset", "normalization"),
    [("hyla", "rms_head"), ("hyla", "none"), ("hyla", "softmax"), ("softmax", "softmax"), ("softmax", "none")],
)
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_fused_cpu_attention_dropout_equals_the_direct_form(
    preset: str, normalization: str, dtype: torch.dtype, tol: float
) -> None:
    """The kernel's dropout (one Q x K keep-mask for batch and heads, after normalization) against
    ``drop_pairs`` in the direct form, forward and every gradient, with a mask and a bias."""
    config = attention_preset(preset, normalization=normalization)
    gen = torch.Generator().manual_seed(3)
    shapes = [(B, H, Q, E), (B, H, K, E), (B, H, K, D), (H, Q, K)]
    base = [torch.randn(*s, generator=gen, dtype=torch.float64) for s in shapes]
    mask, p = torch.rand(B, 1, Q, K, generator=gen) > 0.2, 0.3
    keep_11xQxK = torch.rand(1, 1, Q, K, generator=gen) >= p
    ref_in = [t.clone().requires_grad_() for t in base]
    got_in = [t.to(dtype).requires_grad_() for t in base]
    s = attention_scores(ref_in[0], ref_in[1], ref_in[3])
    a = normalize_scores(s, config.normalization, mask, config.rms_eps)
    y_ref, _ = value_network(drop_pairs(a, p, keep_11xQxK), ref_in[2], config.value_network, config.nonlinearity)
    y_got = fused_cpu_hypernetwork_attention(
        *got_in[:3], config, mask_Bx1xQxK=mask, bias=got_in[3], dropout_keep_11xQxK=keep_11xQxK, dropout=p
    )
    dy = torch.randn(y_ref.shape, generator=gen, dtype=torch.float64)
    errors = [_rel(y_got, y_ref)] + [
        _rel(g, r)
        for g, r in zip(torch.autograd.grad(y_got, got_in, dy.to(dtype)), torch.autograd.grad(y_ref, ref_in, dy))
    ]
    assert max(errors) < tol, errors
    plain = fused_cpu_hypernetwork_attention(*got_in[:3], config, mask_Bx1xQxK=mask, bias=got_in[3])
    assert _rel(plain, y_got) > 0.01  # the mask dropped something


@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_fused_cpu_softmax_in_float32_and_rows_without_a_visible_key(scale: float) -> None:
    """Softmax by the kernel's own float32 exponential against the direct form in float64, with scores up to
    hundreds (the row's maximum subtracted; exponents below -87 clamped) and a query whose keys are all masked:
    its output and the gradients it sends are zero, as in the direct form, never NaN."""
    config = attention_preset("softmax")
    gen = torch.Generator().manual_seed(5)
    base = [torch.randn(B, H, n, E, generator=gen, dtype=torch.float64) * scale for n in (Q, K, K)]
    mask = torch.rand(B, 1, Q, K, generator=gen) > 0.3
    mask[1, 0, 2] = False
    ref_in = [t.clone().requires_grad_() for t in base]
    got_in = [t.float().requires_grad_() for t in base]
    y_ref, _ = hypernetwork_attention(*ref_in, config, mask_Bx1xQxK=mask)
    y_got = fused_cpu_hypernetwork_attention(*got_in, config, mask_Bx1xQxK=mask)
    dy = torch.randn(y_ref.shape, generator=gen, dtype=torch.float64)
    grads_got = torch.autograd.grad(y_got, got_in, dy.float())
    grads_ref = torch.autograd.grad(y_ref, ref_in, dy)
    errors = [_rel(y_got, y_ref)] + [_rel(g, r) for g, r in zip(grads_got, grads_ref)]
    # the bar: the direct form's own float32 error (large scores make the gradients ill-conditioned)
    torch_in = [t.float().requires_grad_() for t in base]
    y_torch, _ = hypernetwork_attention(*torch_in, config, mask_Bx1xQxK=mask)
    grads_torch = torch.autograd.grad(y_torch, torch_in, dy.float())
    bars = [_rel(y_torch, y_ref)] + [_rel(g, r) for g, r in zip(grads_torch, grads_ref)]
    assert all(e < max(4 * bar, 1e-6) for e, bar in zip(errors, bars)), (errors, bars)
    assert y_got[1, :, 2].abs().max() == 0 and grads_got[0][1, :, 2].abs().max() == 0
    assert all(torch.isfinite(g).all() for g in grads_got)


# the sizes the kernel has specialized copies for (heads, keys, head dim; queries): SRAVEN's blocks (its last
# computes the 4 answers) and fuzzy logic's. HYLA and softmax attention have copies of their own at these
# sizes; linear attention and HYLA without RMSHead take the sizes' copy that reads the variant at run time
PAPER_SIZES = {"sraven": (16, 36, 4, 36), "sraven_last_block": (16, 36, 4, 4), "fuzzy_logic": (8, 32, 2, 32)}


@pytest.mark.parametrize("preset", ["hyla", "softmax", "linear", "hyla_no_rmshead"])
@pytest.mark.parametrize("sizes", list(PAPER_SIZES))
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 2e-5)])
def test_fused_cpu_reads_and_writes_the_models_strided_layout(
    preset: str, sizes: str, dtype: torch.dtype, tol: float
) -> None:
    """The paper models' sizes (SRAVEN's 36 keys are not a multiple of the kernel's 8 lanes) with q, k, v
    as the model passes them (``B x T x H x E`` memory viewed as ``B x H x T x E``), a gradient of the output
    in yet another layout, a mask, a bias and dropout: forward and every gradient against the direct form;
    the output comes back in the layout the output projection reads without a copy."""
    b, (h, nk, e, num_queries) = 5, PAPER_SIZES[sizes]
    config = attention_preset(preset)
    gen = torch.Generator().manual_seed(4)
    base = [
        torch.randn(b, n, h, e, generator=gen, dtype=torch.float64).transpose(1, 2) for n in (num_queries, nk, nk)
    ] + [torch.randn(h, num_queries, nk, generator=gen, dtype=torch.float64)]
    mask = torch.rand(b, 1, num_queries, nk, generator=gen) > 0.2
    p = 0.1
    keep = torch.rand(1, 1, num_queries, nk, generator=gen) >= p
    ref_in = [t.detach().clone().requires_grad_() for t in base]
    got_in = [t.detach().to(dtype).requires_grad_() for t in base]
    assert not got_in[0].is_contiguous()
    s = attention_scores(ref_in[0], ref_in[1], ref_in[3])
    a = normalize_scores(s, config.normalization, mask, config.rms_eps)
    y_ref, _ = value_network(drop_pairs(a, p, keep), ref_in[2], config.value_network, config.nonlinearity)
    y_got = fused_cpu_hypernetwork_attention(
        *got_in[:3], config, mask_Bx1xQxK=mask, bias=got_in[3], dropout_keep_11xQxK=keep, dropout=p
    )
    assert y_got.transpose(1, 2).is_contiguous()
    dy = torch.randn(h, b, e, num_queries, generator=gen, dtype=torch.float64).permute(1, 0, 3, 2)
    grads_got = torch.autograd.grad(y_got, got_in, dy.to(dtype))
    grads_ref = torch.autograd.grad(y_ref, ref_in, dy)
    errors = [_rel(y_got, y_ref)] + [_rel(g, r) for g, r in zip(grads_got, grads_ref)]
    assert max(errors) < tol, errors
    assert all(g.stride() == t.stride() for g, t in zip(grads_got[:3], got_in[:3]))


def test_fused_cpu_attention_dropout_gradcheck_and_bad_mask() -> None:
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 3, n, 2, generator=gen, dtype=torch.float64, requires_grad=True) for n in (4, 5, 5))
    keep = torch.rand(1, 1, 4, 5, generator=gen) >= 0.25
    config = attention_preset("hyla")
    assert torch.autograd.gradcheck(
        lambda *t: fused_cpu_hypernetwork_attention(*t, config, dropout_keep_11xQxK=keep, dropout=0.25), (q, k, v)
    )
    with pytest.raises(ValueError, match=r"dropout_keep_11xQxK must hold one entry per \(query, key\) pair"):
        fused_cpu_hypernetwork_attention(q, k, v, config, dropout_keep_11xQxK=keep[..., :3], dropout=0.25)


@pytest.mark.parametrize("preset", ["hyla", "softmax"])
def test_auto_picks_the_c_kernel_on_cpu(preset: str) -> None:
    q, k, v = (torch.randn(2, 4, 6, 5, requires_grad=True) for _ in range(3))
    name, y = run_chosen("auto", q, k, v, attention_preset(preset), bias=torch.zeros(4, 6, 6))
    assert name == "fused_cpu" and "fused_cpu_attention" in type(y.grad_fn).__name__


@pytest.mark.parametrize("backend", ["direct", "manual_backward", "fused"])
def test_softmax_attention_takes_the_direct_form_where_the_backend_does_not_cover_it(backend: str) -> None:
    q, k, v = (torch.randn(2, 4, 6, 5) for _ in range(3))
    assert run_chosen(backend, q, k, v, attention_preset("softmax"))[0] == "direct"


def test_auto_on_cpu_chooses_by_head_dim_and_size() -> None:
    hyla = attention_preset("hyla")

    def choice(b: int, nq: int, nk: int, head_dim: int, dtype: torch.dtype = torch.float32) -> str:
        q = torch.empty(b, 16, nq, head_dim, dtype=dtype)
        k = torch.empty(b, 16, nk, head_dim, dtype=dtype)
        return cpu_auto_choice(AttentionCall(q, k, k, hyla)).name

    assert choice(128, 36, 36, 4) == "fused_cpu"  # SRAVEN's heads
    assert choice(128, 36, 36, 16) == "manual_backward"
    assert choice(128, 36, 36, 64) == "direct"
    assert choice(1, 2048, 4096, 64) == "fused_cpu"  # 134M scores: the direct form would fault in GiBs
    assert choice(128, 36, 36, 4, torch.bfloat16) == "manual_backward"  # the C kernel has no bfloat16
    assert choice(128, 36, 36, 64, torch.bfloat16) == "direct"
    softmax = attention_preset("softmax")
    q4, q64 = torch.empty(128, 16, 36, 4), torch.empty(1, 16, 2048, 64)
    assert cpu_auto_choice(AttentionCall(q4, q4, q4, softmax)).name == "fused_cpu"
    assert cpu_auto_choice(AttentionCall(q64, q64, q64, softmax)).name == "direct"  # large scores: measured for HYLA


@pytest.mark.parametrize(
    ("preset", "backend"), [("hyla", "auto"), ("hyla", "manual_backward"), ("hyla", "fused_cpu"), ("softmax", "auto")]
)
def test_module_matches_direct_form_with_parameter_gradients(preset: str, backend: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 6, 20)
    fast = Attention(20, 4, preset, relative_position=True, causal=True, backend=backend)
    ref = Attention(20, 4, preset, relative_position=True, causal=True, backend="direct")
    ref.load_state_dict(fast.state_dict())
    out_fast, out_ref = fast(x), ref(x)
    assert _rel(out_fast, out_ref) < 1e-5
    assert (backend != "manual_backward") == any("fused_cpu_attention" in n for n in autograd_node_names(out_fast))
    out_fast.square().sum().backward()
    out_ref.square().sum().backward()
    for (name, p), p_ref in zip(fast.named_parameters(), ref.parameters()):
        if preset == "softmax" and name == "k_proj.bias":  # softmax ignores a shift shared by a row's scores:
            assert p.grad.abs().max() < 1e-6 and p_ref.grad.abs().max() < 1e-6  # zero but for rounding
            continue
        assert _rel(p.grad, p_ref.grad) < 1e-4, name


@pytest.mark.parametrize("preset", ["hyla_softmax", "hyla_plus", "softmax", "linear"])
def test_uncovered_presets_fall_back_or_raise(preset: str) -> None:
    config = attention_preset(preset)
    q, k, v = (torch.randn(1, 2, 3, 4) for _ in range(3))
    assert manual_backward_unsupported_reason(config) is not None
    with pytest.raises(ValueError, match=r"value_network|normalization"):
        manual_backward_hypernetwork_attention(q, k, v, config)
    if preset != "hyla_plus":  # the C kernel covers every variant but the deep value network
        assert fused_cpu_unsupported_reason(config, q, k, v) is None
        return
    assert fused_cpu_unsupported_reason(config, q, k, v) is not None
    assert choose("auto", AttentionCall(q, k, v, config)) is DIRECT
    with pytest.raises(CpuKernelUnavailableError, match=r"value_network|normalization"):
        fused_cpu_hypernetwork_attention(q, k, v, config)


def test_fused_cpu_without_a_compiler_says_so_and_auto_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clib, "_LIBRARY", None)
    monkeypatch.setattr(clib, "_LOAD_ERROR", None)
    monkeypatch.setattr(clib, "_compiler", lambda: None)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 3, 4, generator=gen) for _ in range(3))  # distinct, so a swap would show
    config = attention_preset("hyla")
    assert "no C compiler" in fused_cpu_unsupported_reason(config, q, k, v)
    with pytest.raises(CpuKernelUnavailableError, match="no C compiler"):
        run_chosen("fused_cpu", q, k, v, config)
    name, y = run_chosen("auto", q, k, v, config)
    # float32 rounding over a few ops is ~1e-7 here; any two of q, k, v swapped is off by > 0.5
    assert name != "fused_cpu" and _rel(y, hypernetwork_attention(q.double(), k.double(), v.double(), config)[0]) < 1e-5


@pytest.mark.slow
def test_fused_cpu_build_goes_to_the_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path, capsys) -> None:
    monkeypatch.setenv("HYLA_CACHE_DIR", str(tmp_path))
    compiler = clib._compiler()
    if compiler is None:
        pytest.skip("no C compiler on this machine")
    built = clib._build(compiler)
    assert built.parent == tmp_path / "kernels" and built.suffix == ".so"
    assert sorted(p.name for p in built.parent.iterdir()) == [built.name]  # no leftovers
    announced = capsys.readouterr().err.splitlines()
    assert len(announced) == 1 and str(tmp_path / "kernels") in announced[0]  # the slow first build, said once
    assert clib._build(compiler) == built  # cached
    assert capsys.readouterr().err == ""  # and silent once built


def test_the_kernel_check_is_marked_constant_as_torch_marks_it_without_importing_dynamo() -> None:
    """The wrapper marks its library check as torch.compiler.assume_constant_result would (torch.compile runs it
    once while tracing), without the decorator's import of torch._dynamo, which `import hyla` would pay."""
    import subprocess
    import sys

    def probe() -> None: ...

    marked = torch.compiler.assume_constant_result(probe)
    assert vars(marked) == vars(clib.library_problem) != {}
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, hyla, hyla.cli; print('torch._dynamo' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert loaded.stdout.strip() == "False"


@pytest.mark.parametrize("case", ["shared_bias_and_mask", "per_example_mask", "per_run_bias", "unbatched_kv"])
def test_fused_cpu_under_vmap_equals_each_run_alone(case: str) -> None:
    """Stacked runs vmap the model: the op folds the runs into the batch (or, for a per-run bias,
    calls the kernel run by run); outputs and every gradient equal the runs computed one by one."""
    config = attention_preset("hyla")
    gen = torch.Generator().manual_seed(3)
    runs = 3

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64, requires_grad=True)

    q, k, v = rand(runs, B, H, Q, E), rand(runs, B, H, K, E), rand(runs, B, H, K, D)
    bias, mask = rand(H, Q, K), MASKS["causal_1x1xQxK"]()
    bias_dim, k_dim, v_dim = None, 0, 0
    if case == "per_example_mask":
        mask = MASKS["random_Bx1xQxK"]()
    if case == "per_run_bias":
        bias, bias_dim = rand(runs, H, Q, K), 0
    if case == "unbatched_kv":
        k, v, k_dim, v_dim = rand(B, H, K, E), rand(B, H, K, D), None, None

    def one(q_, k_, v_, bias_):
        return fused_cpu_hypernetwork_attention(q_, k_, v_, config, mask_Bx1xQxK=mask, bias=bias_)

    y = torch.vmap(one, in_dims=(0, k_dim, v_dim, bias_dim))(q, k, v, bias)
    pick = [lambda t, r, d=d: t if d is None else t[r] for d in (0, k_dim, v_dim, bias_dim)]
    ref = torch.stack(
        [
            hypernetwork_attention(
                *(f(t, r) for f, t in zip(pick[:3], (q, k, v))), config, mask_Bx1xQxK=mask, bias=pick[3](bias, r)
            )[0]
            for r in range(runs)
        ]
    )
    assert _rel(y, ref) < 1e-12
    dy = torch.randn(y.shape, generator=gen, dtype=torch.float64)
    got = torch.autograd.grad(y, (q, k, v, bias), dy)
    want = torch.autograd.grad(ref, (q, k, v, bias), dy)
    assert max(_rel(a, b) for a, b in zip(got, want)) < 1e-12


@pytest.mark.skipif(
    torch.backends.cpu.get_cpu_capability() == "DEFAULT",
    reason="ATEN_CPU_CAPABILITY=default: inductor's generated C++ uses at::vec without its header (torch 2.13)",
)
def test_auto_under_vmap_and_compile_runs_the_c_kernel() -> None:
    from hyla.train.engines import vmap_rules  # the batching rule, registered where stacking lives

    if not vmap_rules.HAS_VMAP_RULES:
        pytest.skip(f"torch {torch.__version__} has no custom-op vmap rules")
    config = attention_preset("hyla")
    q, k, v = (torch.randn(2, 1, 3, 4, 2, requires_grad=True) for _ in range(3))
    names: list[str] = []

    def chosen(*t: torch.Tensor) -> torch.Tensor:
        name, y = run_chosen("auto", *t, config)
        names.append(name)
        return y

    y = torch.vmap(chosen)(q, k, v)
    assert names == ["fused_cpu"]
    assert y is not None and _rel(y[1], hypernetwork_attention(q[1], k[1], v[1], config)[0]) < 1e-5
    compiled = torch.compile(lambda *t: run_chosen("auto", *t, config)[1], fullgraph=True)
    y = compiled(q[0], k[0], v[0])
    ref = hypernetwork_attention(q[0], k[0], v[0], config)[0]
    assert y is not None and _rel(y, ref) < 1e-5
    g_got, g_ref = torch.autograd.grad(y.sum(), q), torch.autograd.grad(ref.sum(), q)
    assert _rel(g_got[0], g_ref[0]) < 1e-5


@pytest.mark.parametrize("impl", list(IMPLEMENTATIONS))
def test_double_backward_raises(impl: str) -> None:
    q, k, v = (torch.randn(1, 2, 3, 2, dtype=torch.float64, requires_grad=True) for _ in range(3))
    y = IMPLEMENTATIONS[impl](q, k, v, attention_preset("hyla"))
    (dq,) = torch.autograd.grad(y.sum(), q, create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(dq.sum(), q)


def test_bad_backend_names_the_choices() -> None:
    with pytest.raises(ValueError, match="allowed values: auto, direct, manual_backward, fused_cpu, fused, chunked"):
        Attention(8, 2, "hyla", backend="nope")


def test_cpu_allocator_tuning_applies_on_glibc_and_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    import platform

    from hyla.runtime import tune_cpu_allocator

    monkeypatch.setenv("HYLA_TUNE_MALLOC", "0")
    assert tune_cpu_allocator() is False
    monkeypatch.setenv("HYLA_TUNE_MALLOC", "1")
    expected = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert tune_cpu_allocator() is expected


def test_cpuinfo_field_reads_the_first_line_of_a_key_and_none_for_unknown_keys(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    from hyla import runtime

    fake = tmp_path / "cpuinfo"
    fake.write_text(
        "processor\t: 0\nmodel name\t: Test CPU 9000\nflags\t\t: fpu avx2\n\nprocessor\t: 1\nmodel name\t: other\n"
    )
    monkeypatch.setattr(runtime, "CPUINFO", fake)
    assert runtime.cpuinfo_field("model name") == "Test CPU 9000"
    assert runtime.cpuinfo_field("flags") == "fpu avx2"
    assert runtime.cpuinfo_field("no such key") is None
    assert runtime.cpu_model() == "Test CPU 9000"
    fake.unlink()  # not Linux: the platform module's guess, never an empty name
    assert runtime.cpuinfo_field("model name") is None
    assert runtime.cpu_model()


def test_fused_cpu_custom_op_passes_opcheck() -> None:
    """Schema, fake tensor, autograd registration and AOT dispatch of ``hyla::fused_cpu_attention`` (HYLA's
    variant and softmax attention's)."""
    gen = torch.Generator().manual_seed(0)
    # q and k as the model passes them (B x T x H x E memory viewed as B x H x T x E), v contiguous
    q = torch.randn(2, 4, 3, 5, generator=gen).transpose(1, 2).requires_grad_()
    k = torch.randn(2, 6, 3, 5, generator=gen).transpose(1, 2).requires_grad_()
    v = torch.randn(2, 3, 6, 4, generator=gen, requires_grad=True)
    bias = torch.randn(3, 4, 6, generator=gen, requires_grad=True)
    keep = (torch.rand(1, 4, 6, generator=gen) > 0.3).to(torch.uint8)
    drop = (torch.rand(4, 6, generator=gen) > 0.1).to(torch.uint8)
    for norm, linear in ((c_wrapper.NORM_IDS["rms_head"], False), (c_wrapper.NORM_IDS["softmax"], True)):
        args = (q, k, v, bias, keep, drop, 0.9, 1, norm, linear, 1e-6)
        results = torch.library.opcheck(torch.ops.hyla.fused_cpu_attention.default, args)
        assert set(results.values()) == {"SUCCESS"}, results


_MARCH_PROBE = """
import sys, torch
from hyla.attention import attention_preset
from hyla.attention.kernels.c import fused_cpu_hypernetwork_attention as attend
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(3, 36, 16, 4, generator=g).transpose(1, 2).requires_grad_() for _ in range(3))
bias = torch.randn(16, 36, 36, generator=g, requires_grad=True)
keep = torch.rand(1, 1, 36, 36, generator=g) > 0.1
dy = torch.randn(3, 16, 36, 4, generator=g)
out = []
for preset in ("hyla", "softmax"):
    y = attend(q, k, v, attention_preset(preset), bias=bias, dropout_keep_11xQxK=keep, dropout=0.1)
    out += [y.detach(), *torch.autograd.grad(y, (q, k, v, bias), dy)]
torch.save(out, sys.argv[1])
"""


@pytest.mark.slow
@pytest.mark.float_sensitive
@pytest.mark.skipif(__import__("platform").machine() != "x86_64", reason="x86-64 -march targets")
def test_fused_cpu_relu_results_do_not_depend_on_the_march_target(tmp_path: Path) -> None:
    """The kernel writes its vector sums itself in a fixed order (no -fassociative-math, no contracted
    multiply-adds), so with phi relu (HYLA) and for softmax attention (its exponential is the kernel's own
    float32 arithmetic) a build for x86-64-v2 (SSE4) and one for this CPU agree bit for bit."""
    import os
    import subprocess
    import sys

    outs = []
    for march in ("x86-64-v2", "native"):
        out = tmp_path / f"{march}.pt"
        env = {**os.environ, "HYLA_CPU_MARCH": march, "OMP_NUM_THREADS": "1"}
        done = subprocess.run([sys.executable, "-c", _MARCH_PROBE, str(out)], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        outs.append(torch.load(out))
    assert len(outs[0]) == 10 and all(torch.equal(a, b) for a, b in zip(*outs))
