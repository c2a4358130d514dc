"""lab/gpu/gpu_paper.sh, the GPU queue's driver, run on the CPU at tiny sizes."""

from __future__ import annotations

import io
import json
import os
import shlex
import tarfile
from pathlib import Path

import yaml

from hyla.train.run.folder import run_state
from tiny import write_sweep


def test_gpu_paper_script_runs_in_pieces_on_cpu_at_tiny_size(tmp_path: Path) -> None:
    """lab/gpu/gpu_paper.sh, as device calls would run it, with tiny sweeps on the CPU: a call whose
    budget is too short for any stage trains nothing and says how many runs are left, a call with enough
    budget trains them all, a call after that trains nothing. Whether a stage runs depends only on the
    budget given, never on how fast this machine is (stopping mid-run at --max-minutes has its own test)."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    files = {}
    for task in ("fuzzy_logic", "sraven"):
        rows = {p: {"model.attention": p} for p in ("softmax", "linear", "hyla")}
        (tmp_path / task).mkdir()
        path = write_sweep(tmp_path / task, rows=rows, grid={}, seeds=[0])
        spec = yaml.safe_load(path.read_text())
        spec.update(name=f"tiny_{task}", config=task)
        path.write_text(yaml.safe_dump(spec))
        files[task] = path
    env = {
        **os.environ,
        "DEVICE": "cpu",
        "ROOT": "records",  # relative: the archive holds paths relative to where the script runs
        "PAPER_OUT": "paper_out",
        "LATENTS": "0",  # the report's latent-code analysis has its own test (test_paper_report.py)
        "FUZZY": str(files["fuzzy_logic"]),
        "SRAVEN": str(files["sraven"]),
        "PYTHON": sys.executable,
        "PYTHONPATH": str(repo / "src"),
        "OMP_NUM_THREADS": "1",
        "STAGES": "fuzzy sraven-main sraven-rest",
        # eager steps: train.fast on a CPU (torch.compile, dropout included) has its own tests (test_train.py,
        # test_stacked.py); here six compilations would be most of the test's minutes
        "EXTRA": "train.fast=false",
    }

    def call(where: str, minutes: str, **more: str) -> subprocess.CompletedProcess[str]:
        (tmp_path / where).mkdir(exist_ok=True)
        script = ["bash", str(repo / "lab" / "gpu" / "gpu_paper.sh")]
        run_env = {**env, "MINUTES": minutes, "ARCHIVE": str(tmp_path / f"{where}.tar.gz"), **more}
        done = subprocess.run(script, env=run_env, cwd=tmp_path / where, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done

    def archived(where: str) -> set[str]:
        whole = tmp_path / f"{where}.tar.gz"
        parts = sorted(tmp_path.glob(f"{where}.tar.gz.part-*"))
        data = whole.read_bytes() if whole.exists() else b"".join(part.read_bytes() for part in parts)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            return set(tar.getnames())

    # a run stopped at step 4 (as a call whose budget ends mid-run leaves it)
    (tmp_path / "a").mkdir()
    emitted = subprocess.run(
        [sys.executable, "-m", "hyla", "sweep", str(files["fuzzy_logic"]), "--root", "records", "--emit-commands"],
        env=env,
        cwd=tmp_path / "a",
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()[0]
    words = shlex.split(emitted)
    assert words[:2] == ["hyla", "train"]
    stop = [sys.executable, "-m", "hyla", *words[1:], "--stop-at-step", "4"]
    subprocess.run(stop, env=env, cwd=tmp_path / "a", check=True, capture_output=True)
    # 6 s: under the 20 s the script wants before a stage, however little of it has passed; and an archive
    # over PART_MIB comes back in parts (a device call returns files of at most 16 MiB). No paper report here:
    # the second call's archive holds one
    skipped = call("a", "0.1", PART_MIB="0.002", REPORT="0")
    assert [line for line in skipped.stdout.splitlines() if line.startswith("budget spent")] == [
        "budget spent before stage fuzzy",
        "budget spent before stage sraven-main",
        "budget spent before stage sraven-rest",
    ]
    assert "== stage" not in skipped.stdout and "not done yet (6 runs left)" in skipped.stdout, skipped.stdout
    assert "  left: records/tiny_fuzzy_logic/softmax-seed0" in skipped.stdout.splitlines(), skipped.stdout
    assert not (tmp_path / "a.tar.gz").exists() and len(list(tmp_path.glob("a.tar.gz.part-*"))) > 1
    stopped = words[words.index("--out") + 1]
    assert {f"{stopped}/metrics.jsonl", f"{stopped}/checkpoints/latest"} <= archived("a")
    assert any(n.startswith(f"{stopped}/checkpoints/step-000000004/") for n in archived("a"))
    # elsewhere (another machine), from that archive: 10 hours for six runs of 8 tiny steps, a bound no
    # machine comes near, so every stage starts and every run ends by its steps, not by the clock
    trained = call("b", "600", RESUME_FROM=str(tmp_path / "a.tar.gz"))
    stages = [line.split(" (")[0] for line in trained.stdout.splitlines() if line.startswith("== stage")]
    assert stages == ["== stage fuzzy", "== stage sraven-main", "== stage sraven-rest"], trained.stdout
    assert "all done" in trained.stdout, trained.stdout
    rows = ("softmax", "linear", "hyla")
    runs = [tmp_path / "b" / "records" / f"tiny_{t}" / f"{row}-seed0" for t in files for row in rows]
    assert all(run_state(run) == "done" and (run / "model.safetensors").is_file() for run in runs)
    made_by = {run: (run / "made_by.jsonl").read_text() for run in runs}
    assert all(len(text.splitlines()) == 1 for text in made_by.values())  # each trained in one piece
    assert json.loads(made_by[tmp_path / "b" / stopped])["from_step"] == 4  # continued from the archive
    names = archived("b")
    assert not any("/checkpoints/" in n for n in names)  # finished runs keep their weights, not checkpoints
    assert {f"{stopped}/model.safetensors", "paper_out/paper.md"} <= names
    # a third call, from the second's archive, finds everything done and trains nothing
    again = call("c", "600", RESUME_FROM=str(tmp_path / "b.tar.gz"), REPORT="0")
    assert "all done" in again.stdout and "all 3 runs are done" in again.stdout, again.stdout
    assert made_by == {
        tmp_path / "b" / run.relative_to(tmp_path / "c"): (run / "made_by.jsonl").read_text()
        for run in (tmp_path / "c" / "records").glob("*/*")
    }
