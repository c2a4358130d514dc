"""``hyla.functional.attention``, SDPA's call for every variant: softmax against
``torch.nn.functional.scaled_dot_product_attention``, every preset against the direct form and the naive loop,
with every kind of mask, forward and gradients, on every CPU backend that covers the case; and the one mask
convention (True = attend) of ``hyla.Attention``, whose deprecated ``key_padding_mask`` still works."""

from __future__ import annotations

import math
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import hyla
from hyla.attention import PRESETS, Attention, attention_preset
from hyla.attention.config import AttentionConfig
from hyla.attention.functional import (
    drop_pairs,
    hypernetwork_attention,
    normalize_scores,
    value_network,
)
from hyla.attention.kernels import CpuKernelUnavailableError, fused_cpu_unsupported_reason
from hyla.attention.kernels.coverage import COVERAGE, covers_dtype, variant_unsupported_reason
from hyla.attention.naive import naive_attention
from tiny import HANG_GUARD_S, autograd_node_names

#: every test here compares code paths against each other (tolerances in each test)
pytestmark = pytest.mark.float_sensitive

B, H, Q, K, E, D = 2, 3, 5, 7, 4, 4
ALL_PRESETS = sorted(PRESETS)
NON_SOFTMAX = [p for p in ALL_PRESETS if PRESETS[p].normalization != "softmax"]
#: relative error (norm) of the output and each gradient against float64, the inputs rounded alike; measured
#: at most 4.6e-7 (float32) and 1.8e-2 (bfloat16) over the SDPA and direct-form cases below
TOLERANCE = {torch.float64: 1e-10, torch.float32: 5e-6, torch.bfloat16: 4e-2}


def _has_c_compiler() -> bool:
    q = torch.zeros(1, 1, 1, 1)
    return fused_cpu_unsupported_reason(attention_preset("hyla"), q, q, q) is None


def cpu_backends(config: AttentionConfig, dtype: torch.dtype) -> list[str]:
    """``auto`` and each backend that the table ``COVERAGE`` says covers this variant and dtype on CPU."""
    names = ["auto"]
    for name, cov in COVERAGE.items():
        on_cpu = cov.devices is None or "cpu" in cov.devices
        if on_cpu and variant_unsupported_reason(name, config) is None and covers_dtype(name, dtype):
            names.append(name)
    return [n for n in names if n != "fused_cpu" or _has_c_compiler()]


def _rel(a: Tensor, b: Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def _keep_some(mask_XxQxK: Tensor) -> Tensor:
    """Every query keeps at least one key (a query with none is its own test)."""
    mask = mask_XxQxK.clone()
    mask[..., torch.arange(Q), torch.arange(Q) % K] = True
    return mask


def _minus_inf_where_not(keep: Tensor, dtype: torch.dtype, fill: float = -math.inf) -> Tensor:
    return torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, fill)


MASKS = (
    "none",
    "causal",
    "bool_Bx1xQxK",
    "bool_QxK",
    "bool_padding_Bx1x1xK",
    "float_minus_inf_QxK",
    "float_minus_1e4_causal",
)


def mask_case(name: str, gen: torch.Generator) -> tuple[dict, Tensor | None]:
    """The call's mask arguments of a kind in ``MASKS`` (float masks in float64) and the bool mask they mean
    (None: none); every query keeps a key."""
    causal = torch.ones(Q, K, dtype=torch.bool).tril()
    if name == "none":
        return {}, None
    if name == "causal":
        return {"is_causal": True}, causal
    if name == "float_minus_1e4_causal":
        return {"attn_mask": _minus_inf_where_not(causal, torch.float64, -1e4)}, causal
    if name == "bool_padding_Bx1x1xK":
        keep = torch.tensor([[True] * K, [True] * 4 + [False] * (K - 4)])[:, None, None, :]
        return {"attn_mask": keep}, keep
    keep = _keep_some(torch.rand((B, 1, Q, K) if name == "bool_Bx1xQxK" else (Q, K), generator=gen) > 0.4)
    if name == "float_minus_inf_QxK":
        return {"attn_mask": _minus_inf_where_not(keep, torch.float64)}, keep
    return {"attn_mask": keep}, keep


