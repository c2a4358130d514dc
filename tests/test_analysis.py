"""Latent-code analysis: the (q, k) selection, extraction, probes and compositionality measures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hyla.analysis import compositionality as comp
from hyla.analysis.latents import collect_latents, sraven_pairs
from hyla.analysis.plots import embedding_panels, rule_heatmaps
from hyla.analysis.probes import rule_probe, term_probe
from hyla.cli import main
from hyla.train.loop import load_trained

TINY = [
    "model.num_layers=2",
    "model.emb_dim=16",
    "model.num_heads=2",
    "model.qk_dim=8",
    "model.v_dim=8",
    "model.mlp_dim=32",
    "train.steps=6",
    "train.eval_every=3",
    "train.eval_size=64",
    "train.eval_batch_size=32",
    "train.log_every=3",
    "train.checkpoint_every=3",
    "train.batch_size=16",
]


@pytest.fixture(scope="module")
def sraven_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "sraven"
    assert main(["train", "sraven", *TINY, "--out", str(out), "--quiet"]) == 0
    return out


def test_query_key_selection_by_hand() -> None:
    # column 0 identity, column 1 reversed, column 2 swaps slots 0 and 1 (F=4 -> 36 tokens)
    perm = torch.tensor([[[0, 1, 2, 3], [3, 2, 1, 0], [1, 0, 2, 3]]])
    q, k = sraven_pairs(perm, num_features=4)
    assert q.tolist() == [[32, 33, 34, 35]]
    # answer slot 0 holds canonical feature 1: panel (2,0) slot 1 -> token 24+1; panel (2,1) slot 2 -> 28+2
    assert k[0, 0].tolist() == [25, 30]
    assert k[0, 1].tolist() == [24, 31]  # feature 0: col0 slot 0, col1 slot 3
    assert k[0, 2].tolist() == [26, 29]  # feature 2: col0 slot 2, col1 slot 1
    assert k[0, 3].tolist() == [27, 28]  # feature 3: col0 slot 3, col1 slot 0


def test_extraction_matches_the_models_latent_code(sraven_run: Path) -> None:
    lat = collect_latents(sraven_run, "ood", num=40, batch_size=16)
    assert lat["codes"].shape == (40, 4, 2, 2, 2)  # (N, F, layers, keys, heads)
    assert lat["query_rule"].shape == (40, 4) and lat["key_tokens"].shape == (40, 4, 2)
    assert np.array_equal(lat["query_rule"], np.take_along_axis(lat["rules"], lat["perm"][:, 2], axis=1))
    # recompute problem 0 directly: same generator seed and batch split as collect_latents
    _cfg, task, model = load_trained(sraven_run)
    batch = task.sample(16, "ood", torch.Generator().manual_seed(0))
    codes = model.latent_codes(batch.inputs)
    for i in range(4):
        q, (k0, k1) = lat["query_tokens"][0, i], lat["key_tokens"][0, i]
        for layer in range(2):
            assert np.allclose(lat["codes"][0, i, layer, 0], codes[layer][0, :, q, k0].numpy())
            assert np.allclose(lat["codes"][0, i, layer, 1], codes[layer][0, :, q, k1].numpy())


def _planted(num: int, rules: np.ndarray, rng: np.random.Generator, signal: float) -> dict:
    """Synthetic SRAVEN latents whose code of a slot encodes its rule (plus noise)."""
    f = rules.shape[1]
    perm = np.stack([np.stack([rng.permutation(f) for _ in range(3)]) for _ in range(num)])
    query_rule = np.take_along_axis(rules, perm[:, 2], axis=1)
    basis = np.random.default_rng(123).normal(size=(8, 2 * 2 * 4))
    codes = signal * basis[query_rule] + rng.normal(size=(num, f, 2 * 2 * 4))
    return {"codes": codes.reshape(num, f, 2, 2, 4), "query_rule": query_rule, "rules": rules, "perm": perm}


def test_rule_probe_finds_planted_structure_and_not_after_shuffling() -> None:
    rng = np.random.default_rng(0)
    train_rules = np.sort(rng.integers(0, 8, size=(400, 4)), axis=1)
    ood_rules = np.sort(rng.integers(0, 8, size=(200, 4)), axis=1)
    result = rule_probe(_planted(400, train_rules, rng, 3.0), _planted(200, ood_rules, rng, 3.0))
    assert result["layers"]["all"]["ood_acc"] > 0.9
    assert result["layers"]["all"]["shuffled_label_ood_acc"] < result["chance"] + 0.1
    noise = rule_probe(_planted(400, train_rules, rng, 0.0), _planted(200, ood_rules, rng, 0.0))
    assert noise["layers"]["all"]["ood_acc"] < noise["chance"] + 0.1


def test_term_probe_planted_and_shuffled() -> None:
    rng = np.random.default_rng(0)
    terms = rng.random((600, 2, 4)) < 0.5
    codes = np.where(terms, 1.0, -1.0).reshape(600, -1) @ rng.normal(size=(8, 30)) + 0.3 * rng.normal(size=(600, 30))
    result = term_probe(codes, terms)
    assert result["r2"] > 0.8 and result["shuffled_label_r2"] < 0.1
    assert term_probe(rng.normal(size=(600, 30)), terms)["r2"] < 0.1


def test_topographic_similarity_planted_and_noise() -> None:
    rng = np.random.default_rng(0)
    rules = np.array(sorted({tuple(sorted(rng.integers(0, 8, 4))) for _ in range(60)}))[:40]
    structured = np.eye(8)[rules].reshape(len(rules), -1) + 0.1 * rng.normal(size=(len(rules), 32))
    res = comp.topographic_similarity(structured, rules, "slots", permutations=200)
    assert res["rho"] > 0.5 and res["p_value"] < 0.01
    noise = comp.topographic_similarity(rng.normal(size=(len(rules), 32)), rules, "slots", permutations=200)
    assert abs(noise["rho"]) < 0.15 and noise["p_value"] > 0.05
    d = comp.task_distance_matrix(np.array([[0, 1, 5, 7], [0, 2, 6, 7], [3, 4, 6, 7]]), "semantic")
    assert d[0, 1] == 1.0 and d[0, 2] == 2.0  # within a family (progressions, arithmetic) a change counts 0.5
    assert comp.task_distance_matrix(np.array([[0, 1, 5, 7], [0, 2, 6, 7]]), "slots")[0, 1] == 2
    with pytest.raises(ValueError, match="kind='cosine' is not valid"):
        comp.task_distance_matrix(rules, "cosine")


def test_canonical_codes_align_features() -> None:
    codes = np.arange(2 * 4).reshape(1, 4, 1, 1, 2).astype(float)  # slot i has code (2i, 2i+1)
    perm = np.array([[[0, 1, 2, 3], [0, 1, 2, 3], [2, 0, 3, 1]]])  # answer slot i holds feature perm[2, i]
    out = comp.canonical_codes({"codes": codes, "perm": perm}).reshape(4, 2)
    assert out[:, 0].tolist() == [2, 6, 0, 4]  # feature 0 sits in slot 1, feature 1 in slot 3, ...


def test_plots_have_one_panel_per_layer(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 8, 120)
    feats = [rng.normal(size=(120, 6)) + labels[:, None] for _ in range(3)]
    _, n = embedding_panels(feats, labels, [f"r{i}" for i in range(8)], tmp_path / "e.png", "pca")
    assert n == 3 and (tmp_path / "e.png").stat().st_size > 1000
    _, n = embedding_panels(feats[:2], labels, [f"r{i}" for i in range(8)], tmp_path / "t.png", "tsne")
    assert n == 2
    _, n = rule_heatmaps(rng.normal(size=(4, 8, 16)), [f"r{i}" for i in range(8)], tmp_path / "h.png")
    assert n == 4 and (tmp_path / "h.png").is_file()


def test_analyze_cli_end_to_end(sraven_run: Path, tmp_path: Path, capsys) -> None:
    assert (
        main(
            ["analyze", "latents", str(sraven_run), "--split", "test", "--num", "32", "--out", str(tmp_path / "l.npz")]
        )
        == 0
    )
    assert set(np.load(tmp_path / "l.npz").files) >= {"codes", "query_rule", "rules", "perm", "key_tokens"}
    assert main(["analyze", "probe", str(sraven_run), "--num", "64", "--out", str(tmp_path / "p")]) == 0
    assert (tmp_path / "p" / "probe.json").is_file() and "shuffled-label control" in capsys.readouterr().out
    assert main(["analyze", "plots", str(sraven_run), "--num", "64", "--out", str(tmp_path / "f")]) == 0
    assert {p.name for p in (tmp_path / "f").iterdir()} >= {
        "latents_pca.png",
        "latents_tsne.png",
        "mean_code_per_rule.png",
    }
    assert (
        main(
            [
                "analyze",
                "topsim",
                str(sraven_run),
                "--num",
                "128",
                "--permutations",
                "20",
                "--out",
                str(tmp_path / "t.json"),
            ]
        )
        == 0
    )
    assert "rho(slots)" in capsys.readouterr().out
