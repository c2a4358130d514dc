"""One writer per run directory: the folder lock (:mod:`hyla.train.run.lock`) and two `hyla train --out` on one
folder."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hyla.cli import main
from hyla.train.run.lock import LOCK_FILE, FolderInUseError, FolderLock, lock_holder
from tiny import HANG_GUARD_S, tiny_overrides

SRC = Path(__file__).resolve().parents[2] / "src"

#: ``python -c`` this with ``hyla`` arguments: the trainer pauses after step 2, writes $PAUSED (its pid) and waits
#: until $GO exists, so that the test acts while the run is known to be training
PAUSE_AFTER_STEP_2 = """
import os, sys, time
from pathlib import Path
from hyla.cli import main
from hyla.train.loop import Trainer

real_step = Trainer.train_step

def step_then_pause(self):
    real_step(self)
    if self.step == 2:
        Path(os.environ["PAUSED"]).write_text(str(os.getpid()))
        hang_guard = time.monotonic() + float(os.environ["HANG_GUARD_S"])
        while not Path(os.environ["GO"]).exists() and time.monotonic() < hang_guard:
            time.sleep(0.05)

Trainer.train_step = step_then_pause
sys.exit(main(sys.argv[1:]))
"""


def test_a_held_folder_refuses_a_second_holder_naming_the_first(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with FolderLock(run, "hyla train"):
        assert lock_holder(run) == (os.getpid(), "hyla train")
        with pytest.raises(
            FolderInUseError, match=re.escape(f"{run} is in use by pid {os.getpid()} (hyla train)")
        ) as err:
            FolderLock(run, "hyla sweep").acquire()  # a flock is per open file: this process's second one too
        assert err.value.pid == os.getpid()
        (run / "config.yaml").write_text("{}\n")
    assert not (run / LOCK_FILE).exists() and (run / "config.yaml").is_file()  # the lock file goes, the run stays
    with FolderLock(tmp_path / "empty", "hyla train"):
        pass
    assert not (tmp_path / "empty").exists()  # made only to hold the lock


def test_a_lock_file_without_a_live_holder_is_taken_over(tmp_path: Path) -> None:
    """What ``kill -9`` leaves: the file, with its pid, but no lock (the kernel dropped it with the process)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_FILE).write_text("4194304 hyla sweep\n")
    with FolderLock(run, "hyla train"):
        assert lock_holder(run) == (os.getpid(), "hyla train")
    assert list(run.iterdir()) == []


def test_a_folder_that_cannot_be_made_is_one_error(tmp_path: Path) -> None:
    (tmp_path / "a_file").write_text("")
    with pytest.raises(ValueError, match=r"cannot make the run directory .*a_file/run \(Not a directory\)"):
        FolderLock(tmp_path / "a_file" / "run", "hyla train", "the run directory").acquire()


def test_a_second_hyla_train_on_the_same_out_exits_2_naming_the_first(tmp_path: Path) -> None:
    args = ["train", "fuzzy_logic", *tiny_overrides(steps=8, every=4, log_every=2, warmup_steps=2), "--quiet"]
    out, paused, go = tmp_path / "run", tmp_path / "paused", tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(SRC), "HANG_GUARD_S": str(HANG_GUARD_S)}
    cmd = [sys.executable, "-c", PAUSE_AFTER_STEP_2, *args, "--out", str(out)]
    first = subprocess.Popen(
        cmd,
        env={**env, "PAUSED": str(paused), "GO": str(go)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        give_up = time.monotonic() + HANG_GUARD_S  # ends a hang only: the wait is for the run to train
        while not paused.is_file() and first.poll() is None:
            assert time.monotonic() < give_up, "hung: the first run never reached step 2"
            time.sleep(0.1)
        assert first.poll() is None, first.communicate()
        assert lock_holder(out) == (first.pid, "hyla train")
        for extra in ([], ["--resume"]):
            second = subprocess.run(
                [sys.executable, "-m", "hyla", *args, "--out", str(out), *extra],
                env=env,
                capture_output=True,
                text=True,
                timeout=HANG_GUARD_S,
            )
            assert second.returncode == 2, (second.stdout, second.stderr)
            [line] = second.stderr.strip().splitlines()
            assert line.startswith(f"hyla train: error: {out} is in use by pid {first.pid} (hyla train)"), line
        go.touch()
        stdout, stderr = first.communicate(timeout=HANG_GUARD_S)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, (stdout, stderr)
    assert main([*args, "--out", str(tmp_path / "alone")]) == 0
    assert (out / "metrics.jsonl").read_text() == (tmp_path / "alone" / "metrics.jsonl").read_text()
    assert not (out / LOCK_FILE).exists()
