"""Stacked runs (several seeds / learning rates in one vmapped model) equal the same runs trained alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hyla.cli import main
from hyla.train.checkpoint import latest_checkpoint, load_checkpoint

TINY = [
    "model.num_layers=2",
    "model.emb_dim=16",
    "model.num_heads=2",
    "model.qk_dim=8",
    "model.v_dim=8",
    "model.mlp_dim=32",
    "train.steps=8",
    "train.eval_every=4",
    "train.eval_size=64",
    "train.eval_batch_size=32",
    "train.log_every=2",
    "train.checkpoint_every=4",
    "train.batch_size=16",
    "train.warmup_steps=2",
]


def metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def assert_same_metrics(a: list[dict], b: list[dict], rel: float = 1e-4) -> None:
    assert [(r["step"], r["split"]) for r in a] == [(r["step"], r["split"]) for r in b]
    for x, y in zip(a, b):
        for k in x:
            if k not in ("step", "split"):
                assert x[k] == pytest.approx(y[k], rel=rel, abs=1e-6), (x["step"], x["split"], k)


@pytest.mark.parametrize("task", ["sraven", "fuzzy_logic"])
def test_each_stacked_seed_matches_its_lone_run(tmp_path: Path, task: str) -> None:
    assert main(["train", task, *TINY, "--seeds", "0,3", "--out", str(tmp_path / "stack"), "--quiet"]) == 0
    for seed in (0, 3):
        lone = tmp_path / f"lone{seed}"
        assert (
            main(["train", task, *TINY, f"seed={seed}", f"name={task}_seed{seed}", "--out", str(lone), "--quiet"]) == 0
        )
        stacked = tmp_path / "stack" / f"seed{seed}"
        assert_same_metrics(metrics(stacked), metrics(lone))
        assert (stacked / "config.yaml").is_file() and list((stacked / "tb").iterdir())
    losses = [
        [r["loss"] for r in metrics(tmp_path / "stack" / f"seed{s}") if r["split"] == "train_batch"] for s in (0, 3)
    ]
    assert losses[0] != losses[1]  # different seeds really are different runs


def test_sweep_of_learning_rates_matches_lone_runs(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("runs:\n  - {train.lr: 0.003}\n  - {train.lr: 0.0003, train.weight_decay: 0.3}\n")
    assert main(["train", "fuzzy_logic", *TINY, "--sweep", str(sweep), "--out", str(tmp_path / "s"), "--quiet"]) == 0
    dirs = sorted(p.name for p in (tmp_path / "s").iterdir())
    assert dirs == ["lr0.0003_weight_decay0.3", "lr0.003"]
    lone = tmp_path / "lone"
    assert (
        main(
            [
                "train",
                "fuzzy_logic",
                *TINY,
                "train.lr=0.0003",
                "train.weight_decay=0.3",
                "name=fuzzy_logic_lr0.0003_weight_decay0.3",
                "--out",
                str(lone),
                "--quiet",
            ]
        )
        == 0
    )
    assert_same_metrics(metrics(tmp_path / "s" / "lr0.0003_weight_decay0.3"), metrics(lone))


def test_stacked_resume_and_lone_resume_of_a_stacked_run(tmp_path: Path) -> None:
    full = tmp_path / "full"
    assert main(["train", "sraven", *TINY, "--seeds", "0,1", "--out", str(full), "--quiet"]) == 0
    part = tmp_path / "part"
    assert main(["train", "sraven", *TINY, "--seeds", "0,1", "--out", str(part), "--quiet", "--stop-at-step", "5"]) == 0
    assert load_checkpoint(latest_checkpoint(part / "seed0")).step == 5
    assert main(["train", "sraven", *TINY, "--seeds", "0,1", "--out", str(part), "--quiet", "--resume"]) == 0
    for s in (0, 1):
        assert_same_metrics(metrics(part / f"seed{s}"), metrics(full / f"seed{s}"), rel=1e-5)
    # a stacked run directory is an ordinary one: the lone trainer continues it
    lone = tmp_path / "lone"
    assert main(["train", "sraven", *TINY, "--seeds", "1", "--out", str(lone), "--quiet", "--stop-at-step", "3"]) == 0
    assert (
        main(
            [
                "train",
                "sraven",
                *TINY,
                "seed=1",
                "name=sraven_seed1",
                "--out",
                str(lone / "seed1"),
                "--resume",
                "--quiet",
            ]
        )
        == 0
    )
    assert_same_metrics(metrics(lone / "seed1"), metrics(full / "seed1"))
    assert load_checkpoint(latest_checkpoint(lone / "seed1")).step == 8


def test_unstackable_runs_are_refused(tmp_path: Path, capsys) -> None:
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("runs:\n  - {model.num_layers: 1}\n  - {model.num_layers: 2}\n")
    assert main(["train", "sraven", *TINY, "--sweep", str(sweep), "--out", str(tmp_path / "x"), "--quiet"]) == 2
    assert "these differ too: model.num_layers" in capsys.readouterr().err
    assert main(["train", "sraven", *TINY, "--seeds", "0,a", "--out", str(tmp_path / "y"), "--quiet"]) == 2
    assert "--seeds must be comma-separated integers" in capsys.readouterr().err
