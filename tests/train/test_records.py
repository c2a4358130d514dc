"""Run records (``metrics.jsonl``, ``made_by.jsonl``) after a write was cut off: a torn last line is dropped
with a warning naming the file; any other malformed line is an error naming file and line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from hyla.analysis.paper_report import paper_report
from hyla.cli import main
from hyla.textio import FileFormatError, TornLineWarning, append_jsonl, read_jsonl
from hyla.train.config import dump_config, load_config
from hyla.train.run.folder import finish_piece_record
from hyla.train.sweeps import load_sweep

ROWS = [{"step": s, "split": sp, "r2": 0.5, "loss": 1.0} for s in (10, 20) for sp in ("train", "test", "ood")]
TORN = '{"step": 30, "split": "tr'  # what kill -9 leaves mid-write: no closing brace, no newline


def jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def warned_about(path: Path) -> pytest.WarningsChecker:
    return pytest.warns(TornLineWarning, match=re.escape(f"{path}: dropped its torn last line"))


def test_a_torn_last_line_is_dropped_with_a_warning_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(jsonl(ROWS) + TORN)
    with warned_about(path):
        assert read_jsonl(path) == ROWS


def test_a_complete_last_line_without_its_newline_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(jsonl(ROWS).rstrip("\n"))
    assert read_jsonl(path) == ROWS


@pytest.mark.parametrize(
    ("text", "line"),
    [
        (jsonl(ROWS[:2]) + TORN + "\n" + jsonl(ROWS[2:]), 3),  # torn in the middle: later lines were appended
        (jsonl(ROWS) + "not json\n", 7),  # a last line that is complete (newline-terminated) is no torn write
        (jsonl(ROWS) + "[1, 2]\n", 7),  # JSON, but not a record
    ],
)
def test_any_other_malformed_line_fails_naming_file_and_line(tmp_path: Path, text: str, line: int) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(text)
    with pytest.raises(FileFormatError, match=re.escape(f"{path}:{line}: malformed line")):
        read_jsonl(path)


def test_appending_after_a_torn_line_cuts_it_off_first(tmp_path: Path) -> None:
    path = tmp_path / "made_by.jsonl"
    path.write_text(jsonl(ROWS[:1]) + TORN)
    with warned_about(path):
        append_jsonl(path, ROWS[1])
    assert path.read_text() == jsonl(ROWS[:2])


def fake_run(root: Path, metrics: str) -> Path:
    """A run directory as `hyla train` writes it (config.yaml, metrics.jsonl), without training."""
    run = root / "run"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(dump_config(load_config("fuzzy_logic", ["train.steps=20"])))
    (run / "metrics.jsonl").write_text(metrics)
    return run


def test_report_reads_a_run_whose_metrics_end_in_a_torn_line(tmp_path: Path, capsys) -> None:
    run = fake_run(tmp_path, jsonl(ROWS) + TORN)
    with warned_about(run / "metrics.jsonl"):
        assert main(["report", str(run), "--out", str(tmp_path / "out"), "--latents", "0"]) == 0
    assert "| run | ood | 50.0 | 50.0 |" in (tmp_path / "out" / "report.md").read_text()
    assert "Traceback" not in capsys.readouterr().err


def test_report_names_file_and_line_of_a_malformed_middle_line(tmp_path: Path, capsys) -> None:
    run = fake_run(tmp_path, jsonl(ROWS[:1]) + "{oops\n" + jsonl(ROWS[1:]))
    assert main(["report", str(run), "--out", str(tmp_path / "out"), "--latents", "0"]) == 2
    err = capsys.readouterr().err
    assert f"hyla report: error: {run / 'metrics.jsonl'}:2: malformed line" in err and "Traceback" not in err


def sweep_with_one_record(tmp_path: Path, made_by: str) -> tuple[Path, Path]:
    """A one-run Table A1 sweep file and its records root, the run finished, ``made_by.jsonl`` as given."""
    sweep_file = tmp_path / "table_a1_tiny.yaml"
    spec = {"name": "table_a1_tiny", "config": "fuzzy_logic", "rows": {"hyla": {"model.attention": "hyla"}}}
    sweep_file.write_text(yaml.safe_dump({**spec, "overrides": {"train.steps": 20}}))
    run_spec = load_sweep(str(sweep_file)).runs()[0]
    run = tmp_path / "sweeps" / "table_a1_tiny" / run_spec.name
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(dump_config(load_config(run_spec.config, list(run_spec.overrides))))
    (run / "metrics.jsonl").write_text(jsonl(ROWS))
    (run / "made_by.jsonl").write_text(made_by)
    return sweep_file, run


PIECE = {"commit": "abc1234", "machine": "m", "device": "cpu", "date": "d", "ended": "e", "from_step": 0}
DONE = {**PIECE, "to_step": 10, "wall_s": 3600.0, "stacked_with": 1}
KILLED = {**PIECE, "from_step": 10, "ended": None, "to_step": None, "wall_s": None, "stacked_with": 1}


def test_paper_report_drops_a_torn_made_by_line_with_a_warning(tmp_path: Path) -> None:
    sweep_file, run = sweep_with_one_record(tmp_path, jsonl([DONE]) + '{"commit": "de')
    with warned_about(run / "made_by.jsonl"):
        text = paper_report(tmp_path / "out", tmp_path / "sweeps", [str(sweep_file)])
    assert "Commits: abc1234." in text and "Training wall time so far: 1.00 h." in text


def test_paper_report_counts_a_piece_that_never_recorded_its_end(tmp_path: Path) -> None:
    sweep_file, _ = sweep_with_one_record(tmp_path, jsonl([DONE, {**KILLED, "commit": "def5678"}]))
    text = paper_report(tmp_path / "out", tmp_path / "sweeps", [str(sweep_file)])
    assert "Commits: abc1234, def5678." in text
    assert "Training wall time so far: 1.00 h (not counting 1 pieces still training or killed" in text


def test_a_piece_completes_its_own_start_line_after_a_killed_one(tmp_path: Path) -> None:
    path = tmp_path / "made_by.jsonl"
    path.write_text(jsonl([DONE, KILLED]))
    started = {**KILLED, "from_step": 12}
    append_jsonl(path, started)
    finish_piece_record(tmp_path, started, {**started, "ended": "f", "to_step": 20, "wall_s": 5.0})
    assert read_jsonl(path) == [DONE, KILLED, {**started, "ended": "f", "to_step": 20, "wall_s": 5.0}]


def test_training_without_tensorboard_writes_the_same_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TensorBoard is an extra: without it a run writes no ``tb/`` and the same ``metrics.jsonl``, bit for bit."""
    import importlib.util

    from hyla.train.loop import Trainer
    from tiny import tiny_overrides

    cfg = load_config("fuzzy_logic", tiny_overrides(steps=4, every=2))
    Trainer(cfg, tmp_path / "with", quiet=True, progress=False).run()
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real_find_spec(name, *a)
    )
    Trainer(cfg, tmp_path / "without", quiet=True, progress=False).run()
    assert (tmp_path / "with" / "tb").is_dir() and not (tmp_path / "without" / "tb").exists()
    assert (tmp_path / "with" / "metrics.jsonl").read_bytes() == (tmp_path / "without" / "metrics.jsonl").read_bytes()
