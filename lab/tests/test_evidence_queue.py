"""lab/evidence_queue.py: the queue's every item is a sweep command the CLI accepts or a ``next_seeds`` call it
makes; two threads train their lists side by side into the records, a ``next_seeds`` item the seeds the records
have earned by then; a budget too short for a sweep starts none; bad input is one line."""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hyla.cli import main as hyla_main
from tiny import load_script, write_sweep

LAB = Path(__file__).resolve().parents[1]
SCRIPT = LAB / "evidence_queue.py"
NEXT_SEEDS = LAB / "next_seeds.py"
SRC = LAB.parent / "src"


def test_every_queued_sweep_names_rows_and_values_its_sweep_has(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    threads = yaml.safe_load((LAB / "evidence_queue.yaml").read_text())["threads"]
    next_seeds = load_script(NEXT_SEEDS)

    def sweep_of(item: str | dict[str, str]) -> str:
        if isinstance(item, str):
            return shlex.split(item)[0]
        return next_seeds.parser().parse_args(shlex.split(item["next_seeds"])).sweep

    sweeps = [[sweep_of(item) for item in items] for items in threads]
    assert not set(sweeps[0]) & set(sweeps[1])  # a sweep folder takes one writer: never in both threads
    for items in threads:
        for item in items:  # an unknown row, key or value is an error (exit 2); each sweep item selects runs
            if isinstance(item, dict):
                assert next_seeds.main([*shlex.split(item["next_seeds"]), "--root", str(tmp_path)]) == 0, item
                continue
            assert hyla_main(["sweep", *shlex.split(item), "--emit-commands", "--root", str(tmp_path)]) == 0, item
            assert capsys.readouterr().out.count("hyla train") >= 1, item


def tiny_queue(tmp_path: Path) -> Path:
    folders = []
    for name in ("tiny_a", "tiny_b"):
        spec = yaml.safe_load(
            write_sweep(tmp_path, rows={"hyla": {"model.attention": "hyla"}}, grid={}, seeds=[0, 1]).read_text()
        )
        spec["name"] = name
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(spec))
        folders.append(path)
    queue = {"threads": [[f"{folders[0]} --where seed=0", f"{folders[0]} --where seed=1"], [str(folders[1])]]}
    path = tmp_path / "queue.yaml"
    path.write_text(yaml.safe_dump(queue))
    return path


def test_two_threads_train_their_lists_into_the_records(tmp_path: Path) -> None:
    script = load_script(SCRIPT)
    queue, root, logs = tiny_queue(tmp_path), tmp_path / "runs", tmp_path / "logs"
    args = ["--minutes", "10", "--queue", str(queue), "--root", str(root), "--src", str(SRC), "--logs", str(logs)]
    assert script.main(args) == 0
    finished = sorted(p.parent.relative_to(root).as_posix() for p in root.glob("*/*/model.safetensors"))
    assert finished == ["tiny_a/hyla-seed0", "tiny_a/hyla-seed1", "tiny_b/hyla-seed0", "tiny_b/hyla-seed1"]
    assert sorted(p.name for p in logs.iterdir()) == ["thread-0.log", "thread-1.log"]
    assert "--max-minutes" in (logs / "thread-0.log").read_text()


def test_a_next_seeds_item_trains_the_seeds_the_records_earned_when_the_thread_reaches_it(tmp_path: Path) -> None:
    script = load_script(SCRIPT)
    sweep = write_sweep(tmp_path, rows={"hyla": {"model.attention": "hyla"}}, grid={"train.lr": [0.001]}, seeds=[0, 1])
    queue, root = tmp_path / "queue.yaml", tmp_path / "runs"
    # at the queue's start no seed has finished, so only its turn (after seed 0) can earn seed 1
    items = [f"{sweep} --where seed=0", {"next_seeds": f"--sweep {sweep} --rows hyla"}]
    queue.write_text(yaml.safe_dump({"threads": [items]}))
    args = ["--minutes", "10", "--queue", str(queue), "--root", str(root), "--src", str(SRC), "--logs", str(tmp_path)]
    assert script.main(args) == 0
    finished = sorted(p.parent.name for p in (root / "tiny").glob("*/model.safetensors"))
    assert finished == ["hyla-lr0.001-seed0", "hyla-lr0.001-seed1"]


