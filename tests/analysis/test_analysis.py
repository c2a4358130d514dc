"""Latent-code analysis: the (q, k) selection, extraction, probes and compositionality measures."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from hyla.analysis import compositionality as comp
from hyla.analysis.latents import collect_latents, sraven_pairs
from hyla.analysis.plots import embedding_panels, rule_heatmaps
from hyla.analysis.probes import rule_probe, term_probe
from hyla.cli import main
from hyla.tasks import make_task
from hyla.tasks.sraven import RULE_NAMES
from hyla.train.run.folder import load_trained
from tiny import tiny_overrides

TINY = tiny_overrides(layers=2, steps=6, every=3)


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


def test_selected_keys_carry_the_rule_of_the_answer_slot() -> None:
    """On real problems: the keys' values and the answer value obey the rule labelled for the query."""
    task = make_task("sraven")
    p = task.sample_problems(256, "train", torch.Generator().manual_seed(1))
    q, k = sraven_pairs(p["perm"], num_features=4)
    tokens = p["grid"].reshape(256, 36)
    assert torch.equal(q, 32 + torch.arange(4).expand(256, 4))
    answer = p["grid"][:, 2, 2].long()  # what query token 32 + i must predict
    k0, k1 = tokens.gather(1, k[..., 0]).long(), tokens.gather(1, k[..., 1]).long()
    rule = p["rules"].gather(1, p["perm"][:, 2])
    j = p["perm"][:, 2]
    assert torch.equal(k0, p["canonical"][:, 2, 0].gather(1, j).long())  # same canonical feature
    assert torch.equal(k1, p["canonical"][:, 2, 1].gather(1, j).long())
    expected = {0: k1, 1: k1 + 1, 2: k1 + 2, 3: k1 - 1, 4: k1 - 2, 5: k0 + k1, 6: k0 - k1}
    for r, value in expected.items():
        m = rule == r
        assert m.any() and torch.equal(answer[m], value[m] % 8), RULE_NAMES[r]
    m = rule == 7  # distribute-three: the row holds three distinct values
    assert ((answer[m] != k0[m]) & (answer[m] != k1[m]) & (k0[m] != k1[m])).all()


def test_extraction_matches_the_models_latent_code(sraven_run: Path) -> None:
    lat = collect_latents(sraven_run, "ood", num=40, batch_size=16)
    assert lat["codes"].shape == (40, 4, 2, 2, 2)  # (N, F, layers, keys, heads)
    assert lat["query_rule"].shape == (40, 4) and lat["key_tokens"].shape == (40, 4, 2)
    assert np.array_equal(lat["query_rule"], np.take_along_axis(lat["rules"], lat["perm"][:, 2], axis=1))
    # recompute problem 0 directly: same generator seed and batch split as collect_latents
    _path, _cfg, task, model, weights, _step = load_trained(sraven_run)
    assert str(lat["weights"]) == weights  # the arrays name the weights they were read with
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
    literals = np.where(terms, 1.0, -1.0).reshape(600, -1)
    codes = literals @ rng.normal(size=(8, 30)) + 0.3 * rng.normal(size=(600, 30))
    result = term_probe(codes, terms)
    assert result["r2"] > 0.8 and result["shuffled_label_r2"] < 0.1
    assert term_probe(rng.normal(size=(600, 30)), terms)["r2"] < 0.1


def test_term_probe_scores_held_out_combinations_with_the_fit_on_training_ones() -> None:
    """Codes that add up one direction per literal name the terms of combinations never fitted (OOD R^2
    high); codes that only tell the training combinations apart (one arbitrary code each) do not."""
    rng = np.random.default_rng(1)
    combos = (rng.permutation(256)[:40, None] >> np.arange(8) & 1).astype(bool).reshape(40, 2, 4)
    fit_ids, ood_ids = rng.integers(0, 30, 500), rng.integers(30, 40, 200)  # 10 combinations held out
    basis = rng.normal(size=(8, 30))

    def compositional(terms: np.ndarray) -> np.ndarray:
        return np.where(terms, 1.0, -1.0).reshape(len(terms), -1) @ basis + 0.3 * rng.normal(size=(len(terms), 30))

    train, ood = combos[fit_ids], combos[ood_ids]
    result = term_probe(compositional(train), train, ood_codes=compositional(ood), ood_terms_MxKxL=ood)
    assert result["ood_r2"] > 0.9 and result["shuffled_label_ood_r2"] < 0.1 and result["num_ood"] == 200
    lookup = rng.normal(size=(40, 30))
    table = term_probe(lookup[fit_ids], train, ood_codes=lookup[ood_ids], ood_terms_MxKxL=ood)
    assert table["r2"] > 0.9 and table["ood_r2"] < 0.5
    with pytest.raises(ValueError, match="ood_codes"):
        term_probe(compositional(train), train, ood_codes=compositional(ood)[:, :5], ood_terms_MxKxL=ood)