def _inputs(dtype: torch.dtype, seed: int = 0) -> tuple[list[Tensor], list[Tensor], Tensor, torch.Generator]:
    """q, k, v in ``dtype`` and the same values in float64 (leaves), and an output gradient in float64."""
    gen = torch.Generator().manual_seed(seed)
    base = [torch.randn(B, H, n, w, generator=gen).to(dtype) for n, w in ((Q, E), (K, E), (K, D))]
    got = [t.clone().requires_grad_() for t in base]
    ref = [t.double().requires_grad_() for t in base]
    dy = torch.randn(B, H, Q, D, generator=gen, dtype=torch.float64)
    return got, ref, dy, gen


def _mask_in(kwargs: dict, dtype: torch.dtype) -> dict:
    """The call's arguments with a float mask in ``dtype`` (SDPA takes it in q's dtype)."""
    mask = kwargs.get("attn_mask")
    if mask is not None and mask.is_floating_point():
        return {**kwargs, "attn_mask": mask.to(dtype)}
    return kwargs


def _errors(y: Tensor, grads: tuple, y_ref: Tensor, grads_ref: tuple) -> list[float]:
    return [_rel(y, y_ref)] + [_rel(g, r) for g, r in zip(grads, grads_ref)]


# ---------------------------------------------------------------- softmax: SDPA's own call


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mask_name", [*MASKS, "float_bias_and_minus_inf_QxK"])
def test_softmax_equals_sdpa(mask_name: str, dtype: torch.dtype) -> None:
    """Softmax attention is SDPA, float masks (finite biases, -1e4 and partly -inf rows) added as SDPA adds
    them, the gradient of a float mask included: against SDPA in float64 on each CPU backend."""
    got, ref, dy, gen = _inputs(dtype)
    if mask_name == "float_bias_and_minus_inf_QxK":
        keep = _keep_some(torch.rand(Q, K, generator=gen) > 0.3)
        bias = torch.randn(Q, K, generator=gen).to(dtype).double()
        kwargs = {"attn_mask": bias.masked_fill(~keep, -math.inf)}
    else:
        kwargs, _ = mask_case(mask_name, gen)
    float_mask = kwargs.get("attn_mask") is not None and kwargs["attn_mask"].is_floating_point()
    ref_kwargs = _mask_in(kwargs, torch.float64)
    mask_ref = ref_kwargs["attn_mask"].clone().requires_grad_() if float_mask else None
    if float_mask:
        ref_kwargs["attn_mask"] = mask_ref
    y_ref = F.scaled_dot_product_attention(*ref, **ref_kwargs)
    grads_ref = torch.autograd.grad(y_ref, [*ref, *([mask_ref] if float_mask else [])], dy)
    config = attention_preset("softmax")
    for backend in cpu_backends(config, dtype):
        call_kwargs = _mask_in(kwargs, dtype)
        mask_got = call_kwargs["attn_mask"].clone().requires_grad_() if float_mask else None
        if float_mask:
            call_kwargs["attn_mask"] = mask_got
        y = hyla.functional.attention(*got, **call_kwargs, attention="softmax", backend=backend)
        assert y.dtype == dtype and y.shape == (B, H, Q, D)
        grads = torch.autograd.grad(y, [*got, *([mask_got] if float_mask else [])], dy.to(dtype))
        errors = _errors(y, grads, y_ref, grads_ref)
        assert max(errors) < TOLERANCE[dtype], (backend, errors)


@pytest.mark.parametrize(("num_queries", "num_keys"), [(7, 4), (4, 7)])
def test_is_causal_is_top_left_aligned_as_sdpa(num_queries: int, num_keys: int) -> None:
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, H, n, E, generator=gen, dtype=torch.float64) for n in (num_queries, num_keys, num_keys))
    y = hyla.functional.attention(q, k, v, is_causal=True, attention="softmax")
    assert _rel(y, F.scaled_dot_product_attention(q, k, v, is_causal=True)) < 1e-12


