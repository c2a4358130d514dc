"""lab/stage_records.py: a finished run staged with its weights and no checkpoint, a stopped one with its newest
checkpoint only (the older leaves the index), a run in training left alone."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hyla.cli import main
from hyla.train.run.lock import FolderLock
from tiny import load_script, write_sweep

SCRIPT = Path(__file__).resolve().parents[1] / "stage_records.py"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def test_each_run_is_staged_as_its_state_asks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = tmp_path / "repo"
    runs = repo / "lab" / "runs"
    runs.mkdir(parents=True)
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "t@t")
    git(repo, "config", "user.name", "t")
    rows = {"softmax": {"model.attention": "softmax"}, "hyla": {"model.attention": "hyla"}}
    sweep = write_sweep(tmp_path, rows=rows, grid={}, seeds=[0])  # 8 steps, a checkpoint every 4
    assert main(["sweep", str(sweep), "--root", str(runs), "--only", "softmax"]) == 0
    assert main(["sweep", str(sweep), "--root", str(runs), "--only", "hyla", "--stop-at-step", "4"]) == 0
    finished, stopped = runs / "tiny" / "softmax-seed0", runs / "tiny" / "hyla-seed0"
    # an earlier session committed the stopped run's checkpoint at step 4; it has trained on to 6 since
    git(repo, "add", "-f", "lab/runs")
    git(repo, "commit", "-q", "-m", "records")
    assert main(["sweep", str(sweep), "--root", str(runs), "--only", "hyla", "--stop-at-step", "6"]) == 0
    capsys.readouterr()

    stage = load_script(SCRIPT)
    monkeypatch.setattr(stage, "REPO", repo)
    assert stage.main([str(runs / "tiny"), "--dry-run"]) == 0
    assert git(repo, "diff", "--cached", "--name-only") == ""  # a dry run stages nothing
    assert stage.main([str(runs / "tiny")]) == 0
    out = capsys.readouterr().out

    index = set(git(repo, "ls-files", "lab/runs").splitlines())

    def rel(path: Path) -> str:
        return str(path.relative_to(repo))

    assert {rel(finished / n) for n in ("model.safetensors", "model.safetensors.sha256", "metrics.jsonl")} <= index
    assert not any(f.startswith(rel(finished / "checkpoints")) for f in index)
    newest = stopped / "checkpoints" / (stopped / "checkpoints" / "latest").read_text().strip()
    assert newest.name == "step-000000006"
    in_checkpoints = {f for f in index if f.startswith(rel(stopped / "checkpoints"))}
    assert in_checkpoints == {rel(stopped / "checkpoints" / "latest")} | {rel(p) for p in newest.iterdir()}
    assert rel(stopped / "model.safetensors") not in index
    # the new bytes: the newest checkpoint's files and the records that grew, not the unchanged finished run
    new_bytes = sum(p.stat().st_size for p in newest.iterdir()) + sum(
        (stopped / n).stat().st_size for n in ("metrics.jsonl", "made_by.jsonl", "checkpoints/latest")
    )
    assert f"staged: {new_bytes / 2**20:.1f} MiB" in out

    # a run in training is left alone
    git(repo, "commit", "-q", "-m", "staged")
    (stopped / "metrics.jsonl").write_text((stopped / "metrics.jsonl").read_text() + "\n")
    with FolderLock(stopped, "test", "the run directory"):
        assert stage.main([str(stopped)]) == 0
    assert "in training" in capsys.readouterr().out
    assert git(repo, "diff", "--cached", "--name-only") == ""


def test_a_path_outside_the_repository_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert load_script(SCRIPT).main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a folder inside" in err[0]
