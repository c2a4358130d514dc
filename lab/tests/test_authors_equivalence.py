"""lab/authors/authors_equivalence.py: our weights in the authors' flax layout, and its comparison step.

The authors' code itself needs JAX (its own venv, not ours); these tests check the parts that run here: the
layout mapping against our own modules' arithmetic, and the verdict of ``compare`` on made-up results."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from hyla.train.build import build_model, build_task
from hyla.train.config import load_config

SCRIPT = Path(__file__).resolve().parents[2] / "lab" / "authors" / "authors_equivalence.py"
sys.path.insert(0, str(SCRIPT.parent))
from authors_equivalence import to_their_layout  # noqa: E402


def test_their_layout_computes_our_projections() -> None:
    cfg = load_config("sraven", ["model.num_layers=2"])
    model = build_model(cfg, build_task(cfg)).eval()
    heads = cfg.model.num_heads
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    theirs = to_their_layout(state, num_layers=2, num_heads=heads)
    assert len(theirs) == len(state)  # every parameter once, nothing dropped
    attn = model.blocks[1].attn
    x_BxTxD = torch.randn(3, 36, cfg.model.emb_dim, generator=torch.Generator().manual_seed(0))
    p = "transformer_block_1/sequence_mixer/"
    for name, proj in (("query", attn.q_proj), ("key", attn.k_proj), ("value", attn.v_proj)):
        # flax DenseGeneral(features=(H, d)): x @ kernel(in, H, d) + bias(H, d), split into heads as ours
        flax = np.einsum("btc,chd->bthd", x_BxTxD.numpy(), theirs[f"{p}{name}/kernel"]) + theirs[f"{p}{name}/bias"]
        ours = proj(x_BxTxD).detach().view(3, 36, heads, -1).numpy()
        np.testing.assert_allclose(flax, ours, rtol=1e-5, atol=1e-5, err_msg=name)
    y_BxTxHxD = torch.randn(3, 36, heads, cfg.model.v_dim // heads, generator=torch.Generator().manual_seed(1))
    flax = np.einsum("bthd,hdo->bto", y_BxTxHxD.numpy(), theirs[f"{p}out/kernel"]) + theirs[f"{p}out/bias"]
    ours = attn.out_proj(y_BxTxHxD.reshape(3, 36, -1)).detach().numpy()
    np.testing.assert_allclose(flax, ours, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(theirs["embedding/kernel"], state["embed.weight"].T)


def write_results(out: Path, grad_noise: float, zero_grad_noise: float, dtype: type) -> None:
    rng = np.random.default_rng(0)
    grads = {"a/kernel": rng.normal(size=(4, 3)), "b/bias": rng.normal(size=3) * 1e-3, "c/bias": np.zeros(3)}
    logits = rng.normal(size=(5, 4, 8))
    common = {"x": np.zeros((5, 36, 8), dtype), "y": np.zeros((5, 4), np.int64), "loss": np.float64(2.0)}
    np.savez(
        out / "ours.npz",
        **common,
        logits=logits,
        acc=np.float64(0.0),
        mixer=np.array("linear_hypatt"),
        weights=np.array("made up"),
        split=np.array("ood"),
        **{f"grad/{k}": v for k, v in grads.items()},
    )
    theirs = {k: v * (1 + grad_noise) for k, v in grads.items()}
    theirs["c/bias"] = np.full(3, zero_grad_noise)  # zero in exact arithmetic: rounding noise in each code
    np.savez(
        out / "theirs.npz",
        logits=logits,
        loss=np.float64(2.0),
        acc=np.float64(0.0),
        **{f"grad/{k}": v for k, v in theirs.items()},
    )


def compare(out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "compare", "--out", str(out)], capture_output=True, text=True)


@pytest.mark.parametrize(
    ("dtype", "grad_noise", "agrees"),
    [(np.float64, 1e-11, True), (np.float64, 1e-6, False), (np.float32, 1e-4, True), (np.float32, 1e-2, False)],
)
def test_compare_judges_by_the_precision_both_computed_in(
    tmp_path: Path, dtype: type, grad_noise: float, agrees: bool
) -> None:
    write_results(tmp_path, grad_noise, zero_grad_noise=1e-15, dtype=dtype)
    result = compare(tmp_path)
    assert (result.returncode == 0) == agrees, result.stdout
    # the zero gradient is compared to a typical gradient, not to itself (its own scale is noise)
    assert "zero in exact arithmetic (c/bias)" in result.stdout


def test_compare_fails_a_zero_gradient_that_is_not_noise(tmp_path: Path) -> None:
    write_results(tmp_path, grad_noise=0.0, zero_grad_noise=1e-6, dtype=np.float64)  # not below ZERO_GRADIENT
    result = compare(tmp_path)
    assert result.returncode == 1 and "c/bias" in result.stdout.split("above rtol")[1]


def test_their_layout_back_to_ours_is_the_identity() -> None:
    from authors_equivalence import from_their_layout

    cfg = load_config("sraven", ["model.num_layers=2"])
    state = {k: v.detach().numpy() for k, v in build_model(cfg, build_task(cfg)).state_dict().items()}
    back = from_their_layout(to_their_layout(state, 2, cfg.model.num_heads), 2, cfg.model.num_heads)
    assert set(back) == set(state)
    for k, v in state.items():
        np.testing.assert_array_equal(back[k], v, err_msg=k)