def test_scale_as_sdpa_and_as_the_scores_definition() -> None:
    """``scale`` multiplies ``q . k``; its default is every preset's ``1 / sqrt(E)`` (bit for bit the default)."""
    _, ref, _, gen = _inputs(torch.float64)
    q, k, v = ref
    y = hyla.functional.attention(q, k, v, scale=0.37, attention="softmax")
    assert _rel(y, F.scaled_dot_product_attention(q, k, v, scale=0.37)) < 1e-12
    w_mid = torch.randn(H, D, D, generator=gen, dtype=torch.float64)
    for preset in ("hyla", "linear", "hyla_plus"):
        config = attention_preset(preset)
        mid = w_mid if preset == "hyla_plus" else None
        s = 0.37 * torch.einsum("bhqe,bhke->bhqk", q, k)
        want, _ = value_network(normalize_scores(s, config.normalization), v, config.value_network, "relu", mid)
        assert _rel(hyla.functional.attention(q, k, v, scale=0.37, attention=preset, w_mid_HxDxD=mid), want) < 1e-12
        default = hyla.functional.attention(q, k, v, attention=preset, w_mid_HxDxD=mid)
        assert torch.equal(
            default, hyla.functional.attention(q, k, v, scale=E**-0.5, attention=preset, w_mid_HxDxD=mid)
        )


# ---------------------------------------------------------------- every preset: the direct form and the naive loop


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize("preset", ALL_PRESETS)
def test_every_preset_equals_the_direct_form(preset: str, mask_name: str, dtype: torch.dtype) -> None:
    """Against the direct form in float64 with the bool mask that the call's mask means (a float mask's -inf
    and, without softmax, its -1e4 entries not attended), on each CPU backend that covers the case."""
    config = attention_preset(preset)
    if config.normalization == "softmax" and mask_name == "float_minus_1e4_causal":
        return  # softmax adds -1e4 (SDPA's meaning): test_softmax_equals_sdpa
    got, ref, dy, gen = _inputs(dtype)
    kwargs, mask = mask_case(mask_name, gen)
    deep = config.value_network == "hyper_deep"
    w_mid = (torch.randn(H, D, D, generator=gen) * D**-0.5).to(dtype) if deep else None
    w_mid_ref = w_mid.double().requires_grad_() if w_mid is not None else None
    y_ref, _ = hypernetwork_attention(*ref, config, mask_Bx1xQxK=mask, w_mid_HxDxD=w_mid_ref)
    grads_ref = torch.autograd.grad(y_ref, [*ref, *([w_mid_ref] if deep else [])], dy)
    for backend in cpu_backends(config, dtype):
        w_mid_got = w_mid.clone().requires_grad_() if w_mid is not None else None
        y = hyla.functional.attention(
            *got, **_mask_in(kwargs, dtype), attention=preset, w_mid_HxDxD=w_mid_got, backend=backend
        )
        assert y.dtype == dtype
        grads = torch.autograd.grad(y, [*got, *([w_mid_got] if deep else [])], dy.to(dtype))
        errors = _errors(y, grads, y_ref, grads_ref)
        assert max(errors) < TOLERANCE[dtype], (backend, errors)


@pytest.mark.parametrize("preset", ALL_PRESETS)
@pytest.mark.parametrize("mask_name", ["causal", "key_padding_as_bool", "key_padding_as_minus_inf"])
def test_the_call_between_the_projections_equals_the_naive_loop(preset: str, mask_name: str) -> None:
    """The module's projections, the functional call and the output projection against the paper's equations
    spelled out pair by pair (``naive_attention``), forward and input gradient, float64."""
    torch.manual_seed(0)
    m = Attention(6, H, preset, head_dim_qk=2, head_dim_v=2, causal=mask_name == "causal").double()
    x = torch.randn(B, Q, 6, dtype=torch.float64, requires_grad=True)
    pad = torch.tensor([[False] * Q, [False, True, False, True, True]])
    q, k, v = m.project(x)
    if mask_name == "causal":
        kwargs = {"is_causal": True}
    elif mask_name == "key_padding_as_bool":
        kwargs = {"attn_mask": (~pad)[:, None, None, :]}
    else:
        kwargs = {"attn_mask": _minus_inf_where_not((~pad)[:, None, None, :], torch.float64)}
    y = hyla.functional.attention(q, k, v, **kwargs, attention=m.config, w_mid_HxDxD=m.w_mid_HxDxD)
    out = m.out_proj(y.transpose(1, 2).reshape(B, Q, -1))
    want, _ = naive_attention(m, x, key_padding_mask=None if mask_name == "causal" else pad)
    assert _rel(out, want) < 1e-10
    g = torch.randn_like(out)
    (grad,) = torch.autograd.grad((out * g).sum(), x)
    (grad_want,) = torch.autograd.grad((want * g).sum(), x)
    assert _rel(grad, grad_want) < 1e-10