@pytest.mark.parametrize(
    ("answers", "fails", "trained"),
    [
        # a seed's result ends the point's claim to the next: asked again, next_seeds moves on to another point
        ([["p seed=1", "q seed=1"], ["q seed=1"], []], None, ["p seed=1", "q seed=1"]),
        # the sweep just trained printed again (it could not finish): not started a second time
        ([["p seed=1"], ["p seed=1"], []], None, ["p seed=1"]),
        # a failed sweep ends the item
        ([["p seed=1"], ["q seed=1"], []], "p seed=1", ["p seed=1"]),
    ],
)
def test_a_next_seeds_item_asks_again_after_each_sweep(
    tmp_path: Path, answers: list[list[str]], fails: str | None, trained: list[str]
) -> None:
    script = load_script(SCRIPT)
    queue = script.Queue([[{"next_seeds": "--rows hyla"}]], deadline=1e12, root=tmp_path, src=SRC, logs=tmp_path)
    asked, started = [], []

    def earned(args: str, log: object) -> list[str]:
        asked.append(args)
        return answers[len(asked) - 1]

    def train(sweep: str, minutes: int, log: object) -> bool:
        started.append(sweep)
        return sweep != fails

    queue.earned, queue.train = earned, train
    queue.work(0)
    assert started == trained
    assert len(asked) == len(trained) + (fails is None)  # asked after each sweep that did not fail


def test_a_bad_queue_item_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = load_script(SCRIPT)
    queue = tmp_path / "queue.yaml"
    queue.write_text(yaml.safe_dump({"threads": [["tiny --where seed=0", {"next_seed": "--rows hyla"}]]}))
    assert script.main(["--minutes", "10", "--queue", str(queue), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "thread 0, item 1" in err[0] and "next_seeds" in err[0]


def test_too_little_time_left_starts_no_sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = load_script(SCRIPT)
    queue, root = tiny_queue(tmp_path), tmp_path / "runs"
    monkeypatch.setattr(script.Queue, "minutes_left", lambda self: script.MIN_MINUTES - 1)
    args = ["--minutes", "10", "--queue", str(queue), "--root", str(root), "--src", str(SRC), "--logs", str(tmp_path)]
    assert script.main(args) == 0
    assert not root.exists()
    assert (tmp_path / "thread-1.log").read_text().startswith("not started")
    queue.write_text(yaml.safe_dump({"threads": [[{"next_seeds": "--rows hyla"}]]}))
    assert script.main(args) == 0  # a next_seeds item is not asked either
    assert (tmp_path / "thread-0.log").read_text().splitlines()[-1].startswith("not started")


def test_bad_minutes_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    script = load_script(SCRIPT)
    assert script.main(["--minutes", "1", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--minutes" in err[0]


def test_a_signal_reaches_the_running_sweeps_and_starts_nothing_more(tmp_path: Path) -> None:
    script = load_script(SCRIPT)
    queue = script.Queue([["tiny --where seed=0"]], deadline=1e12, root=tmp_path, src=SRC, logs=tmp_path)
    sweep = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    queue.running.append(sweep)
    queue.stop(signal.SIGTERM, None)
    assert sweep.wait() == -signal.SIGTERM
    queue.work(0)
    assert (tmp_path / "thread-0.log").read_text().startswith("not started")


def test_frozen_source_is_a_detached_worktree_of_the_commit_that_later_edits_do_not_reach(tmp_path: Path) -> None:
    queue = load_script(SCRIPT)
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    module = repo / "src" / "code.py"
    module.write_text("VALUE = 1\n")

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True)
        return done.stdout.strip()

    git("init", "--quiet")
    git("add", "src")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "--quiet", "-m", "first")
    first = git("rev-parse", "--short", "HEAD")
    src = queue.frozen_source("HEAD", repo)
    assert src == tmp_path / f"repo-frozen-{first}" / "src"
    module.write_text("VALUE = 2\n")  # an edit to the checkout, committed: the frozen tree keeps the first
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "--quiet", "-am", "second")
    assert (src / "code.py").read_text() == "VALUE = 1\n"
    frozen_head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=src, capture_output=True, text=True)
    assert frozen_head.stdout.strip() == first
    assert queue.frozen_source(first, repo) == src  # the same commit again: the same tree, not a second one
    assert queue.frozen_source("HEAD", repo) != src  # the new commit: a tree of its own
