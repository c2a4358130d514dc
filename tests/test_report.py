"""`hyla report`: grouping by configuration, mean +- s.e., the paper's numbers, sweep plots."""

from __future__ import annotations

import json
import math
from pathlib import Path

import yaml

from hyla.analysis.paper import paper_reference
from hyla.analysis.report import build_report, group_runs, mean_se
from hyla.analysis.runs import load_run
from hyla.cli import main
from hyla.train.config import load_config


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
    assert mean_se([1.0]) == (1.0, 0.0)
    m, se = mean_se([1.0, 2.0, 3.0])
    assert m == 2.0 and math.isclose(se, 1.0 / math.sqrt(3))


def test_groups_pool_seeds_and_table_shows_paper_numbers(tmp_path: Path) -> None:
    runs = [fake_run(tmp_path, "h", s, ood) for s, ood in ((0, 0.6), (1, 0.7), (2, 0.8))]
    runs += [fake_run(tmp_path, "s", 0, 0.5, **{"model.attention": "softmax"})]
    assert sorted(len(g) for g in group_runs([load_run(r) for r in runs]).values()) == [1, 3]
    table = build_report(runs, tmp_path / "out")
    assert (
        f"| hyla | 3 | 90.00 +- 0.00 | 80.00 +- 0.00 | 70.00 +- {100 * 0.1 / math.sqrt(3):.2f} | 69.13 +- 1.90 |"
        in table
    )
    assert "| softmax | 1 |" in table and "56.56 +- 1.05" in table
    assert (tmp_path / "out" / "learning_curves.png").is_file() and (tmp_path / "out" / "report.md").is_file()


def test_sweep_plot_when_one_key_varies(tmp_path: Path, capsys) -> None:
    runs = [fake_run(tmp_path, f"h{d}", 0, 0.5 + d / 100, **{"model.num_layers": d}) for d in (4, 8, 16)]
    runs += [
        fake_run(tmp_path, f"s{d}", 0, 0.5, **{"model.num_layers": d, "model.attention": "softmax"}) for d in (4, 8)
    ]
    assert main(["report", *map(str, runs), "--out", str(tmp_path / "sweep")]) == 0
    assert (tmp_path / "sweep" / "ood_vs_num_layers.png").is_file()
    assert "hyla (num_layers=8)" in capsys.readouterr().out


def test_paper_reference_only_for_table_a1_settings() -> None:
    assert paper_reference(load_config("sraven").to_dict()) == (69.13, 1.90)
    assert paper_reference(load_config("sraven", ["model.attention=hyla_silu"]).to_dict()) == (71.04, 1.05)
    assert paper_reference(load_config("sraven_moe", ["model.attention=linear"]).to_dict()) == (64.34, 4.30)
    assert paper_reference(load_config("fuzzy_logic", ["model.attention=softmax"]).to_dict()) == (63.28, 2.31)
    assert paper_reference(load_config("sraven_depth8").to_dict()) is None
    assert paper_reference(load_config("fuzzy_logic", ["data.holdout=0.5"]).to_dict()) is None
    assert paper_reference(load_config("sraven_single_head").to_dict()) is None