@pytest.mark.parametrize("preset", ["softmax", "hyla", "linear", "hyla_plus"])
def test_a_mask_that_varies_over_heads(preset: str) -> None:
    """SDPA takes masks per head; the kernels take one for all heads, so ``auto`` takes a backend that covers
    it and ``fused_cpu`` asked for it says so."""
    config = attention_preset(preset)
    got, ref, dy, gen = _inputs(torch.float64)
    mask = _keep_some(torch.rand(B, H, Q, K, generator=gen) > 0.4)
    w_mid = torch.randn(H, D, D, generator=gen, dtype=torch.float64) if preset == "hyla_plus" else None
    if preset == "softmax":
        y_ref = F.scaled_dot_product_attention(*ref, attn_mask=mask)
    else:
        y_ref, _ = hypernetwork_attention(*ref, config, mask_Bx1xQxK=mask, w_mid_HxDxD=w_mid)
    grads_ref = torch.autograd.grad(y_ref, ref, dy)
    for backend in cpu_backends(config, torch.float64):
        if backend == "fused_cpu":
            with pytest.raises(CpuKernelUnavailableError, match="varies over heads"):
                hyla.functional.attention(*got, attn_mask=mask, attention=preset, backend=backend)
            continue
        y = hyla.functional.attention(*got, attn_mask=mask, attention=preset, w_mid_HxDxD=w_mid, backend=backend)
        assert max(_errors(y, torch.autograd.grad(y, got, dy), y_ref, grads_ref)) < 1e-10, backend


# ---------------------------------------------------------------- float masks without softmax over keys


@pytest.mark.parametrize(
    ("fill", "mask_dtype"),
    [
        (-1e4, torch.float32),
        (-1e9, torch.float32),
        (-math.inf, torch.float32),
        (torch.finfo(torch.float32).min, torch.float32),
        (-1e4, torch.bfloat16),
    ],
)
@pytest.mark.parametrize("preset", ["hyla", "linear", "linear_rmshead", "hyla_no_rmshead", "hyla_plus"])
def test_very_negative_float_masks_mean_not_attended_without_softmax(
    preset: str, fill: float, mask_dtype: torch.dtype
) -> None:
    """A causal float mask of 0 and -1e4 (or below, or -inf) gives the causal result exactly: added to the
    scores, -1e4 dominates RMSHead's normalization and -inf makes NaN. -1e4 in bfloat16 is -9984, counted too."""
    got, _, _, gen = _inputs(torch.float32)
    q, k, v = (t.detach() for t in got)
    w_mid = torch.randn(H, D, D, generator=gen) * D**-0.5 if preset == "hyla_plus" else None
    causal = torch.ones(Q, K, dtype=torch.bool).tril()
    float_mask = _minus_inf_where_not(causal, mask_dtype, fill)
    want = hyla.functional.attention(q, k, v, is_causal=True, attention=preset, w_mid_HxDxD=w_mid)
    for backend in cpu_backends(attention_preset(preset), torch.float32):
        y = hyla.functional.attention(
            q, k, v, attn_mask=float_mask, attention=preset, w_mid_HxDxD=w_mid, backend=backend
        )
        assert _rel(y, want) < 1e-6, backend
    if fill > torch.finfo(torch.float32).min:  # (its square overflows, so RMSHead happens to zero it)
        # what the mask does as a bias, as it was taken before: far off, or NaN
        config = attention_preset(preset)
        as_bias, _ = hypernetwork_attention(q, k, v, config, bias=float_mask.float(), w_mid_HxDxD=w_mid)
        assert not (as_bias - want).abs().max() < 0.1


@pytest.mark.parametrize("preset", NON_SOFTMAX)
@pytest.mark.parametrize("entry", [0.5, -100.0, math.nan])
def test_a_float_mask_with_finite_biases_is_refused_without_softmax(preset: str, entry: float) -> None:
    got, _, _, _ = _inputs(torch.float32)
    mask = torch.zeros(Q, K)
    mask[0, 3:] = -math.inf
    mask[1, 1] = entry
    w_mid = torch.zeros(H, D, D) if PRESETS[preset].value_network == "hyper_deep" else None
    with pytest.raises(ValueError, match=r"^attn_mask: normalization='(none|rms_head)' has no softmax over keys"):
        hyla.functional.attention(*got, attn_mask=mask, attention=preset, w_mid_HxDxD=w_mid)
    with pytest.raises(ValueError, match=r"^attn_mask: normalization="):
        Attention(6, H, preset, head_dim_qk=2, head_dim_v=2)(torch.randn(B, Q, 6), attn_mask=mask[:Q, :Q])