def test_topographic_similarity_planted_and_noise() -> None:
    rng = np.random.default_rng(0)
    rules = np.array(sorted({tuple(sorted(rng.integers(0, 8, 4))) for _ in range(60)}))[:40]
    # per-feature task codes: feature j's code is its rule's basis vector plus noise
    structured = rng.normal(size=(8, 6))[rules] + 0.1 * rng.normal(size=(len(rules), 4, 6))
    res = comp.topographic_similarity(structured, rules, "slots", permutations=200)
    assert res["rho"] > 0.7 and res["p_value"] < 0.01
    noise = comp.topographic_similarity(rng.normal(size=(len(rules), 4, 6)), rules, "slots", permutations=200)
    assert abs(noise["rho"]) < 0.15 and noise["p_value"] > 0.05
    # codes that only know rule families: the semantic distance sees them better than the slots one
    families = rng.normal(size=(4, 6))[comp.RULE_FAMILY[rules]] + 0.1 * rng.normal(size=(len(rules), 4, 6))
    fam_sem = comp.topographic_similarity(families, rules, "semantic", permutations=0)["rho"]
    assert fam_sem > comp.topographic_similarity(families, rules, "slots", permutations=0)["rho"] + 0.05
    d = comp.task_distance_matrix(np.array([[0, 1, 5, 7], [0, 2, 6, 7], [3, 4, 6, 7]]), "semantic")
    assert d[0, 1] == 1.0 and d[0, 2] == 2.0  # within a family (progressions, arithmetic) a change counts 0.5
    assert comp.task_distance_matrix(np.array([[0, 1, 5, 7], [0, 2, 6, 7]]), "slots")[0, 1] == 2
    # multisets: (0,1,2,3) and (1,2,3,4) share three rules, whatever their sorted positions
    assert comp.task_distance_matrix(np.array([[0, 1, 2, 3], [1, 2, 3, 4]]), "slots")[0, 1] == 1
    # the code distance matches features the same way: a shifted copy of three codes is close
    c = np.arange(5.0)[:, None] * np.ones((1, 3))
    assert comp.code_distance_matrix(np.stack([c[:4], c[1:]]))[0, 1] == pytest.approx(4 * np.sqrt(3))
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


