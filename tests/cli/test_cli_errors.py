"""Bad input to any ``hyla`` command: exit code 2 and one line on stderr naming the file, key or value and
the fix, never a traceback."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from hyla.cli import main
from hyla.train.config import dump_config, load_config
from tiny import HANG_GUARD_S

SRC = Path(__file__).resolve().parents[2] / "src"


def bad_yaml(tmp_path: Path) -> Path:
    """A sweep file (or config) whose flow mapping is never closed: PyYAML notices at line 3, column 1."""
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nrows: {hyla: {model.attention: hyla}\n")
    return path


def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "a_file"
    path.write_text("not a directory\n")
    return path


def written(path: Path, spec: dict) -> Path:
    path.write_text(yaml.safe_dump(spec))
    return path


def run_with_malformed_config(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("seed: 0\ntrain: {steps: [1, 2}\n")
    (run / "metrics.jsonl").write_text('{"step": 1, "split": "test", "r2": 0.5}\n')
    return run


def sweep_record_with_a_malformed_middle_line(tmp_path: Path) -> Path:
    """A one-run sweep file whose record (under ``tmp_path/r``) has a metrics line broken in the middle."""
    sweep_file = tmp_path / "one.yaml"
    sweep_file.write_text(yaml.safe_dump({"name": "one", "config": "fuzzy_logic", "rows": {"hyla": {}}}))
    run = tmp_path / "r" / "one" / "hyla-seed0"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(dump_config(load_config("fuzzy_logic", ["seed=0", "name=hyla-seed0"])))
    (run / "metrics.jsonl").write_text('{"step": 1, "split": "train_batch"}\n{"step": 2, "spl\n{"step": 3}\n')
    return sweep_file


CASES: dict[str, tuple[Callable[[Path], list[str]], list[str]]] = {
    "sweep file with a YAML syntax error": (
        lambda t: ["sweep", str(bad_yaml(t)), "--dry-run"],
        ["hyla sweep: error: ", "bad.yaml:3:1: YAML syntax error: expected ',' or '}'"],
    ),
    "sweep override of an unknown key": (
        lambda t: ["sweep", "table_a1_fuzzy", "--override", "train.stepz=3", "--dry-run"],
        [
            "hyla sweep: error: --override train.stepz=3: run softmax-",
            "unknown config key train.stepz (did you mean train.steps?); valid keys at train: steps, batch_size",
        ],
    ),
    "sweep override whose value is not YAML": (
        lambda t: ["sweep", "table_a1_fuzzy", "--override", "train.lr=[1,", "--emit-commands"],
        ["override 'train.lr=[1,': its value is not valid YAML, column 4: ", "quote it to pass a string"],
    ),
    "sweep whose records hold a malformed metrics line": (
        lambda t: ["sweep", str(sweep_record_with_a_malformed_middle_line(t)), "--root", str(t / "r"), "--dry-run"],
        ["hyla sweep: error: ", "hyla-seed0/metrics.jsonl:2: malformed line", "fix or delete line 2"],
    ),
    "sweep file without its base config": (
        lambda t: ["sweep", str(written(t / "no_config.yaml", {"name": "x", "rows": {"hyla": {}}})), "--dry-run"],
        ["hyla sweep: error: ", "no_config.yaml: config (the base config of the runs", "add e.g. 'config: sraven'"],
    ),
    "sweep records under a file": (
        lambda t: ["sweep", str(sweep_record_with_a_malformed_middle_line(t)), "--root", str(a_file(t))],
        ["hyla sweep: error: --root ", "a_file: cannot make ", "(Not a directory)"],
    ),
    "train config with a YAML syntax error": (
        lambda t: ["train", str(bad_yaml(t)), "--out", str(t / "out")],
        ["hyla train: error: ", "bad.yaml:3:1: YAML syntax error"],
    ),
    "train override with an empty key": (
        lambda t: ["train", "fuzzy_logic", "=3", "--out", str(t / "out")],
        ["hyla train: error: override '=3' has an empty key name; write key.sub=value"],
    ),
    "train --sweep file with a YAML syntax error": (
        lambda t: ["train", "fuzzy_logic", "--sweep", str(bad_yaml(t)), "--out", str(t / "out")],
        ["hyla train: error: --sweep ", "bad.yaml:3:1: YAML syntax error"],
    ),
    "train --out a file": (
        lambda t: ["train", "fuzzy_logic", "--out", str(a_file(t))],
        ["hyla train: error: cannot make the run directory ", "a_file (File exists)"],
    ),
    "train --stop-at-step 0": (
        lambda t: ["train", "fuzzy_logic", "--stop-at-step", "0", "--out", str(t / "out")],
        ["hyla train: error: --stop-at-step must be >= 1, got 0"],
    ),
    "report on a run whose config.yaml is malformed": (
        lambda t: ["report", str(run_with_malformed_config(t)), "--out", str(t / "out"), "--latents", "0"],
        ["hyla report: error: ", "run/config.yaml:2:21: YAML syntax error"],
    ),
    "data --out under a file": (
        lambda t: ["data", "sraven", "--split", "train", "--num", "2", "--out", str(a_file(t) / "x.npz")],
        ["hyla data: error: --out ", "a_file/x.npz: cannot write it"],
    ),
    "demo with an unknown variant": (
        lambda t: ["demo", "--variants", "softmax,nope", "--out", str(t / "demo")],
        ["hyla demo: error: --variants: 'nope' is not a row of table_a1_fuzzy; rows: softmax, linear, hyla, "],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_naming_it(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv, expected = CASES[case]
    assert main(argv(tmp_path)) == 2
    err = capsys.readouterr().err
    assert all(text in err for text in expected), err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "demo").exists()  # the demo checks every variant before it trains one


@pytest.mark.skipif(importlib.util.find_spec("submitit") is None, reason="needs submitit (pip install 'hyla[sweep]')")
@pytest.mark.skipif(shutil.which("srun") is not None, reason="this machine has SLURM: the sweep would be submitted")
def test_slurm_launcher_without_slurm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep_file = sweep_record_with_a_malformed_middle_line(tmp_path)
    assert main(["sweep", str(sweep_file), "--root", str(tmp_path / "fresh"), "--launcher", "slurm"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hyla sweep: error: --launcher slurm: ") and "use --launcher local here" in err, err


def test_the_command_prints_one_line_and_no_traceback(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    cmd = [sys.executable, "-m", "hyla", "sweep", str(bad_yaml(tmp_path)), "--dry-run"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
    problem = "expected ',' or '}', but got '<stream end>' (while parsing a flow mapping)"
    assert done.returncode == 2
    assert (
        done.stderr
        == f"hyla sweep: error: {tmp_path / 'bad.yaml'}:3:1: YAML syntax error: {problem}; fix the file there\n"
    )