def test_softmax_adds_a_very_negative_float_mask_as_sdpa_does() -> None:
    """Softmax is left alone: -1e4 on some keys of a row all but removes them, on all keys of a row it is that
    row unmasked (softmax ignores a shift), as in SDPA; only -inf removes a key exactly."""
    _, ref, _, _ = _inputs(torch.float64)
    mask = torch.zeros(Q, K, dtype=torch.float64)
    mask[2] = -1e4
    mask[3, 1:] = -1e4
    y = hyla.functional.attention(*ref, attn_mask=mask, attention="softmax")
    assert _rel(y, F.scaled_dot_product_attention(*ref, attn_mask=mask)) < 1e-12
    unmasked = hyla.functional.attention(*ref, attention="softmax")
    assert _rel(y[:, :, 2], unmasked[:, :, 2]) < 1e-12 and _rel(y[:, :, 3], ref[2][:, :, 0]) < 1e-12


# ---------------------------------------------------------------- a query with nothing to attend


@pytest.mark.parametrize("how", ["bool", "minus_inf"])
@pytest.mark.parametrize("preset", ALL_PRESETS)
def test_a_query_with_nothing_to_attend_gets_zero(preset: str, how: str) -> None:
    """The documented rule: 0 (the empty sum) on every backend, gradients finite and none through that query;
    the other queries as without it."""
    config = attention_preset(preset)
    got, _, _, gen = _inputs(torch.float32)
    keep = _keep_some(torch.rand(B, 1, Q, K, generator=gen) > 0.4)
    keep[1, 0, 2] = False
    mask = keep if how == "bool" else _minus_inf_where_not(keep, torch.float32)
    w_mid = torch.randn(H, D, D, generator=gen) * D**-0.5 if config.value_network == "hyper_deep" else None
    want, _ = hypernetwork_attention(*got, config, mask_Bx1xQxK=keep, w_mid_HxDxD=w_mid)
    for backend in cpu_backends(config, torch.float32):
        y = hyla.functional.attention(*got, attn_mask=mask, attention=preset, w_mid_HxDxD=w_mid, backend=backend)
        assert torch.equal(y[1, :, 2], torch.zeros(H, D)), backend
        assert _rel(y, want) < 1e-5, backend
        dy = torch.zeros_like(y)
        dy[1, :, 2] = 1.0
        grads = torch.autograd.grad(y, got, dy, allow_unused=True)
        assert all(g is None or (torch.isfinite(g).all() and g.abs().max() == 0) for g in grads), backend


def test_a_query_with_nothing_to_attend_in_the_module_outputs_the_output_bias() -> None:
    torch.manual_seed(0)
    for preset in ("softmax", "hyla"):
        m = Attention(8, 2, preset)
        x = torch.randn(2, 4, 8)
        key_mask = torch.tensor([[True, True, False, True], [False] * 4])
        out = m(x, key_mask=key_mask)
        assert torch.equal(out[1], m.out_proj.bias.expand(4, 8))
        assert not torch.allclose(out[0], m.out_proj.bias.expand(4, 8))


# ---------------------------------------------------------------- dropout, the backend, the lazy import


