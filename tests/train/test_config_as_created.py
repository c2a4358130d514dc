"""A run's ``config.yaml`` stays its config as created: a resume with other (resumable) settings records them in
``config_changes.jsonl`` (and a sweep's piece), and every reader sees the config as it stands."""

from __future__ import annotations

import json
from pathlib import Path

from hyla.cli import main
from hyla.train.run.folder import (
    CONFIG_CHANGES,
    load_trained,
    read_run,
    run_config_values,
    run_state,
)
from tiny import tiny_overrides


def _train(out: Path, *extra: str) -> None:
    args = ["fuzzy_logic", *tiny_overrides(steps=4, every=2), "model.attention=hyla", *extra]
    assert main(["train", *args, "--out", str(out), "--quiet"]) == 0


def test_a_resume_with_other_settings_keeps_config_yaml_and_records_the_change(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _train(run, "--stop-at-step", "2")
    created = (run / "config.yaml").read_bytes()
    assert run_state(run) == "stopped" and not (run / CONFIG_CHANGES).exists()
    _train(run, "train.steps=6", "train.eval_every=3", "--resume", "--stop-at-step", "4")
    assert (run / "config.yaml").read_bytes() == created
    lines = [json.loads(line) for line in (run / CONFIG_CHANGES).read_text().splitlines()]
    assert lines == [{"step": 2, "changes": {"train.steps": 6, "train.eval_every": 3}}]
    # the same settings again: nothing new to record
    _train(run, "train.steps=6", "train.eval_every=3", "--resume")
    assert len((run / CONFIG_CHANGES).read_text().splitlines()) == 1
    assert (run / "config.yaml").read_bytes() == created
    # every reader sees the config as it stands: 6 steps, done at 6
    assert run_config_values(run)["train"]["steps"] == 6
    assert read_run(run).config["train"]["eval_every"] == 3
    assert run_state(run) == "done"
    trained = load_trained(run)
    assert trained.config.train.steps == 6 and trained.step == 6


def test_a_record_without_changes_reads_as_its_config_yaml(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _train(run)
    assert not (run / CONFIG_CHANGES).exists()
    assert read_run(run).config["train"]["steps"] == 4 and run_state(run) == "done"
