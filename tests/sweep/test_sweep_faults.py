"""`hyla sweep` under faults: a second sweep on the same folder, a killed sweep's workers, a diverging run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hyla.cli import main
from hyla.textio import read_jsonl
from hyla.train.run.folder import run_state
from hyla.train.run.lock import LOCK_FILE, lock_holder
from tiny import HANG_GUARD_S, TINY_SWEEP_OVERRIDES, torch_threads, write_sweep

SRC = Path(__file__).resolve().parents[2] / "src"

#: ``python FILE`` with ``hyla`` arguments: every trainer, in this process and in the workers it spawns (they import
#: this file as their main module), pauses after step $PAUSE_STEP: it writes $PAUSE_DIR/<run>.paused (its pid) and
#: waits until $PAUSE_DIR/go exists, so a test acts while runs are known to be training
PAUSING_HYLA = """
import os, sys, time
from pathlib import Path
from hyla.train.loop import Trainer

real_step = Trainer.train_step
marks = Path(os.environ["PAUSE_DIR"])

def step_then_pause(self):
    real_step(self)
    if self.step == int(os.environ["PAUSE_STEP"]):
        mark = marks / f"{self.runs[0].out.name}.paused"
        mark.with_suffix(".tmp").write_text(str(os.getpid()))
        os.replace(mark.with_suffix(".tmp"), mark)
        hang_guard = time.monotonic() + float(os.environ["HANG_GUARD_S"])
        while not (marks / "go").exists() and time.monotonic() < hang_guard:
            time.sleep(0.05)

Trainer.train_step = step_then_pause
if __name__ == "__main__":
    from hyla.cli import main
    sys.exit(main(sys.argv[1:]))