@pytest.mark.parametrize("preset", ["softmax", "hyla", "hyla_plus"])
def test_dropout_only_while_training(preset: str) -> None:
    """``training=True`` drops the pairs of one ``Q x K`` keep-mask (the module's dropout); ``training=False``
    leaves ``dropout_p`` alone and draws nothing."""
    config = attention_preset(preset)
    got, _, _, gen = _inputs(torch.float64)
    w_mid = torch.randn(H, D, D, generator=gen, dtype=torch.float64) if preset == "hyla_plus" else None
    keep = torch.rand(1, 1, Q, K, generator=gen) >= 0.3
    s = torch.einsum("bhqe,bhke->bhqk", got[0] / math.sqrt(E), got[1])
    for backend in cpu_backends(config, torch.float64):
        torch.manual_seed(7)  # the keep-mask that the call draws from the default generator
        drawn = torch.rand(1, 1, Q, K) >= 0.3
        s_drawn = drop_pairs(normalize_scores(s, config.normalization), 0.3, drawn)
        want_drawn, _ = value_network(s_drawn, got[2], config.value_network, config.nonlinearity, w_mid)
        torch.manual_seed(7)
        y = hyla.functional.attention(
            *got, attention=preset, dropout_p=0.3, training=True, w_mid_HxDxD=w_mid, backend=backend
        )
        assert _rel(y, want_drawn) < 1e-12, backend
    module = Attention(E * H, H, preset, qk_dim=E * H, v_dim=D * H, dropout=0.3).double().train()
    x = torch.randn(B, Q, E * H, dtype=torch.float64, generator=gen)
    q, k, v = module.project(x)
    s_module = torch.einsum("bhqe,bhke->bhqk", q / math.sqrt(E), k)
    a_kept = drop_pairs(normalize_scores(s_module, config.normalization), 0.3, keep[..., :Q])
    heads, _ = value_network(a_kept, v, config.value_network, config.nonlinearity, module.w_mid_HxDxD)
    want_module = module.out_proj(heads.transpose(1, 2).reshape(B, Q, -1))
    assert _rel(module(x, dropout_keep=keep[..., :Q]), want_module) < 1e-12
    with pytest.raises(ValueError, match="dropout_keep"):
        module.eval()(x, dropout_keep=keep[..., :Q])
    state = torch.get_rng_state()
    y_eval = hyla.functional.attention(*got, attention=preset, dropout_p=0.3, w_mid_HxDxD=w_mid)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(y_eval, hyla.functional.attention(*got, attention=preset, w_mid_HxDxD=w_mid))


def test_auto_runs_the_c_kernel_inside_and_the_module_takes_the_same_path() -> None:
    if not _has_c_compiler():
        pytest.skip("no C compiler for the fused CPU kernel")
    got, _, _, _ = _inputs(torch.float32)
    y = hyla.functional.attention(*got, is_causal=True)
    assert any("fused_cpu_attention" in n for n in autograd_node_names(y))
    torch.manual_seed(0)
    m = Attention(12, H, "hyla", causal=True)
    x = torch.randn(B, Q, 12)
    q, k, v = m.project(x)
    heads = hyla.functional.attention(q, k, v, is_causal=True, attention=m.config)
    assert torch.equal(m(x), m.out_proj(heads.transpose(1, 2).reshape(B, Q, -1)))


