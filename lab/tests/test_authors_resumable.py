"""lab/authors/authors_sraven_resumable.py: the authors' SRAVEN training, stopped and resumed, ends where an
uninterrupted run does (bitwise), with the same log.

Runs their code (smonsays/hypernetwork-attention) in its own JAX venv at a tiny size, so it is skipped where
that venv or checkout is missing (AUTHORS_VENV, AUTHORS_CODE)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tiny import AUTHORS_TINY_BATCH, AUTHORS_TINY_MODEL, HANG_GUARD_S

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "lab" / "authors" / "authors_sraven_resumable.py"
AUTHORS_VENV = Path(os.environ.get("AUTHORS_VENV", "/work/authors/venv"))
AUTHORS_CODE = Path(os.environ.get("AUTHORS_CODE", "/work/authors/code"))
PYTHON = AUTHORS_VENV / "bin" / "python"

pytestmark = pytest.mark.skipif(
    not (PYTHON.exists() and AUTHORS_CODE.is_dir()),
    reason="needs the authors' venv and code (AUTHORS_VENV, AUTHORS_CODE)",
)

BATCH = AUTHORS_TINY_BATCH
TINY = [
    "--config=configs/raven.py:raven_3x3_4features;linear_hypatt",
    "--config.seed=3",
    *AUTHORS_TINY_MODEL,
    "--config.data.num_test=256",
    "--config.data.num_ood=256",
    "--logger=standard",
]
LOG_PREFIX = re.compile(r"^\[INFO\s+\d\d:\d\d:\d\d\] ")

# The state files hold their ExperimentState, which only their code (and JAX) can unpickle.
COMPARE = """
import os, pickle, sys
import numpy as np
sys.path.insert(0, os.environ["SCRIPT_DIR"])
from authors_sraven_resumable import import_their_run
import_their_run()
import jax
a, b = (pickle.load(open(p, "rb")) for p in sys.argv[1:3])
la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
print(len(la), all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb)))
"""


# Their run.py unchanged, as authors_side_by_side.sh's launcher runs it.
THEIR_RUN = """
import os, runpy, sys
sys.path.insert(0, os.environ["SCRIPT_DIR"])
from authors_sraven_resumable import stub_unused_modules
stub_unused_modules()
os.chdir(os.environ["AUTHORS_CODE"])
sys.path.insert(0, os.environ["AUTHORS_CODE"])
sys.argv = ["run.py"] + sys.argv[1:]
runpy.run_path("run.py", run_name="__main__")
"""


def env(cache: Path) -> dict[str, str]:
    """One CPU thread, as authors_side_by_side.sh runs them; a compilation cache shared by the runs of a test
    (the first run compiles, ~20 s; the others reuse its executables)."""
    return {
        **os.environ,
        "AUTHORS_CODE": str(AUTHORS_CODE),
        "JAX_PLATFORMS": "cpu",
        "OMP_NUM_THREADS": "1",
        "XLA_FLAGS": "--xla_disable_hlo_passes=onednn-matmul-rewriter --xla_cpu_multi_thread_eigen=false",
        "JAX_COMPILATION_CACHE_DIR": str(cache),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "SCRIPT_DIR": str(SCRIPT.parent),
    }


def command(log_dir: Path, steps: int, *extra: str, eval_every: int = 6, log_every: int = 3) -> list[str]:
    return [
        str(PYTHON),
        str(SCRIPT),
        *TINY,
        f"--config.data.num_train={steps * BATCH}",
        f"--config.log_dir={log_dir}",
        f"--eval_every={eval_every}",
        f"--log_every={log_every}",
        *extra,
    ]


def train(log_dir: Path, cache: Path, steps: int, *extra: str, theirs: bool = False) -> str:
    """Train in the authors' venv with our script (or, ``theirs``, with their run.py); returns its stderr."""
    cmd = command(log_dir, steps, *extra)
    if theirs:
        cmd[1:2] = ["-c", THEIR_RUN]
    out = subprocess.run(cmd, env=env(cache), capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stderr


def metric_lines(log_dir: Path) -> list[str]:
    """The logged metric lines, less timestamps and the timing field."""
    lines = []
    for line in (log_dir / "event.log").read_text().splitlines():
        message = LOG_PREFIX.sub("", line)
        if message.startswith("step: "):
            lines.append(re.sub(r" \t train_steps_per_sec: [0-9.]+", "", message))
    return lines


def same_state(a: Path, b: Path, cache: Path) -> list[str]:
    """[number of leaves, whether all are bitwise equal] of two pickled ExperimentStates."""
    out = subprocess.run(
        [str(PYTHON), "-c", COMPARE, str(a), str(b)],
        env=env(cache),
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.split()


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """JAX's compilation cache, shared by the tests of this module."""
    return tmp_path_factory.mktemp("jax_cache")


def test_stopped_and_resumed_run_matches_an_uninterrupted_one(tmp_path: Path, cache: Path) -> None:
    straight, resumed, theirs = tmp_path / "straight", tmp_path / "resumed", tmp_path / "theirs"
    train(straight, cache, 24)
    # uninterrupted, our loop logs what their Experiment.run does; their state.pkl is not compared: their main()
    # saves the state it passed to Experiment.run, which does not return the trained one (step 0 is saved)
    train(theirs, cache, 24, theirs=True)
    assert metric_lines(theirs) == metric_lines(straight)
    # 10 is no evaluation step (eval_every 6): the first leg makes exactly 10 updates (logged steps 1..10)
    train(resumed, cache, 24, "--stop_after=10")
    assert metric_lines(resumed)[-1].startswith("step: 10 \ttrain_")
    assert not (resumed / "state.pkl").exists()
    log = train(resumed, cache, 24, "--save_every_minutes=0")  # resume, saving after every step
    assert "Resuming at batch index 10 (step 10)" in log

    lines = metric_lines(straight)
    assert lines == metric_lines(resumed)
    assert [line.split(" \t")[0] for line in lines if "ood_acc" in line] == [f"step: {s}" for s in (1, 7, 13, 19, 24)]
    assert same_state(straight / "state.pkl", resumed / "state.pkl", cache)[1] == "True"  # params, optim, rng, step
    assert "nothing to do" in train(resumed, cache, 24)  # a finished run is left as it is


def test_stop_after_an_evaluation_step_and_on_sigterm(tmp_path: Path, cache: Path) -> None:
    run_dir = tmp_path / "run"
    # stop_after=12 on an evaluation step: loop step 12 runs too, so its evaluation (logged as 13) is in the log
    train(run_dir, cache, 5000, "--stop_after=12")
    lines = metric_lines(run_dir)  # ends: train, test, ood, then the (empty) STEP callback line
    assert lines[-4].startswith("step: 13 \ttrain_") and lines[-2].startswith("step: 13 \tood_acc")

    # SIGTERM mid-run: the step in progress is finished, the state saved, exit 0; the next launch resumes there
    proc = subprocess.Popen(
        command(run_dir, 5000, eval_every=3000, log_every=3), env=env(cache), stderr=subprocess.PIPE, text=True
    )
    # the wait is for an event (step 19 logged); the guard only ends a hang, however slow a busy machine is
    give_up = time.monotonic() + HANG_GUARD_S
    while not any(line.startswith("step: 19 ") for line in metric_lines(run_dir)) and time.monotonic() < give_up:
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, log = proc.communicate(timeout=HANG_GUARD_S)
    assert proc.returncode == 0, log[-3000:]
    stopped_at = int(re.search(r"Signal 15: saved .* at batch index (\d+)", log).group(1))
    assert 19 <= stopped_at < 5000
    log = train(run_dir, cache, 5000, f"--stop_after={stopped_at + 2}")
    assert f"Resuming at batch index {stopped_at} (step {stopped_at})" in log


# The parameters of a state file (resume.pkl: {"state": ExperimentState, ...}), leaf by leaf.
SAME_PARAMS = """
import os, pickle, sys
import numpy as np
sys.path.insert(0, os.environ["SCRIPT_DIR"])
from authors_sraven_resumable import import_their_run
import_their_run()
import jax
a, b = (jax.tree_util.tree_leaves(pickle.load(open(p, "rb"))["state"].params) for p in sys.argv[1:3])
print(len(a), all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b)))
"""


def test_init_seed_swaps_the_initial_state_and_keeps_the_data(tmp_path: Path, cache: Path) -> None:
    # lr 0: the weights stay as initialised, so the stopped states show where each run's weights came from
    swapped, init_4, data_3 = tmp_path / "swapped", tmp_path / "init_4", tmp_path / "data_3"
    still = ("--config.lr=0", "--stop_after=3")
    train(swapped, cache, 12, *still, "--init_seed=4")  # TINY: --config.seed=3
    seed_4 = [a.replace("--config.seed=3", "--config.seed=4") for a in command(init_4, 12, *still)]
    assert "--config.seed=4" in seed_4
    assert subprocess.run(seed_4, env=env(cache), capture_output=True, timeout=HANG_GUARD_S).returncode == 0
    train(data_3, cache, 12, *still)

    def same_params(a: Path, b: Path) -> bool:
        out = subprocess.run(
            [str(PYTHON), "-c", SAME_PARAMS, str(a / "resume.pkl"), str(b / "resume.pkl")],
            env=env(cache),
            capture_output=True,
            text=True,
            timeout=HANG_GUARD_S,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout.split()[1] == "True"

    assert same_params(swapped, init_4)  # the weights of seed 4 ...
    assert not same_params(swapped, data_3)
    # ... on the problems of seed 3: the same weights score differently than on seed 4's
    assert metric_lines(swapped) != metric_lines(init_4)

    # a resume with another init_seed is refused, naming it
    out = subprocess.run(
        command(swapped, 12, "--init_seed=5"), env=env(cache), capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert out.returncode != 0 and "--init_seed: saved 4, now 5" in out.stderr + out.stdout


def test_their_initial_draw_becomes_our_weights(tmp_path: Path, cache: Path) -> None:
    # the paper's SRAVEN size (import-init maps onto our src/hyla/configs/sraven.yaml model), no training
    dump = tmp_path / "init.npz"
    out = subprocess.run(
        [
            str(PYTHON),
            str(SCRIPT),
            "--config=configs/raven.py:raven_3x3_4features;linear_hypatt",
            "--config.seed=3",
            f"--config.log_dir={tmp_path / 'run'}",
            "--logger=standard",
            f"--dump_init={dump}",
        ],
        env=env(cache),
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert not (tmp_path / "run" / "resume.pkl").exists()  # nothing trained
    weights = tmp_path / "init.safetensors"
    tool = REPO / "lab" / "authors" / "authors_equivalence.py"
    done = subprocess.run(
        [sys.executable, str(tool), "import-init", "--their-init", str(dump), "--out", str(weights)],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    from safetensors.numpy import load_file

    ours, theirs = load_file(str(weights)), dict(np.load(dump))
    assert str(theirs.pop("__mixer__")) == "linear_hypatt"
    sys.path.insert(0, str(tool.parent))
    from authors_equivalence import to_their_layout

    again = to_their_layout(ours, num_layers=4, num_heads=16)
    assert set(again) == set(theirs)
    for k, v in theirs.items():
        np.testing.assert_array_equal(again[k], v, err_msg=k)

    # import-run: the same weights as a run directory of ours, on their split of that seed
    run_dir = tmp_path / "theirs-seed3"
    done = subprocess.run(
        [sys.executable, str(tool), "import-run", "--their-init", str(dump), "--seed", "3", "--out", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    from hyla.train.run.folder import load_trained

    trained = load_trained(run_dir)
    assert trained.config.split_seed == 3 and trained.config.data.heldout_draw == "authors"
    assert trained.weights == "final"
    assert all(np.array_equal(v.numpy(), ours[k]) for k, v in trained.model.state_dict().items())


STATE_LEAVES = """
import os, pickle, sys
import numpy as np
sys.path.insert(0, os.environ["SCRIPT_DIR"])
from authors_sraven_resumable import import_their_run
import_their_run()
import jax
leaves = jax.tree_util.tree_leaves(pickle.load(open(sys.argv[1], "rb"))["state"].params["params"])
np.savez(sys.argv[2], *[np.asarray(x) for x in leaves])
"""


def test_dump_trained_writes_the_params_of_the_state_file(tmp_path: Path, cache: Path) -> None:
    run_dir, dump, leaves = tmp_path / "run", tmp_path / "trained.npz", tmp_path / "leaves.npz"
    train(run_dir, cache, 12, "--stop_after=5")
    logged = metric_lines(run_dir)
    done = subprocess.run(
        command(run_dir, 12, f"--dump_trained={dump}"),
        env=env(cache),
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert metric_lines(run_dir) == logged  # nothing trained, nothing logged
    out = subprocess.run(
        [str(PYTHON), "-c", STATE_LEAVES, str(run_dir / "resume.pkl"), str(leaves)],
        env=env(cache),
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    dumped = dict(np.load(dump))
    assert str(dumped.pop("__mixer__")) == "linear_hypatt"
    want = sorted((a.shape, float(np.abs(a).sum())) for a in np.load(leaves).values())
    assert sorted((a.shape, float(np.abs(a).sum())) for a in dumped.values()) == want
    # trained, not initial: the first five updates moved the weights away from the initial draw
    init = tmp_path / "init.npz"
    subprocess.run(
        command(tmp_path / "fresh", 12, f"--dump_init={init}"), env=env(cache), check=True, timeout=HANG_GUARD_S
    )
    assert any(not np.array_equal(v, np.load(init)[k]) for k, v in dumped.items())
