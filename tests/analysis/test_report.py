"""`hyla report`: grouping by configuration, mean +- s.e., the paper's numbers, sweep plots."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from hyla.analysis.paper_numbers import paper_reference
from hyla.analysis.report import build_report, group_runs, sweep_series
from hyla.analysis.stats import format_mean_se, mean_se
from hyla.cli import main
from hyla.train.config import load_config
from hyla.train.run.folder import read_run
from tiny import tiny_overrides


def fake_run(root: Path, name: str, seed: int, ood: float, **overrides: object) -> Path:
    """A run directory as `hyla train` writes it (config.yaml + metrics.jsonl), without training."""
    cfg = load_config("sraven", [f"seed={seed}", f"name={name}", *(f"{k}={v}" for k, v in overrides.items())])
    path = root / f"{name}_s{seed}"
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict()))
    rows = [
        {"step": s, "split": sp, "acc": v, "loss": 1.0}
        for s in (10, 20)
        for sp, v in (("train", 0.9), ("test", 0.8), ("ood", ood * s / 20))
    ]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_mean_and_standard_error() -> None:
    mean, se = mean_se([1.0])  # one seed: no estimate of the spread, never a spread of 0
    assert mean == 1.0 and math.isnan(se) and format_mean_se(mean, se) == "1.00"
    m, se = mean_se([1.0, 2.0, 3.0])
    assert m == 2.0 and math.isclose(se, 1.0 / math.sqrt(3)) and format_mean_se(m, se) == "2.00 +- 0.58"
    with pytest.raises(ValueError, match="at least one"):
        mean_se([])


def test_permutation_p_values_at_their_floor_read_as_a_bound() -> None:
    from hyla.analysis.latent_summary import p_value_text

    assert p_value_text(1 / 1001, 1000) == "<= 0.001"  # no permutation reached the observed statistic
    assert p_value_text(2 / 1001, 1000) == "0.002"
    assert p_value_text(1 / 11, 10) == "<= 0.091" and p_value_text(0.5, 10) == "0.5"


def test_groups_pool_seeds_and_table_shows_paper_numbers(tmp_path: Path) -> None:
    runs = [fake_run(tmp_path, "h", s, ood) for s, ood in ((0, 0.6), (1, 0.7), (2, 0.8))]
    runs += [fake_run(tmp_path, "s", 0, 0.5, **{"model.attention": "softmax"})]
    assert sorted(len(g) for g in group_runs([read_run(r) for r in runs]).values()) == [1, 3]
    table = build_report(runs, tmp_path / "out")
    se = f"{100 * 0.1 / math.sqrt(3):.2f}"
    row = f"| hyla | 3 | 20 of 156,250 | 90.00 +- 0.00 | 80.00 +- 0.00 | 70.00 +- {se} | 69.13 +- 1.90 | Table A1: HYLA"
    assert row in table
    assert "| softmax | 1 |" in table and "56.56 +- 1.05" in table
    assert (tmp_path / "out" / "learning_curves.png").is_file() and (tmp_path / "out" / "report.md").is_file()


def test_the_step_column_says_when_the_runs_of_a_mean_have_not_finished(tmp_path: Path) -> None:
    done = [fake_run(tmp_path, "h", s, 0.6, **{"train.steps": 20}) for s in (0, 1)]
    assert "| hyla | 2 | 20 | 90.00 +- 0.00 |" in build_report(done, tmp_path / "done")
    unfinished = fake_run(tmp_path, "h", 2, 0.6, **{"train.steps": 20})
    rows = [json.loads(line) for line in (unfinished / "metrics.jsonl").read_text().splitlines()]
    (unfinished / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows if r["step"] == 10))
    assert "| hyla | 3 | 10-20 of 20 |" in build_report([*done, unfinished], tmp_path / "mixed")
    fresh = fake_run(tmp_path, "s", 0, 0.5, **{"model.attention": "softmax", "train.steps": 20})
    (fresh / "metrics.jsonl").write_text("")  # started, no evaluation yet: its row says so, no crash
    assert "| softmax | 1 | - | - |" in build_report([*done, fresh], tmp_path / "fresh")


def test_report_lists_every_evaluation_of_every_run(tmp_path: Path) -> None:
    runs = [fake_run(tmp_path, "h", s, ood) for s, ood in ((0, 0.6), (1, 0.8))]
    build_report(runs, tmp_path / "out")
    text = (tmp_path / "out" / "report.md").read_text()
    assert "| run | split | 10 | 20 |" in text
    assert "| h_s0 | ood | 30.0 | 60.0 |" in text and "| h_s1 | ood | 40.0 | 80.0 |" in text
    assert "| h_s1 | test | 80.0 | 80.0 |" in text


def test_sweep_plot_when_one_key_varies(tmp_path: Path, capsys) -> None:
    runs = [fake_run(tmp_path, f"h{d}", 0, 0.5 + d / 100, **{"model.num_layers": d}) for d in (4, 8, 16)]
    softmax = {"model.attention": "softmax"}
    runs += [fake_run(tmp_path, f"s{d}", 0, 0.5, **{"model.num_layers": d, **softmax}) for d in (4, 8)]
    assert main(["report", *map(str, runs), "--out", str(tmp_path / "sweep")]) == 0
    assert (tmp_path / "sweep" / "ood_vs_num_layers.png").is_file()
    assert "hyla (num_layers=8)" in capsys.readouterr().out


def test_one_factor_sweeps_from_a_mixed_collection(tmp_path: Path) -> None:
    """Base, deeper, wider and more-data runs together: one sweep per axis through the base point."""
    runs = [fake_run(tmp_path, "base", 0, 0.60), fake_run(tmp_path, "base", 1, 0.62)]
    runs += [fake_run(tmp_path, f"d{d}", 0, 0.7, **{"model.num_layers": d}) for d in (8, 16)]
    runs += [fake_run(tmp_path, "w2", 0, 0.8, **{"model.width_multiplier": 2})]
    runs += [fake_run(tmp_path, "s2", 0, 0.9, **{"train.steps": 312500})]
    groups = group_runs([read_run(r) for r in runs])
    assert len(groups) == 5
    build_report(runs, tmp_path / "out")
    names = {p.name for p in (tmp_path / "out").glob("ood_vs_*.png")}
    assert names == {"ood_vs_num_layers.png", "ood_vs_width_multiplier.png", "ood_vs_steps.png"}
    summary = [{"config": g[0].config, "ood": (100 * g[0].final("ood")["acc"], 0.0)} for g in groups.values()]
    varying = ["model.num_layers", "model.width_multiplier", "train.steps"]
    xs, means, _ = sweep_series(summary, "model.num_layers", varying)["hyla"]
    assert xs == [4, 8, 16] and means[0] == 60.0  # the base point, not the wider or longer run
    xs, _, _ = sweep_series(summary, "train.steps", varying)["hyla"]
    assert xs == [156250 * 128, 312500 * 128]  # problems seen


def test_report_rejects_mixed_tasks(tmp_path: Path, capsys) -> None:
    s = fake_run(tmp_path, "s", 0, 0.5)
    f = tmp_path / "f"
    f.mkdir()
    (f / "config.yaml").write_text(yaml.safe_dump(load_config("fuzzy_logic").to_dict()))
    (f / "metrics.jsonl").write_text(json.dumps({"step": 1, "split": "ood", "r2": 0.5}) + "\n")
    assert main(["report", str(s), str(f), "--out", str(tmp_path / "o")]) == 2
    assert "mix tasks" in capsys.readouterr().err


TINY = tiny_overrides(layers=1, steps=6, every=3)


@pytest.fixture(scope="module")
def trained_runs(tmp_path_factory) -> list[Path]:
    """Three tiny SRAVEN runs: HYLA seeds 0 and 1, softmax seed 0."""
    root = tmp_path_factory.mktemp("trained")
    runs = []
    for attention, seed in (("hyla", 0), ("hyla", 1), ("softmax", 0)):
        out = root / f"{attention}_{seed}"
        overrides = [*TINY, f"model.attention={attention}", f"seed={seed}"]
        args = ["train", "sraven", *overrides, "--out", str(out), "--quiet"]
        assert main(args) == 0
        runs.append(out)
    return runs


@pytest.mark.slow
def test_report_on_trained_runs_with_latent_section(trained_runs: list[Path], tmp_path: Path, quick_tsne: None) -> None:
    out = tmp_path / "report"
    args = ["report", *map(str, trained_runs), "--out", str(out), "--latents", "32", "--permutations", "10"]
    assert main(args) == 0
    text = (out / "report.md").read_text()
    assert "| hyla | 2 |" in text and "| softmax | 1 |" in text  # seeds pooled, paper column empty ("-")
    assert "## Latent code" in text and text.count("| hyla | hyla_") == 4  # probe table, per-layer table
    assert "| configuration | run | layer 0 | all | chance |" in text  # Fig. 5F: one row per run
    assert text.count("| final |") == 3  # finished runs: their final weights, and the table says so
    assert "| softmax | softmax_0 |" in text
    assert "- slots:" in text and "over 3 runs" in text  # topographic similarity against OOD acc, 3 runs
    pngs = {p.name for p in out.glob("*.png")}
    # figures for the first run of each configuration only, plus learning curves and the scatter plot
    assert pngs == {
        "learning_curves.png",
        "topsim_vs_ood.png",
        "probe_by_layer.png",
        *(
            f"{v}_{v}_0_{split}_{f}"
            for v in ("hyla", "softmax")
            for split in ("test", "ood")
            for f in ("latents_pca.png", "latents_tsne.png", "mean_code_per_rule.png")
        ),
    }
    assert all(f"![{name}]({name})" in text for name in pngs)
    # the code figures side by side: one column per configuration's first run, one row per split and picture
    assert "| | hyla (hyla_0) | softmax (softmax_0) |" in text
    assert "| held-out tasks (OOD): latents tsne | ![hyla_hyla_0_ood_latents_tsne.png]" in text
    results = json.loads((out / "latents.json").read_text())
    assert len(results) == 3 and all(0 <= r["probe"]["layers"]["all"]["ood_acc"] <= 1 for r in results)


def test_paper_reference_only_for_table_a1_settings() -> None:
    assert paper_reference(load_config("sraven").to_dict()) == (69.13, 1.90)
    assert paper_reference(load_config("sraven", ["model.attention=hyla_silu"]).to_dict()) == (71.04, 1.05)
    assert paper_reference(load_config("sraven_moe", ["model.attention=linear"]).to_dict()) == (64.34, 4.30)
    assert paper_reference(load_config("fuzzy_logic", ["model.attention=softmax"]).to_dict()) == (63.28, 2.31)
    assert paper_reference(load_config("sraven_depth8").to_dict()) is None
    assert paper_reference(load_config("fuzzy_logic", ["data.holdout=0.5"]).to_dict()) is None
    assert paper_reference(load_config("sraven_single_head").to_dict()) is None
    assert paper_reference(load_config("fuzzy_logic", ["model.init=torch"]).to_dict()) is None


def fake_lm_run(root: Path, attention: str, seed: int, val_ppl: list[float]) -> Path:
    """A language-model run directory (config.yaml + metrics.jsonl) with the given validation curve."""
    cfg = load_config("lm_tiny", [f"seed={seed}", f"model.attention={attention}", "train.steps=30"])
    path = root / attention / f"seed{seed}"
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict()))
    rows = [
        {"step": 10 * (i + 1), "split": split, "loss": math.log(p * (1 if split == "val" else 0.5)), "ppl": -1.0}
        for i, p in enumerate(val_ppl)
        for split in ("train", "val")
    ]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_language_model_runs_get_a_perplexity_table(tmp_path: Path) -> None:
    runs = [fake_lm_run(tmp_path, "hyla", s, [50.0, 30.0 + s, 40.0]) for s in (0, 1)]
    runs.append(fake_lm_run(tmp_path, "softmax", 0, [40.0, 20.0, 18.0]))
    table = build_report(runs, tmp_path / "out", latents=512)  # no latent section for text: no error
    tokens = f"{30 * 16 * 128 / 1e6:.2f}M"  # 30 steps x batch 16 x 128 tokens
    assert f"| hyla | 2 | {tokens} | 40.00 +- 0.00 | 30.50 +- 0.50 | 20.00 +- 0.00 |" in table
    assert f"| softmax | 1 | {tokens} | 18.00 | 18.00 | 9.00 |" in table  # one seed: no s.e.
    assert (tmp_path / "out" / "learning_curves.png").is_file()
    assert "exp(mean loss per token)" in (tmp_path / "out" / "report.md").read_text()