def test_import_hyla_stays_light_and_offers_functional() -> None:
    code = (
        "import sys, hyla; assert 'torch' not in sys.modules and 'functional' in dir(hyla); "
        "assert callable(hyla.functional.attention) and 'torch' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=HANG_GUARD_S)


def _bad(**changes: object) -> dict:
    q, k, v = (torch.randn(B, H, n, E) for n in (Q, K, K))
    return {"q": q, "k": k, "v": v, **changes}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (_bad(q=torch.randn(H, Q, E)), r"^q must be a 4-D tensor"),
        (_bad(k=torch.randn(B, H, K, E + 1)), r"^k must have shape \(batch=2, heads=3, keys, E=4\)"),
        (_bad(v=torch.randn(B, H, K + 1, D)), r"^v must have shape \(batch=2, heads=3, keys=7, D\)"),
        (_bad(v=torch.randn(B, H, K, D, dtype=torch.float64)), r"^v must have q's dtype"),
        (_bad(attn_mask=torch.zeros(Q, K, dtype=torch.int64)), r"^attn_mask must be bool \(True = attend\) or float"),
        (_bad(attn_mask=torch.ones(Q, K + 1, dtype=torch.bool)), r"^attn_mask must broadcast to"),
        (_bad(attn_mask=torch.ones(Q, K, dtype=torch.bool), is_causal=True), r"^is_causal=True cannot be combined"),
        (_bad(is_causal=1), r"^is_causal must be True or False"),
        (_bad(scale=math.inf), r"^scale must be a finite number"),
        (_bad(dropout_p=1.0), r"^dropout_p must be a number in \[0, 1\)"),
        (_bad(training="yes"), r"^training must be True or False"),
        (_bad(attention="hyperbolic"), r"^attention preset 'hyperbolic' is unknown; allowed values: softmax"),
        (_bad(attention=3), r"^attention must be a preset name or an AttentionConfig"),
        (_bad(attention="hyla_plus"), r"^w_mid_HxDxD must be a tensor of shape \(heads=3, D=4, D=4\)"),
        (_bad(w_mid_HxDxD=torch.zeros(H, D, D)), r"^w_mid_HxDxD is for value_network='hyper_deep' only"),
        (_bad(bias=torch.zeros(H, Q, K + 1)), r"^bias must broadcast to"),
        (_bad(backend="cuda"), r"^backend='cuda' is not valid; allowed values: auto"),
        (_bad(chunk_size=0), r"^chunk_size must be a positive int"),
    ],
)
def test_bad_arguments_name_the_parameter(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        hyla.functional.attention(**kwargs)


# ---------------------------------------------------------------- the module: one convention, True = attend


def _module(preset: str, **kw: object) -> Attention:
    torch.manual_seed(0)
    return Attention(6, H, preset, head_dim_qk=2, head_dim_v=2, **kw).double()


@pytest.mark.parametrize("preset", ["softmax", "hyla", "hyla_plus"])
def test_key_padding_mask_is_deprecated_and_is_key_mask_inverted(preset: str) -> None:
    m = _module(preset)
    x = torch.randn(B, Q, 6, dtype=torch.float64)
    pad = torch.tensor([[False] * Q, [False, True, False, True, True]])
    with pytest.warns(DeprecationWarning, match=r"key_padding_mask .* is deprecated; pass key_mask=~key_padding_mask"):
        old = m(x, key_padding_mask=pad)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m(x, key_padding_mask=pad)
        m.value_network_weights(x, key_padding_mask=pad)
        m.latent_code(x, key_padding_mask=pad)
    # the warning names the caller's line, not the library's (Python shows a DeprecationWarning in __main__ only)
    assert [w.filename for w in caught] == [__file__] * 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = m(x, key_mask=~pad)
    assert torch.equal(old, new)
    with (
        pytest.raises(ValueError, match=r"key_mask .* or the deprecated key_padding_mask .* not both"),
        pytest.warns(DeprecationWarning),
    ):
        m(x, key_mask=~pad, key_padding_mask=pad)
    with (
        pytest.raises(ValueError, match=r"^key_padding_mask must be a bool tensor of shape \(batch=2, keys=5\)"),
        pytest.warns(DeprecationWarning),
    ):
        m(x, key_padding_mask=pad[:, :4])


@pytest.mark.parametrize("preset", ALL_PRESETS)
def test_module_key_mask_and_attn_mask_match_the_naive_loop(preset: str) -> None:
    """``key_mask``, a bool ``attn_mask`` and a 0/-inf float one (True / 0 = attend), each with causality,
    against the naive loop's key padding: forward and input gradient."""
    m = _module(preset, causal=True)
    x = torch.randn(B, Q, 6, dtype=torch.float64, requires_grad=True)
    pad = torch.tensor([[False] * Q, [False, True, False, True, True]])
    want, _ = naive_attention(m, x, key_padding_mask=pad)
    g = torch.randn_like(want)
    (grad_want,) = torch.autograd.grad((want * g).sum(), x)
    keep_Bx1x1xK = (~pad)[:, None, None, :]
    for kwargs in (
        {"key_mask": ~pad},
        {"attn_mask": keep_Bx1x1xK},
        {"attn_mask": _minus_inf_where_not(keep_Bx1x1xK.expand(B, H, Q, Q), torch.float64)},
    ):
        out = m(x, **kwargs)
        (grad,) = torch.autograd.grad((out * g).sum(), x)
        assert _rel(out, want) < 1e-10 and _rel(grad, grad_want) < 1e-10, list(kwargs)


def test_module_float_attn_mask_of_minus_1e4_is_causality_without_softmax() -> None:
    for preset in ("hyla", "linear"):
        causal, plain = _module(preset, causal=True), _module(preset)
        x = torch.randn(B, Q, 6, dtype=torch.float64)
        float_causal = _minus_inf_where_not(torch.ones(Q, Q, dtype=torch.bool).tril(), torch.float64, -1e4)
        assert _rel(plain(x, attn_mask=float_causal), causal(x)) < 1e-12
    # softmax adds it, as SDPA: exp(-1e4) underflows to 0, so it masks too
    assert _rel(_module("softmax")(x, attn_mask=float_causal), _module("softmax", causal=True)(x)) < 1e-12