"""


def hyla_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(SRC), "HANG_GUARD_S": str(HANG_GUARD_S), **extra}


def start_pausing(tmp_path: Path, argv: list[str], pause_step: int, **env: str) -> tuple[subprocess.Popen, Path]:
    """``hyla ARGV`` in a new process whose trainers pause after ``pause_step`` (:data:`PAUSING_HYLA`); its marks'
    folder (``go`` there lets them on)."""
    marks = tmp_path / "marks"
    marks.mkdir(exist_ok=True)
    script = tmp_path / "pausing_hyla.py"
    script.write_text(PAUSING_HYLA)
    env = hyla_env(PAUSE_DIR=str(marks), PAUSE_STEP=str(pause_step), **env)
    cmd = [sys.executable, str(script), *argv]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), marks


def wait_for(event: Callable[[], bool], proc: subprocess.Popen | None, what: str) -> None:
    """Until ``event()``; fails if ``proc`` ends first. The bound only ends a hang: nothing here is timed."""
    give_up = time.monotonic() + HANG_GUARD_S
    while not event():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the command ended before {what}: {proc.communicate()}")
        assert time.monotonic() < give_up, f"hung: no {what}"
        time.sleep(0.1)


def paused(marks: Path) -> dict[str, int]:
    """The runs paused so far: name -> the pid of the process training it."""
    return {p.name.removesuffix(".paused"): int(p.read_text()) for p in marks.glob("*.paused")}


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by its new parent, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def records(root: Path) -> dict[str, tuple[str, str]]:
    return {
        run.name: ((run / "config.yaml").read_text(), (run / "metrics.jsonl").read_text())
        for run in sorted(root.iterdir())
        if (run / "config.yaml").is_file()
    }


def test_a_second_writer_on_a_sweeps_folder_exits_2_naming_the_first(tmp_path: Path) -> None:
    """While a sweep trains, a second ``hyla sweep`` on its folder and a ``hyla train`` into one of its runs stop at
    once (exit 2, one line naming the sweep's pid); the first goes on and writes the records of a sweep alone."""
    path = write_sweep(tmp_path, rows={"hyla": {"model.attention": "hyla"}}, grid={}, seeds=[0])
    root = tmp_path / "r"
    argv = ["sweep", str(path), "--root", str(root)]
    first, marks = start_pausing(tmp_path, argv, pause_step=2)
    try:
        wait_for(lambda: "hyla-seed0" in paused(marks), first, "run training")
        assert lock_holder(root / "tiny") == (first.pid, "hyla sweep")
        second = subprocess.run(
            [sys.executable, "-m", "hyla", *argv], env=hyla_env(), capture_output=True, text=True, timeout=HANG_GUARD_S
        )
        train = [
            sys.executable,
            "-m",
            "hyla",
            "train",
            "fuzzy_logic",
            "--resume",
            "--out",
            str(root / "tiny" / "hyla-seed0"),
        ]
        into_a_run = subprocess.run(train, env=hyla_env(), capture_output=True, text=True, timeout=HANG_GUARD_S)
        (marks / "go").touch()
        out, err = first.communicate(timeout=HANG_GUARD_S)
    finally:
        if first.poll() is None:
            first.kill()
    assert second.returncode == 2, (second.stdout, second.stderr)
    [line] = second.stderr.strip().splitlines()
    assert line.startswith(f"hyla sweep: error: {root / 'tiny'} is in use by pid {first.pid} (hyla sweep)"), line
    assert into_a_run.returncode == 2, (into_a_run.stdout, into_a_run.stderr)
    [line] = into_a_run.stderr.strip().splitlines()
    assert f"hyla-seed0 is in use by pid {first.pid} (hyla sweep)" in line, line
    assert first.returncode == 0, (out, err)
    assert "1 runs finished now, 0 left" in out
    assert main(["sweep", str(path), "--root", str(tmp_path / "alone")]) == 0
    assert records(root / "tiny") == records(tmp_path / "alone" / "tiny")
    [piece] = read_jsonl(root / "tiny" / "hyla-seed0" / "made_by.jsonl")
    assert piece["from_step"] == 0 and piece["to_step"] == 8
    # the holder removed its lock files as it ended: nothing of them in the record
    assert not (root / "tiny" / LOCK_FILE).exists() and not (root / "tiny" / "hyla-seed0" / LOCK_FILE).exists()


def test_lock_files_left_by_a_killed_sweep_are_taken_over(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``kill -9`` leaves the lock files but no lock (the kernel drops it with the process): the next sweep takes
    them over, and they are no run (state, plan) and no part of one."""
    path = write_sweep(tmp_path, rows={"hyla": {"model.attention": "hyla"}}, grid={}, seeds=[0])
    run = tmp_path / "r" / "tiny" / "hyla-seed0"
    run.mkdir(parents=True)
    for folder in (run.parent, run):
        (folder / LOCK_FILE).write_text("4194304 hyla sweep\n")  # a pid above Linux's maximum: no such process
    assert main(["sweep", str(path), "--root", str(tmp_path / "r"), "--dry-run"]) == 0
    assert "tiny: 1 runs, 0 done, 1 to train" in capsys.readouterr().out
    assert main(["sweep", str(path), "--root", str(tmp_path / "r")]) == 0
    assert "1 runs finished now, 0 left" in capsys.readouterr().out
    assert run_state(run) == "done"
    assert not (run.parent / LOCK_FILE).exists() and not (run / LOCK_FILE).exists()


def test_the_workers_of_a_killed_sweep_stop_with_checkpoints_and_start_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``kill -9`` of ``hyla sweep --jobs 2``: its two workers save their runs and exit, the queued third run
    never starts, and a rerun ends with the records of an uninterrupted sweep."""
    path = write_sweep(tmp_path, rows={"hyla": {"model.attention": "hyla"}}, grid={}, seeds=[0, 1, 2])
    root = tmp_path / "r"
    argv = ["sweep", str(path), "--root", str(root), "--jobs", "2"]
    sweep, marks = start_pausing(tmp_path, argv, pause_step=2, OMP_NUM_THREADS="1")
    workers: set[int] = set()
    try:
        wait_for(lambda: len(paused(marks)) == 2, sweep, "two runs training")
        training = paused(marks)
        assert sorted(training) == ["hyla-seed0", "hyla-seed1"]
        workers = set(training.values())
        assert len(workers) == 2 and sweep.pid not in workers and all(alive(pid) for pid in workers)
        sweep.kill()
        sweep.wait(timeout=HANG_GUARD_S)  # not communicate(): the workers hold its output pipes open
        (marks / "go").touch()  # the workers go on from their pause, their sweep gone
        # until both have ended; a worker that took the queued run instead fails the test at once
        wait_for(
            lambda: not any(alive(pid) for pid in workers) or "hyla-seed2" in paused(marks), None, "workers ending"
        )
    finally:
        if sweep.poll() is None:
            sweep.kill()
        (marks / "go").touch()
        for pid in workers:  # left behind by a failure above: they would wait on a sweep that is gone
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert "hyla-seed2" not in paused(marks), "a worker started a run after its sweep had died"
    tiny = root / "tiny"
    assert {name: run_state(tiny / name) for name in training} == {"hyla-seed0": "stopped", "hyla-seed1": "stopped"}
    assert run_state(tiny / "hyla-seed2") == "new" and not (tiny / "hyla-seed2" / "train.log").exists()
    for name in training:  # each worker saved and recorded its piece before it exited
        [piece] = read_jsonl(tiny / name / "made_by.jsonl")
        assert piece["from_step"] == 0 and piece["to_step"] == 2 and piece["ended"] is not None

    with torch_threads(1):  # the workers' one thread each: the same arithmetic in this process
        for target in (root, tmp_path / "uninterrupted"):
            assert main(["sweep", str(path), "--root", str(target)]) == 0
            assert "3 runs finished now, 0 left" in capsys.readouterr().out
    assert records(tiny) == records(tmp_path / "uninterrupted" / "tiny")
    assert [p["from_step"] for p in read_jsonl(tiny / "hyla-seed0" / "made_by.jsonl")] == [0, 2]


def diverging_grid(tmp_path: Path, **extra: str) -> Path:
    return write_sweep(
        tmp_path, rows={"bad": {"train.lr": 1e6}, "good": {"train.lr": 1e-3}}, grid={}, seeds=[0], extra=extra
    )


def test_a_diverging_run_is_recorded_as_failed_and_the_grid_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = diverging_grid(tmp_path)
    root = tmp_path / "r"
    bad, good = root / "tiny" / "bad-seed0", root / "tiny" / "good-seed0"
    argv = ["sweep", str(path), "--root", str(root)]
    assert main(argv) == 3
    out, err = capsys.readouterr()
    assert "failed: bad-seed0 (loss became NaN/inf at step 4)" in out and "1 runs finished now, 0 left, 1 failed" in out
    [line] = err.strip().splitlines()
    assert line.startswith("hyla sweep: error: 1 runs failed: bad-seed0 (loss became NaN/inf at step 4). A rerun")
    assert "--retry-failed" in line and f"edit tiny.yaml and remove its folder under {root / 'tiny'}" in line
    assert "lower train.lr" in line and "bf16" not in line  # bf16 is off: no advice about it
    assert run_state(good) == "done"
    [piece] = read_jsonl(bad / "made_by.jsonl")
    # it saved nothing (its first checkpoint would have been at step 4): it claims no step
    assert piece["failed"] == "loss became NaN/inf at step 4" and piece["from_step"] == 0 and piece["to_step"] is None
    assert "failed" not in read_jsonl(good / "made_by.jsonl")[0]

    # a rerun trains nothing and names the failed run again
    before = {p: p.read_bytes() for p in (bad / "metrics.jsonl", bad / "made_by.jsonl", good / "metrics.jsonl")}
    assert main(argv) == 3
    out, err = capsys.readouterr()
    assert "tiny: 1 of 2 runs are done, 1 failed" in out and "to train" not in out
    [line] = err.strip().splitlines()
    assert "1 runs failed: bad-seed0 (loss became NaN/inf at step 4)" in line
    assert {p: p.read_bytes() for p in before} == before

    # --retry-failed trains it again, afresh (it has no checkpoint), and it fails alike
    assert main([*argv, "--retry-failed"]) == 3
    assert "tiny: 1 of 2 runs to train" in capsys.readouterr().out
    pieces = read_jsonl(bad / "made_by.jsonl")
    assert [(p["from_step"], p["to_step"], p["failed"]) for p in pieces] == [(0, None, piece["failed"])] * 2
    assert (good / "metrics.jsonl").read_bytes() == before[good / "metrics.jsonl"]


def test_a_diverging_run_stops_its_stack_but_only_it_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Stacked, the diverging run stops its partner too: that one is not failed, claims no unsaved step, and the
    next sweep trains it afresh (its checkpoint-less metrics dropped) while the failed one stays skipped."""
    path = diverging_grid(tmp_path, **{"model.attention_dropout": "0.0", "data.split_seed": "0"})
    root = tmp_path / "r"
    argv = ["sweep", str(path), "--root", str(root), "--max-stack", "2"]
    assert main(argv) == 3
    out, err = capsys.readouterr()
    assert "0 runs finished now, 1 left, 1 failed (run the same command to continue)" in out
    assert "1 runs failed: bad-seed0 (loss became NaN/inf at step 4)" in err
    good = root / "tiny" / "good-seed0"
    [piece] = read_jsonl(good / "made_by.jsonl")
    assert piece["stacked_with"] == 2 and piece["to_step"] is None and "failed" not in piece
    assert main(argv) == 3
    assert "1 runs finished now, 0 left" in capsys.readouterr().out
    assert run_state(good) == "done"
    assert [p["step"] for p in read_jsonl(good / "metrics.jsonl") if p["split"] == "train_batch"] == [2, 4, 6, 8]


def test_hyla_train_names_only_the_advice_that_applies_to_a_nan_loss(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hyla.train.cli import divergence_advice

    overrides = [o for o in TINY_SWEEP_OVERRIDES if not o.startswith("train.lr")]
    assert main(["train", "fuzzy_logic", *overrides, "train.lr=1e6", "--quiet", "--out", str(tmp_path / "t")]) == 3
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("hyla train: error: loss became NaN/inf at step 4; stopped.")
    assert line.endswith("to train it anew with a lower train.lr, choose another --out (a resume keeps the config)")
    assert divergence_advice(True, "choose another --out").startswith(
        "to train it anew with a lower train.lr or train.bf16=false, choose another --out"
    )
