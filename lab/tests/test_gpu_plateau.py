"""lab/gpu/gpu_plateau.sh on the CPU at tiny sizes, as two device calls would run it: the first trains the
seeds as one stack until its stop (a checkpoint) and packs their records; the second resumes the stack and packs
the checkpoints too (CHECKPOINTS=1). The stops are steps (STOP_AT_STEP), not minutes: where a call stops never
depends on how busy this machine is (the stop at a deadline, SIGTERM, has its own tests in test_sweep.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

from tiny import HANG_GUARD_S, tiny_overrides

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "lab" / "gpu" / "gpu_plateau.sh"
RUN = "lab/tables/gpu_plateau/hyla-seeds3-4"


def test_two_calls_train_one_stack_and_resume_it(tmp_path: Path) -> None:
    tiny = tiny_overrides(steps=100_000, every=100)
    env = {
        **os.environ,
        "DEVICE": "cpu",
        "SEEDS": "3,4",
        "PYTHON": sys.executable,
        "PYTHONPATH": str(REPO / "src"),
        "OMP_NUM_THREADS": "1",
        # the paper config's attention dropout and split stay: only the sizes and the schedule are tiny
        "EXTRA": " ".join(o for o in tiny if not o.startswith(("data.split_seed", "model.attention_dropout"))),
    }

    def call(name: str, stop_at: int, **more: str) -> str:
        archive = tmp_path / f"{name}.tar.gz"
        done = subprocess.run(
            ["bash", str(SCRIPT)],
            env={**env, "STOP_AT_STEP": str(stop_at), "ARCHIVE": str(archive), **more},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=HANG_GUARD_S,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout

    first = call("a", 100)
    assert "2 stacked runs (sraven_seed3, sraven_seed4)" in first, first[-3000:]
    assert "to step 100;" in first and "(exit 0: 0 finished or stopped at STOP_AT_STEP" in first, first[-3000:]
    for s in (3, 4):
        assert re.search(rf"seed{s}: logged to step 100; OOD % at each evaluation: 100:[0-9.]+$", first, re.M), first
    with tarfile.open(tmp_path / "a.tar.gz") as tar:
        assert set(tar.getnames()) == {f"{RUN}/seed{s}/{f}" for s in (3, 4) for f in ("config.yaml", "metrics.jsonl")}
    config = (tmp_path / RUN / "seed3" / "config.yaml").read_text()
    assert "split_seed: 0" in config and "attention_dropout: 0.1" in config and "seed: 3" in config

    second = call("b", 200, CHECKPOINTS="1")
    assert "to step 200, resumed;" in second, second[-3000:]
    assert re.search(r"seed3: logged to step 200; OOD % at each evaluation: 100:[0-9.]+ 200:[0-9.]+$", second, re.M)
    with tarfile.open(tmp_path / "b.tar.gz") as tar:
        names = set(tar.getnames())
    assert {f"{RUN}/seed{s}/checkpoints/latest" for s in (3, 4)} <= names
    assert any(
        n.endswith(
            "seed4/checkpoints/"
            + (tmp_path / RUN / "seed4/checkpoints/latest").read_text().strip()
            + "/model.safetensors"
        )
        for n in names
    )
