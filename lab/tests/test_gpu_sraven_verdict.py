"""lab/gpu/gpu_sraven_verdict.sh, as two device calls would run it, on the CPU at tiny sizes: the first call
trains the authors' SRAVEN HYLA (two seeds at once, stopped by SIGTERM after their first step) and then
our SRAVEN HYLA row, and packs one archive; the second, from that archive, continues their runs where they
stopped, to a step (their --stop_after). Every stop is on a count, never on this machine's speed: the budget
(MINUTES) is one no machine comes near. The overrides are those of a GPU call (train.fast=true for ours; their
configs/raven.py with the flags below), only the sizes are tiny.

Their part needs the authors' venv and checkout (AUTHORS_VENV, AUTHORS_CODE); where they are missing (CI), the
same calls run ours alone (AUTHORS_SEEDS empty)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from tiny import AUTHORS_TINY_BATCH, AUTHORS_TINY_MODEL, HANG_GUARD_S, tiny_overrides

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "lab" / "gpu" / "gpu_sraven_verdict.sh"
AUTHORS_VENV = Path(os.environ.get("AUTHORS_VENV", "/work/authors/venv"))
AUTHORS_CODE = Path(os.environ.get("AUTHORS_CODE", "/work/authors/code"))
AUTHORS_PYTHON = AUTHORS_VENV / "bin" / "python"
HAVE_AUTHORS = AUTHORS_PYTHON.exists() and (AUTHORS_CODE / "run.py").is_file()

SEEDS = ("0", "1:0")  # two at once (on a GPU three or more); 1:0 = the data of seed 1, the initial state of seed 0
BATCH = AUTHORS_TINY_BATCH
#: their configs/raven.py shrunk, with a schedule of 100,000 steps that no call here finishes
AUTHORS_EXTRA = [
    *AUTHORS_TINY_MODEL,
    f"--config.data.num_train={100_000 * BATCH}",
]
RUNS = "lab/tables/gpu_sraven_verdict/authors"


def tiny_sweep(where: Path, task: str, grid: dict) -> Path:
    """A tiny sweep of the one row hyla (the paper configs' split and attention dropout, as gpu_paper.sh's test)."""
    overrides = {k: yaml.safe_load(v) for k, v in (o.split("=", 1) for o in tiny_overrides(steps=8, every=4))}
    overrides.update({"data.split_seed": None, "model.attention_dropout": 0.1})
    spec = {
        "name": f"tiny_{task}",
        "config": task,
        "rows": {"hyla": {"model.attention": "hyla"}},
        "grid": grid,
        "seeds": [0],
        "overrides": overrides,
    }
    path = where / f"{task}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def tiny_env(tmp_path: Path, sraven_grid: dict) -> dict[str, str]:
    """The environment of a CPU call of the scripts at tiny size: the tiny sweeps, our package, one thread, no
    report (tested with gpu_paper.sh in tests/sweep/test_sweep.py)."""
    return {
        **os.environ,
        "DEVICE": "cpu",
        "ROOT": "records",  # relative: the archive holds paths relative to where the script runs
        "FUZZY": str(tiny_sweep(tmp_path, "fuzzy_logic", {})),
        "SRAVEN": str(tiny_sweep(tmp_path, "sraven", sraven_grid)),
        "PYTHON": sys.executable,
        "PYTHONPATH": str(REPO / "src"),
        "OMP_NUM_THREADS": "1",
        "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false",
        "REPORT": "0",
    }


def authors_env(tmp_path: Path) -> dict[str, str]:
    """What their driver needs at tiny size: a copy of their code (as `prepare` copies it: their checkout is never
    written to), their venv, evaluations on a few problems, a log line every step."""
    code = tmp_path / "authors_code"
    shutil.copytree(AUTHORS_CODE, code, ignore=shutil.ignore_patterns(".git", "__pycache__"))
    return {
        "AUTHORS_CODE": str(code),
        "AUTHORS_PYTHON": str(AUTHORS_PYTHON),
        "AUTHORS_SITE": str(tmp_path / "site"),
        "EVAL_EVERY": "50",
        "LOG_EVERY": "1",
        "EVAL_PROBLEMS": "32",
        # their start (JAX's import and compilation) may take minutes on a busy machine: the SIGTERM sent
        # before it waits for it, and never turns into a SIGKILL
        "AUTHORS_GRACE_S": str(HANG_GUARD_S),
    }


def test_two_calls_continue_their_runs_and_archive_ours(tmp_path: Path) -> None:
    env = {
        **tiny_env(tmp_path, {"train.lr": [0.001, 0.0003]}),  # SRAVEN: one stack of two runs
        "AUTHORS_SEEDS": "",
        # ours without torch.compile: what a call runs of ours is tested by gpu_paper.sh's own test
        # (tests/sweep/test_sweep.py); here, how the two parts share the call and its archive
        "EXTRA": "train.fast=false",
        "REPORT": "0",  # and the paper report in its archive too
    }
    if HAVE_AUTHORS:
        env.update(
            authors_env(tmp_path),
            AUTHORS_SEEDS=" ".join(SEEDS),
            AUTHORS_EXTRA=" ".join(AUTHORS_EXTRA),
            # every compilation into the cache that travels in the archive (a newer JAX compiles these tiny
            # programs in under the default minimum of one second)
            JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        )

    def call(where: str, **more: str) -> str:
        (tmp_path / where).mkdir()
        # 10 hours: a bound no machine comes near, so that what trains depends on the counts alone
        run_env = {**env, "MINUTES": "600", "ARCHIVE": str(tmp_path / f"{where}.tar.gz"), **more}
        done = subprocess.run(
            ["bash", str(SCRIPT)],
            env=run_env,
            cwd=tmp_path / where,
            capture_output=True,
            text=True,
            timeout=HANG_GUARD_S,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout

    def archived(where: str) -> set[str]:
        path = tmp_path / f"{where}.tar.gz"
        if not path.exists():  # split: its parts, concatenated
            parts = sorted(tmp_path.glob(f"{where}.tar.gz.part-*"))
            path = tmp_path / f"{where}.joined.tar.gz"
            path.write_bytes(b"".join(p.read_bytes() for p in parts))
        with tarfile.open(path) as tar:
            return set(tar.getnames())

    ours = [f"records/tiny_sraven/hyla-lr{lr}-seed0" for lr in (0.001, 0.0003)]
    # the first call stops theirs at once: a stop before the first step is acted on after it (its evaluation
    # included), so they stop at batch index 1 however slow this machine is
    # its archive is split into parts of 10 kB (on a GPU, of 15 MiB), from which the second call continues
    first = call("a", AUTHORS_MINUTES="0", PART_MIB="0.01")
    assert not (tmp_path / "a.tar.gz").exists() and (tmp_path / "a.tar.gz.part-001").exists(), first
    assert "== stage sraven-hyla" in first and "tiny_sraven: 2 runs finished now, 0 left" in first, first
    assert "ours, SRAVEN HYLA: 0 runs left" in first, first
    names = archived("a")
    assert {f"{run}/{f}" for run in ours for f in ("metrics.jsonl", "model.safetensors")} <= names
    assert not any("tiny_fuzzy_logic" in n for n in names)  # not trained: STAGES is sraven-hyla alone

    # the second, from the first's archive (their compiled programs included), trains them to batch index 6
    # (--stop_after=6); it names a matmul precision (on a CPU float32 is JAX's default anyway), which their
    # logs record
    second = call(
        "b",
        RESUME_FROM=str(tmp_path / "a.tar.gz"),
        AUTHORS_EXTRA=" ".join([*AUTHORS_EXTRA, "--stop_after=6"]),
        JAX_DEFAULT_MATMUL_PRECISION="float32",
    )
    assert "continued from" in second and "tiny_sraven: all 2 runs are done" in second, second
    assert {f"{run}/metrics.jsonl" for run in ours} <= archived("b")  # unpacked from a, packed again

    if not HAVE_AUTHORS:
        return
    for seed in SEEDS:
        data_seed, _, init_seed = seed.partition(":")
        run = f"{RUNS}/sraven-hyla-seed{data_seed}" + (f"-init{init_seed}" if init_seed else "")
        assert {f"{run}/event.log", f"{run}/resume.pkl", f"{run}/stdout.log"} <= names
        log_a = (tmp_path / "a" / run / "stdout.log").read_text()
        stopped = int(re.search(r"Signal 15: saved \S+ at batch index (\d+)", log_a).group(1))
        assert stopped == 1
        swapped = f"Initial state from seed {init_seed}; split and batches from seed {data_seed}"
        assert (swapped in log_a) == bool(init_seed), log_a[-2000:]
        # the second call resumed where the first stopped, and stopped at its step
        log_b = (tmp_path / "b" / run / "stdout.log").read_text()
        assert log_b.startswith(log_a)
        assert f"Resuming at batch index {stopped} (step {stopped})" in log_b[len(log_a) :]
        precision = "== JAX_DEFAULT_MATMUL_PRECISION=float32"
        assert precision not in log_a and precision in log_b[len(log_a) :]
        assert re.search(r"--stop_after=6: saved \S+ at batch index 6", log_b[len(log_a) :]), log_b[-2000:]
        again = 6
        assert f"theirs seed {seed}: batch index {stopped:,} -> {again:,} of 100,000" in second, second
        # event.log goes on from the step where the first call stopped (a train line every step)
        events = (tmp_path / "b" / run / "event.log").read_text()
        steps = [int(s) for s in re.findall(r"step: (\d+) \ttrain_", events)]
        assert steps == list(range(1, again + 1)), steps
        assert {f"{run}/event.log", f"{run}/resume.pkl"} <= archived("b")
    for out in (first, second):
        assert "failed" not in out, out
        assert re.search(r"train_steps_per_sec this call: median [0-9.]+", out), out
        assert "their resume.pkl:" in out
    assert "SIGTERM to seeds" in first and "SIGTERM to seeds" not in second
    assert any(n.startswith("lab/tables/gpu_sraven_verdict/jax_cache/") for n in archived("a"))


def test_gpu_paper_refuses_an_unknown_stage_before_training(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "STAGES": "sraven-hyla 2-sraven",
        "PYTHON": sys.executable,
        "PYTHONPATH": str(REPO / "src"),
        "ARCHIVE": str(tmp_path / "x"),
    }
    script = ["bash", str(REPO / "lab" / "gpu" / "gpu_paper.sh")]
    done = subprocess.run(script, env=env, cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 2 and "unknown stage '2-sraven'; allowed: smoke" in done.stderr, done.stderr
    assert "== stage" not in done.stdout and not (tmp_path / "x").exists()


@pytest.mark.skipif(not HAVE_AUTHORS, reason="needs the authors' venv and code (AUTHORS_VENV, AUTHORS_CODE)")
def test_the_queue_runs_the_authors_code_at_the_selected_point(tmp_path: Path) -> None:
    """gpu_paper.sh's stage ``authors`` (#48 part 3): their HYLA and softmax (here seed 2 and seed 0 of the
    stage's HYLA 0-2 and softmax 0), each in its own folder, at lr 3e-4 and wd 0.3; the CPU test's tiny model and
    warmup in AUTHORS_EXTRA; stopped by their --stop_after."""
    work = tmp_path / "work"
    work.mkdir()
    env = {
        **tiny_env(tmp_path, {}),
        **authors_env(tmp_path),
        "STAGES": "authors",
        "MINUTES": "600",
        "ARCHIVE": str(tmp_path / "queue.tar.gz"),
        "AUTHORS_EXTRA": " ".join([*AUTHORS_EXTRA, "--stop_after=2"]),
        "AUTHORS_STAGE_SEEDS": "hyla/2 softmax/0",  # two of the stage's four runs: a JAX process a core
        "AUTHORS_MINUTES": "600",  # --stop_after stops them, never the clock
        "JAX_CACHE": "",
    }
    script = ["bash", str(REPO / "lab" / "gpu" / "gpu_paper.sh")]
    done = subprocess.run(script, env=env, cwd=work, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0 and "the authors stage failed" not in done.stdout, done.stdout[-3000:] + done.stderr
    logs = work / "results" / "gpu_sraven_verdict" / "authors_lr3e-4_wd0.3"
    assert sorted(p.name for p in logs.iterdir()) == ["sraven-hyla-seed2", "sraven-softmax-seed0"]
    for run, mixer in (("sraven-hyla-seed2", "linear_hypatt"), ("sraven-softmax-seed0", "softmax_attention")):
        stdout = (logs / run / "stdout.log").read_text()
        assert re.search(r"--stop_after=2: saved \S+ at batch index 2", stdout), stdout[-2000:]
        # the tiny test's warmup (AUTHORS_EXTRA) replaces the point's 1000: their parser refuses a key given twice
        config = f"Config: sequence_mixer={mixer} lr=0.0003 weight_decay=0.3 warmup_steps=4 seed={run[-1]}"
        assert config in stdout, stdout[-3000:]
    with tarfile.open(tmp_path / "queue_authors.tar.gz") as tar:
        assert "lab/tables/gpu_sraven_verdict/authors_lr3e-4_wd0.3/sraven-softmax-seed0/event.log" in tar.getnames()