def test_analyze_cli_end_to_end(sraven_run: Path, tmp_path: Path, capsys, quick_tsne: None) -> None:
    assert (
        main(
            [
                "analyze",
                "latents",
                str(sraven_run),
                "--split",
                "test",
                "--num",
                "32",
                "--out",
                str(tmp_path / "l.npz"),
            ]
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


@pytest.fixture(scope="module")
def fuzzy_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "fuzzy"
    assert main(["train", "fuzzy_logic", *TINY, "data.num_examples=12", "--out", str(out), "--quiet"]) == 0
    return out


def test_saved_npz_has_documented_keys_and_shapes(sraven_run: Path, fuzzy_run: Path, tmp_path: Path) -> None:
    assert main(["analyze", "latents", str(sraven_run), "--num", "20", "--out", str(tmp_path / "s.npz")]) == 0
    with np.load(tmp_path / "s.npz") as z:
        shapes = {k: z[k].shape for k in z.files}
        assert str(z["task"]) == "sraven" and str(z["split"]) == "ood" and len(z["rule_names"]) == 8
        assert z["codes"].dtype == np.float32
        assert np.array_equal(z["query_tokens"], np.broadcast_to(32 + np.arange(4), (20, 4)))
        assert ((z["key_tokens"] >= 24) & (z["key_tokens"] < 32)).all()  # panels (2, 0) and (2, 1)
    assert shapes == {
        "codes": (20, 4, 2, 2, 2),
        "query_rule": (20, 4),
        "rules": (20, 4),
        "perm": (20, 3, 4),
        "task_id": (20,),
        "query_tokens": (20, 4),
        "key_tokens": (20, 4, 2),
        "task": (),
        "split": (),
        "attention": (),
        "weights": (),
        "rule_names": (8,),
    }
    assert main(["analyze", "latents", str(fuzzy_run), "--split", "test", "--num", "20"]) == 0
    with np.load(fuzzy_run / "latents_test.npz") as z:
        shapes = {k: z[k].shape for k in z.files}
        codes = z["codes"]
    assert shapes == {
        "codes": (20, 2, 11, 2),  # (N, layers, N_examples - 1 context keys, heads)
        "terms": (20, 2, 4),
        "task_id": (20,),
        "task": (),
        "split": (),
        "attention": (),
        "weights": (),
    }
    _path, _cfg, task, model, _weights, _step = load_trained(fuzzy_run)
    batch = task.sample(20, "test", torch.Generator().manual_seed(0))
    assert np.allclose(codes[3, 1], model.latent_codes(batch.inputs)[1][3, :, 11, :11].T.numpy())


def test_fuzzy_probe_cli_and_errors(fuzzy_run: Path, sraven_run: Path, tmp_path: Path, capsys) -> None:
    assert main(["analyze", "probe", str(fuzzy_run), "--num", "64", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "probe.json").read_text())
    assert set(result["layers"]) == {"0", "1", "all"} and result["num"] == 64
    assert "| all |" in (tmp_path / "probe.md").read_text()
    capsys.readouterr()
    assert main(["analyze", "plots", str(fuzzy_run), "--num", "8"]) == 2
    assert "drawn for sraven runs" in capsys.readouterr().err
    assert main(["analyze", "latents", str(sraven_run), "--split", "bogus", "--num", "8"]) == 2
    assert "split='bogus' is not valid" in capsys.readouterr().err
    assert main(["analyze", "topsim", str(fuzzy_run), "--num", "8"]) == 2
    assert "needs sraven" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["analyze", "latents", str(sraven_run), "--num", "0"])
    with pytest.raises(ValueError, match="num=0 must be >= 1"):
        collect_latents(sraven_run, "ood", num=0)
    with pytest.raises(ValueError, match="not a run directory"):
        collect_latents(tmp_path, "ood", num=4)


def test_embedding_subsample_and_bad_method(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 50)
    names = ["a", "b", "c"]
    _, n = embedding_panels([rng.normal(size=(50, 4))], labels, names, tmp_path / "s.png", max_points=20)
    assert n == 1 and (tmp_path / "s.png").is_file()
    with pytest.raises(ValueError, match="method='umap' is not valid"):
        embedding_panels([rng.normal(size=(50, 4))], labels, ["a", "b", "c"], tmp_path / "u.png", "umap")


def test_rule_accuracy_matches_a_problem_by_problem_count(sraven_run: Path) -> None:
    """Slot by slot, with the full forward (every position) and the rule looked up by hand."""
    from hyla.analysis.rule_accuracy import rule_accuracy

    trained = load_trained(sraven_run)
    got = rule_accuracy(trained, "ood", num=96, batch_size=32, seed=3)
    gen = torch.Generator().manual_seed(3)
    right: dict[str, list[bool]] = {}
    kept: dict[bool, list[bool]] = {True: [], False: []}
    swaps: list[bool] = []  # per missed slot: its prediction is another slot's answer
    swaps_by_rule: dict[str, list[bool]] = {}
    chance: list[float] = []
    solved = []
    with torch.no_grad():
        for _ in range(3):  # the same three batches of 32
            batch = trained.task.sample(32, "ood", gen)
            predicted = trained.model(batch.inputs).argmax(-1)[:, -4:]
            for n in range(32):
                slots = []
                for i in range(4):
                    feature = int(batch.info["perm"][n, 2, i])
                    rule = RULE_NAMES[int(batch.info["rules"][n, feature])]
                    ok = bool(predicted[n, i] == batch.info["grid"][n, 2, 2, i])
                    right.setdefault(rule, []).append(ok)
                    slots.append(ok)
                    columns = [int((batch.info["perm"][n, c] == feature).nonzero()) for c in range(3)]
                    kept[columns == [i, i, i]].append(ok)
                    if not ok:
                        answers = [int(batch.info["grid"][n, 2, 2, k]) for k in range(4)]
                        swaps.append(int(predicted[n, i]) in answers[:i] + answers[i + 1 :])
                        swaps_by_rule.setdefault(rule, []).append(swaps[-1])
                        chance.append(len(set(answers[:i] + answers[i + 1 :]) - {answers[i]}) / 7)
                solved.append(all(slots))
    assert got["acc"] == pytest.approx(np.mean(solved))
    assert got["slot_acc"] == pytest.approx(np.mean([ok for oks in right.values() for ok in oks]))
    assert got["rule_slots"] == {rule: len(oks) for rule, oks in right.items()}
    assert got["rule_slot_acc"] == pytest.approx({rule: np.mean(oks) for rule, oks in right.items()})
    assert 0 < got["slot_acc"] < 1  # a tiny model gets some slots right and some wrong: the count could fail
    assert (got["kept_slots"], got["moved_slots"]) == (len(kept[True]), len(kept[False]))
    assert got["kept_slots"] > 0 and got["moved_slots"] > 0
    assert (got["kept_slot_acc"], got["moved_slot_acc"]) == pytest.approx((np.mean(kept[True]), np.mean(kept[False])))
    assert got["misses"] == len(swaps) > 0
    assert got["swap_miss_fraction"] == pytest.approx(np.mean(swaps))
    assert got["swap_miss_fraction_by_chance"] == pytest.approx(np.mean(chance))
    assert got["rule_swap_miss_fraction"] == pytest.approx({rule: np.mean(v) for rule, v in swaps_by_rule.items()})


def test_analyze_rules_cli_tables_and_errors(sraven_run: Path, fuzzy_run: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "rules"
    args = ["analyze", "rules", str(sraven_run), str(sraven_run), "--num", "64", "--names", "a", "b"]
    assert main([*args, "--splits", "test", "ood", "--out", str(out)]) == 0
    text = out.with_suffix(".md").read_text()
    assert text.count("| | a | b |") == 4 and "Split `test`" in text and "Split `ood`" in text
    assert all(f"| {rule} |" in text for rule in RULE_NAMES) and "| the others |" in text
    assert text.count("| all missed slots |") == 2
    saved = json.loads(out.with_suffix(".json").read_text())
    assert [r["split"] for r in saved] == ["test", "test", "ood", "ood"]
    assert saved[0]["acc"] == saved[1]["acc"]  # the same run on the same problems
    capsys.readouterr()
    assert main([*args[:-1], "--num", "8"]) == 2
    assert "--names gives 1 names for 2 runs" in capsys.readouterr().err
    assert main(["analyze", "rules", str(fuzzy_run), "--num", "8"]) == 2
    assert "accuracy by rule is measured for sraven runs, not 'fuzzy_logic' ones" in capsys.readouterr().err


def test_answers_of_other_slots_by_hand() -> None:
    from hyla.analysis.rule_accuracy import answers_of_other_slots

    targets = torch.tensor([[1, 1, 2, 3], [0, 0, 0, 5]])
    predicted = torch.tensor([[2, 0, 1, 3], [5, 0, 7, 0]])
    swapped, chance = answers_of_other_slots(predicted, targets, num_values=8)
    assert swapped.tolist() == [[True, False, True, False], [True, True, False, True]]
    # distinct answers of the other slots, less the slot's own: {2,3}, {2,3}, {1,3}, {1,2}; {5}, {5}, {5}, {0}
    assert chance.flatten().tolist() == pytest.approx([2 / 7] * 4 + [1 / 7] * 4)
