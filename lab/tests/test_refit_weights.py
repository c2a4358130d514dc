"""lab/authors/refit_weights.py keeps a record's weights only when its retrain retraces the record."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from hyla.ops.clib import MARCH_ENV
from hyla.train.config import load_config
from hyla.train.loop import Trainer
from hyla.train.run.checkpoint import load_weights
from hyla.train.run.folder import FINAL_WEIGHTS, load_trained
from tiny import tiny_overrides, torch_threads

SCRIPT = Path(__file__).resolve().parents[2] / "lab" / "authors" / "refit_weights.py"
sys.path.insert(0, str(SCRIPT.parent))
import refit_weights as refit  # noqa: E402


@pytest.fixture(autouse=True)
def _restore_threads() -> Iterator[None]:
    """The records and the script train on one thread, as the paper runs did; later tests in this worker
    compare against runs in subprocesses with the default count, so the count goes back."""
    with torch_threads():
        yield


def _record(tmp_path: Path, backend_until: tuple[int, str] | None, commit_at: int | None = None) -> Path:
    """A finished tiny HYLA run with attention dropout whose weights are then dropped, as the finished
    fuzzy-logic records kept none; ``backend_until`` trains its first steps on another backend;
    ``commit_at`` stops the run there once and commits it to a new git repository at ``tmp_path``, as
    the paper records trained in pieces committed with their newest checkpoint."""
    overrides = [*tiny_overrides(steps=12, every=4), "model.attention=hyla", "model.attention_dropout=0.1"]
    record = tmp_path / "record"
    torch.set_num_threads(1)
    pieces = [backend_until, (None, None)] if backend_until else [(None, None)]
    if commit_at is not None:
        pieces.insert(0, (commit_at, None))
    for stop_at, backend in pieces:
        extra = [f"model.attention_backend={backend}"] if backend else []
        cfg = load_config("fuzzy_logic", overrides + extra)
        trainer = Trainer(cfg, record, resume=(record / "checkpoints").exists(), quiet=True)
        trainer.stop_at_step = stop_at
        try:
            trainer.run()
        finally:
            trainer.close()
        if stop_at == commit_at:
            git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
            subprocess.run([*git, "init", "-q"], check=True)
            subprocess.run([*git, "add", "record"], check=True)
            subprocess.run([*git, "commit", "-qm", "a piece"], check=True)
    (record / FINAL_WEIGHTS).rename(tmp_path / "original.safetensors")
    return record


def test_a_retrain_that_retraces_the_record_keeps_its_weights(tmp_path: Path) -> None:
    record = _record(tmp_path, backend_until=(8, "direct"))
    # without the phase its first steps round as today's kernel does, and the check notices
    # --max-minutes: a budget no machine comes near (a stop before the differing step would hide the difference)
    assert refit.main([str(record), "--work", str(tmp_path / "today"), "--max-minutes", "600"]) == 1
    assert not (record / FINAL_WEIGHTS).exists()
    assert refit.main([str(record), "--work", str(tmp_path / "work"), "--phase", "8=direct"]) == 0
    kept = load_weights(record / FINAL_WEIGHTS)
    original = load_weights(tmp_path / "original.safetensors")
    assert kept.keys() == original.keys()
    assert all(torch.equal(kept[k], original[k]) for k in kept)
    note = json.loads((record / refit.REFIT_NOTE).read_text())
    assert note["phases"] == ["8=direct"] and note["equal"] == note["compared"] > 0
    assert load_trained(record).weights == "final"


def test_a_retrain_from_a_committed_checkpoint_checks_only_the_steps_it_retrained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = _record(tmp_path, backend_until=None, commit_at=6)
    # a row before the start: the retrain does not redo it, so it is not checked (it would fail)
    lines = [json.loads(line) for line in (record / "metrics.jsonl").read_text().splitlines()]
    lines[1] = {**lines[1], "loss": lines[1]["loss"] * 1.01}
    assert 0 < lines[1]["step"] < 6
    (record / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    monkeypatch.delenv(MARCH_ENV, raising=False)  # the script sets it for the kernel it would build
    work = tmp_path / "work"
    assert refit.main([str(record), "--work", str(work), "--from-commit", "HEAD", "--cpu-march", "native"]) == 0
    kept, original = load_weights(record / FINAL_WEIGHTS), load_weights(tmp_path / "original.safetensors")
    assert kept.keys() == original.keys() and all(torch.equal(kept[k], original[k]) for k in original)
    note = json.loads((record / refit.REFIT_NOTE).read_text())
    assert note["started_from"] == {"commit": "HEAD", "step": 6} and note["kernel_march"] == "native"
    assert note["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert note["equal"] == note["compared"] > 0


def test_from_commit_names_what_is_missing(tmp_path: Path) -> None:
    record = _record(tmp_path, backend_until=None, commit_at=6)
    with pytest.raises(SystemExit, match="--from-commit nosuchcommit"):
        refit.main([str(record), "--work", str(tmp_path / "w1"), "--from-commit", "nosuchcommit"])
    (tmp_path / "w2").mkdir()
    with pytest.raises(SystemExit, match="already holds a retrain from step 0"):
        refit.main([str(record), "--work", str(tmp_path / "w2"), "--from-commit", "HEAD"])


def test_a_retrain_that_drifts_from_the_record_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    record = _record(tmp_path, backend_until=None)
    lines = [json.loads(line) for line in (record / "metrics.jsonl").read_text().splitlines()]
    lines[-1] = {**lines[-1], "loss": lines[-1]["loss"] * (1 + 1e-6)}  # one value off by float32 noise
    (record / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    assert refit.main([str(record), "--work", str(tmp_path / "work")]) == 1
    assert not (record / FINAL_WEIGHTS).exists() and not (record / refit.REFIT_NOTE).exists()
    assert "differs: step 12" in capsys.readouterr().out
    # the same retrain passes once the tolerance admits the change, and then keeps the weights
    assert refit.main([str(record), "--work", str(tmp_path / "work"), "--rtol", "1e-5"]) == 0
    assert (record / FINAL_WEIGHTS).is_file()


@pytest.mark.parametrize(
    ("phases", "message"),
    [(["8direct"], "STEP=BACKEND"), (["12=direct"], "1..11"), (["4=direct", "4=auto"], "each STEP once")],
)
def test_bad_phases_are_named(phases: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        refit.parse_phases(phases, 12)
