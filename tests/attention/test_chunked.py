"""The chunked backend equals the direct form: forward and every gradient, all options."""

from __future__ import annotations

import pytest
import torch

from hyla.attention import PRESETS, Attention, attention_preset
from hyla.attention.functional import hypernetwork_attention
from hyla.attention.kernels.chunked import chunked_hypernetwork_attention

HYPER = sorted(p for p, c in PRESETS.items() if c.is_hyper)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("preset", HYPER)
@pytest.mark.parametrize("masked", [False, True])
def test_chunked_matches_direct_form(preset: str, masked: bool) -> None:
    torch.manual_seed(0)
    cfg = attention_preset(preset)
    b, h, q, k, e, d = 2, 3, 11, 13, 4, 3
    q_ = torch.randn(b, h, q, e, dtype=torch.float64, requires_grad=True)
    k_ = torch.randn(b, h, k, e, dtype=torch.float64, requires_grad=True)
    v_ = torch.randn(b, h, k, d, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(1, h, q, k, dtype=torch.float64, requires_grad=True)
    w_mid = torch.randn(h, d, d, dtype=torch.float64, requires_grad=True) if cfg.value_network == "hyper_deep" else None
    mask = None
    if masked:  # causal with an offset plus a padded key
        mask = (torch.arange(k)[None, :] <= torch.arange(q)[:, None] + 2)[None, None].expand(b, 1, q, k).clone()
        mask[1, :, :, 4] = False
    ref, _ = hypernetwork_attention(q_, k_, v_, cfg, mask_Bx1xQxK=mask, bias=bias, w_mid_HxDxD=w_mid)
    out = chunked_hypernetwork_attention(q_, k_, v_, cfg, mask_Bx1xQxK=mask, bias=bias, w_mid_HxDxD=w_mid, chunk_size=4)
    assert rel_err(out, ref) < 1e-12
    g = torch.randn_like(ref)
    inputs = [t for t in (q_, k_, v_, bias, w_mid) if t is not None]
    for got, want in zip(torch.autograd.grad((out * g).sum(), inputs), torch.autograd.grad((ref * g).sum(), inputs)):
        assert rel_err(got, want) < 1e-12


def test_module_backend_chunked_equals_direct_in_fp32_and_bf16() -> None:
    torch.manual_seed(0)
    ref = Attention(32, 4, "hyla", causal=True, relative_position=True, backend="direct")
    chunked = Attention(32, 4, "hyla", causal=True, relative_position=True, backend="chunked", chunk_size=5)
    chunked.load_state_dict(ref.state_dict())
    x = torch.randn(2, 17, 32, requires_grad=True)
    a, b = ref(x), chunked(x)
    assert rel_err(b, a) < 1e-5
    ga = torch.autograd.grad(a.sum(), [x, *ref.parameters()])
    gb = torch.autograd.grad(b.sum(), [x, *chunked.parameters()])
    assert all(rel_err(y, z) < 1e-4 for y, z in zip(gb, ga))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert rel_err(chunked(x).float(), ref(x).float()) < 2e-2


def test_fused_backend_says_it_is_not_there_and_bad_chunk_size() -> None:
    m = Attention(16, 2, "hyla", backend="fused")
    with pytest.raises(NotImplementedError, match="backend='fused'"):
        m(torch.randn(1, 3, 16))
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        Attention(16, 2, "hyla", backend="chunked", chunk_size=0)(torch.randn(1, 3, 16))
