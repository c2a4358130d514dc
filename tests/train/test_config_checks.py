"""Config and sweep files that cannot mean two things: a YAML key given twice, a section replaced by a value,
a value out of its range, a sweep name that would put records outside ``--root``. Each is an error naming
the file, the key and what is allowed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from hyla.cli import main
from hyla.textio import FileFormatError, read_yaml
from hyla.train.config import load_config, parse_override_value
from hyla.train.sweeps import load_sweep
from tiny import write_sweep


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


# ------------------------------------------------------------------------------ keys given twice
def test_a_sweep_row_given_twice_is_an_error_naming_file_line_and_key(tmp_path: Path, capsys) -> None:
    path = write_sweep(tmp_path, rows={"a": {}}, grid={}, seeds=[0])
    text = path.read_text().replace("rows:\n  a: {}\n", "rows:\n  a: {}\n  a:\n    model.attention: softmax\n")
    path.write_text(text)
    line = text.splitlines().index("  a:") + 1
    with pytest.raises(FileFormatError, match=re.escape(f"{path}:{line}:3: duplicate key 'a' (first at line")):
        load_sweep(str(path))
    assert main(["sweep", str(path), "--dry-run"]) == 2
    assert f"{path}:{line}:3: duplicate key 'a'" in one_error_line(capsys)


def test_a_config_key_given_twice_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("base: sraven\ntrain: {lr: 0.001, steps: 10}\nmodel: {num_layers: 2, num_layers: 3}\n")
    with pytest.raises(FileFormatError, match=re.escape(f"{path}:3:24: duplicate key 'num_layers' (first at line 3)")):
        load_config(str(path))


def test_keys_a_merge_brings_in_may_be_given_again(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("base: &b {lr: 0.1, steps: 3}\nrun: {<<: *b, lr: 0.2}\n")
    assert read_yaml(path)["run"] == {"lr": 0.2, "steps": 3}


def test_an_override_value_with_a_key_twice_is_an_error() -> None:
    with pytest.raises(ValueError, match="duplicate key 'a'"):
        parse_override_value("x={a: 1, a: 2}", "{a: 1, a: 2}")


# ------------------------------------------------------------------------------ sections
@pytest.mark.parametrize("text", ["base: sraven\ntrain: 5\n", "train: 5\n", "base: sraven\ntrain:\n"])
@pytest.mark.parametrize("overrides", [[], ["train.steps=8"]])
def test_a_section_given_as_a_value_is_an_error_naming_the_key(tmp_path: Path, text: str, overrides: list) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(FileFormatError, match=re.escape(f"{path}: train is a section, got the value")):
        load_config(str(path), overrides)


def test_a_base_section_replaced_by_a_value_deeper_down_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text(yaml.safe_dump({"data": {"task": "sraven"}, "seed": 1}))
    path = tmp_path / "c.yaml"
    path.write_text("base: base.yaml\nseed: {value: 2}\n")
    with pytest.raises(FileFormatError, match=re.escape(f"{path}: seed is a value (1), not a section")):
        load_config(str(path))


# ------------------------------------------------------------------------------ ranges
@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.weight_decay=-0.1", "train.weight_decay must be >= 0, got -0.1"),
        ("train.weight_decay=.nan", "train.weight_decay must be >= 0, got nan"),
        ("train.moe_aux_weight=-1", "train.moe_aux_weight must be >= 0, got -1.0"),
        ("train.lr=0", "train.lr must be > 0, got 0.0"),
        ("train.steps=0", "train.steps must be >= 1, got 0"),
        ("train.batch_size=0", "train.batch_size must be >= 1, got 0"),
        ("train.eval_batch_size=-4", "train.eval_batch_size must be >= 1, got -4"),
        ("model.num_layers=0", "model.num_layers must be >= 1, got 0"),
        ("model.emb_dim=0", "model.emb_dim must be >= 1, got 0"),
        ("model.num_heads=0", "model.num_heads must be >= 1, got 0"),
        ("model.attention_dropout=1", "model.attention_dropout must be in [0, 1), got 1.0"),
        ("model.attention_dropout=-0.1", "model.attention_dropout must be in [0, 1), got -0.1"),
    ],
)
def test_a_value_out_of_its_range_is_one_line_naming_key_and_range(override: str, message: str, capsys) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        load_config("sraven", [override])
    assert main(["train", "sraven", override, "--out", "unused", "--quiet"]) == 2
    assert one_error_line(capsys) == f"hyla train: error: {message}"


def test_values_at_the_ends_of_their_ranges_are_accepted() -> None:
    cfg = load_config("sraven", ["train.weight_decay=0", "model.num_layers=1", "model.attention_dropout=0"])
    assert (cfg.train.weight_decay, cfg.model.num_layers) == (0.0, 1)


# ------------------------------------------------------------------------------ sweep names
@pytest.mark.parametrize("name", ["../escape", "a/b", "..", ".", ""])
def test_a_sweep_name_must_be_one_folder_name(tmp_path: Path, name: str, capsys) -> None:
    path = write_sweep(tmp_path, rows={"a": {}}, grid={}, seeds=[0], extra={})
    spec = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**spec, "name": name}, sort_keys=False))
    with pytest.raises(ValueError, match=re.escape(f"{path}: name {name!r} must be one folder name")):
        load_sweep(str(path))
    assert main(["sweep", str(path), "--root", str(tmp_path / "root"), "--dry-run"]) == 2
    assert "must be one folder name" in one_error_line(capsys)
    assert not (tmp_path / "escape").exists()


def test_a_row_whose_runs_would_nest_is_an_error(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, rows={"x/y": {}}, grid={}, seeds=[0])
    with pytest.raises(ValueError, match=re.escape("run 'x/y-seed0' is not one folder name")):
        load_sweep(str(path))
