"""lab/gpu/travel.py: the device call's tree holds what the stages read; going back loses nothing."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import travel
import yaml

RUNS = "lab/runs"


def git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout


def run_record(run: Path, steps: int, last_step: int, files: dict[str, bytes]) -> None:
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"train": {"steps": steps}}))
    (run / "metrics.jsonl").write_text(json.dumps({"step": last_step, "split": "test", "acc": 0.5}) + "\n")
    (run / "made_by.jsonl").write_text(json.dumps({"device": "cpu"}) + "\n")
    for name, data in files.items():
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_bytes(data)


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A checkout with a finished and a stopped SRAVEN run, a finished run of another sweep and the authors' logs."""
    monkeypatch.chdir(tmp_path)
    git("init", "-q", "-b", "main")
    git("config", "user.name", "t")
    git("config", "user.email", "t@localhost")
    Path("src").mkdir()
    Path("src/code.py").write_text("x = 1\n")
    Path(travel.AUTHORS_LOGS).mkdir(parents=True)
    Path(travel.AUTHORS_LOGS, "log.txt").write_text("their run\n")
    sraven = Path(RUNS, "table_a1_sraven")
    run_record(sraven / "done", 8, 8, {"model.safetensors": b"weights" * 100, "model.safetensors.sha256": b"abc"})
    checkpoint = {"checkpoints/latest": b"step-4", "checkpoints/step-4/model.safetensors": b"w"}
    run_record(sraven / "stopped", 8, 4, checkpoint)
    run_record(Path(RUNS, "fig2c_fuzzy", "other"), 8, 8, {"model.safetensors": b"other weights"})
    git("add", ".")
    git("commit", "-q", "-m", "records")
    return tmp_path


SRAVEN = "lab/runs/table_a1_sraven"
TRAVELS = {
    "src/code.py",
    f"{SRAVEN}/done/config.yaml",
    f"{SRAVEN}/done/metrics.jsonl",
    f"{SRAVEN}/done/made_by.jsonl",
    *(f"{SRAVEN}/stopped/{name}" for name in ("config.yaml", "metrics.jsonl", "made_by.jsonl")),
    f"{SRAVEN}/stopped/checkpoints/latest",
    f"{SRAVEN}/stopped/checkpoints/step-4/model.safetensors",
}


def test_slim_tracks_what_the_stages_read_and_back_restores_every_file(repo: Path) -> None:
    before = set(git("ls-files").split())
    contents = {p: Path(p).read_bytes() for p in before}
    assert travel.main(["slim", "--stages", "sraven-selected authors"]) == 0
    assert git("branch", "--show-current").strip() == travel.BRANCH
    assert set(git("ls-files").split()) == TRAVELS
    assert git("status", "--porcelain", "--untracked-files=all") == ""  # the rest ignored, still on disk
    assert {p: Path(p).read_bytes() for p in before} == contents
    assert travel.travel_bytes([]) == sum(Path(p).stat().st_size for p in TRAVELS)
    # the call trains the stopped run on and its archive lands over the tree
    with open(f"{SRAVEN}/stopped/metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 8, "split": "test", "acc": 0.6}) + "\n")
    Path(f"{SRAVEN}/stopped/model.safetensors").write_bytes(b"final")
    assert travel.main(["back"]) == 0
    assert git("branch", "--show-current").strip() == "main" and not git("branch", "--list", travel.BRANCH).strip()
    assert set(git("ls-files").split()) == before
    status = sorted(git("status", "--porcelain", "--untracked-files=all").splitlines())
    assert status == [f" M {SRAVEN}/stopped/metrics.jsonl", f"?? {SRAVEN}/stopped/model.safetensors"]
    assert travel.BEGIN not in Path(".git/info/exclude").read_text()
    assert {p: Path(p).read_bytes() for p in before if "stopped/metrics" not in p} == {
        p: c for p, c in contents.items() if "stopped/metrics" not in p
    }


def test_the_fuzzy_stage_takes_its_sweep_and_the_others_none(repo: Path) -> None:
    assert travel.sweeps_read_by(["smoke", "throughput", "authors"], "table_a1_fuzzy", "table_a1_sraven") == set()
    assert travel.sweeps_read_by(["fuzzy", "sraven-rest"], "table_a1_fuzzy", "table_a1_sraven") == {
        "table_a1_fuzzy",
        "table_a1_sraven",
    }
    behind = travel.stays_behind(git("ls-files").split(), RUNS, {"table_a1_fuzzy"})
    assert set(behind) == set(git("ls-files").split()) - {"src/code.py"}


def test_back_refuses_to_overwrite_a_file_left_behind_that_changed(repo: Path, capsys) -> None:
    assert travel.main(["slim", "--stages", "sraven-selected"]) == 0
    other = Path(RUNS, "fig2c_fuzzy", "other", "model.safetensors")
    other.write_bytes(b"a CPU run wrote here meanwhile")
    assert travel.main(["back"]) == 2
    assert "1 files left behind changed or went missing (e.g. lab/runs/fig2c_fuzzy/other/model.safetensors)" in (
        capsys.readouterr().err
    )
    assert git("branch", "--show-current").strip() == travel.BRANCH
    assert other.read_bytes() == b"a CPU run wrote here meanwhile"
    other.write_bytes(b"other weights")
    assert travel.main(["back"]) == 0
    assert git("status", "--porcelain", "--untracked-files=all") == ""


def test_slim_refuses_a_dirty_tree_and_an_oversized_one_goes_back(
    repo: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    Path("new.txt").write_text("not committed")
    assert travel.main(["slim"]) == 2
    assert "the tree has changes (1, e.g. '?? new.txt'): commit the records first" in capsys.readouterr().err
    Path("new.txt").unlink()
    assert travel.main(["slim", "--stages", "nope"]) == 2
    assert git("branch", "--show-current").strip() == "main"
    monkeypatch.setattr(travel, "LIMIT_BYTES", 100)
    before = git("ls-files")
    assert travel.main(["slim", "--stages", "sraven-selected", "--carry", "src"]) == 2
    assert "would travel, over" in capsys.readouterr().err
    assert git("branch", "--show-current").strip() == "main" and git("ls-files") == before
    assert git("status", "--porcelain", "--untracked-files=all") == ""
    assert travel.main(["back"]) == 2  # nothing to return from


def test_back_after_a_slim_stopped_before_its_commit_leaves_the_origin_as_it_was(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = git("ls-files")
    real_git = travel.git

    def killed_at_commit(*args: str, **kwargs) -> str:
        if args[0] == "commit":
            raise KeyboardInterrupt
        return real_git(*args, **kwargs)

    monkeypatch.setattr(travel, "git", killed_at_commit)
    with pytest.raises(KeyboardInterrupt):
        travel.main(["slim", "--stages", "sraven-selected"])
    monkeypatch.setattr(travel, "git", real_git)
    assert git("branch", "--show-current").strip() == travel.BRANCH
    assert git("diff", "--cached", "--name-only")  # the removals are staged, not committed
    assert travel.main(["back"]) == 0
    assert git("branch", "--show-current").strip() == "main" and git("ls-files") == before
    assert git("status", "--porcelain", "--untracked-files=all") == ""
