"""The wheel, as a user gets it: built from the repository, installed (not editable) into a fresh venv, and
run from a folder outside the repository. Offline: the build uses this environment's setuptools and the venv
reuses this environment's torch and other dependencies (a ``.pth`` line), so only hyla itself is installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tiny import HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[2]
#: what a build reads besides src/ (pyproject.toml names them)
BUILD_FILES = ("pyproject.toml", "README.md", "LICENSE", "CITATION.cff")
#: the README's tiny-run overrides for the commands below: one small block, 4 steps, evaluated at the end
TINY = [
    "model.num_layers=1",
    "model.emb_dim=16",
    "model.num_heads=2",
    "model.qk_dim=8",
    "model.v_dim=8",
    "model.mlp_dim=32",
    "train.steps=4",
    "train.batch_size=8",
    "train.eval_every=4",
    "train.eval_size=32",
    "train.eval_batch_size=32",
    "train.log_every=4",
    "train.checkpoint_every=4",
]

pytestmark = pytest.mark.packaging


def package_files() -> set[str]:
    """Every file of the package in the repository (``hyla/...``), caches aside: the wheel must hold each."""
    src = ROOT / "src"
    return {
        p.relative_to(src).as_posix()
        for p in (src / "hyla").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from a copy of the repository's sources (a build leaves build/ and egg-info behind)."""
    tmp = tmp_path_factory.mktemp("build")
    source = tmp / "source"
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in BUILD_FILES:
        shutil.copy2(ROOT / name, source / name)
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
    done = subprocess.run([*command, "-w", str(tmp / "dist"), str(source)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    (found,) = (tmp / "dist").glob("hyla-*.whl")
    return found


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with only the wheel installed; its other dependencies are this environment's."""
    env = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    python = env / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index"]
    done = subprocess.run([*install, str(wheel)], env=outside_env(env), capture_output=True, text=True)
    assert done.returncode == 0 and "Successfully installed hyla" in done.stdout, done.stdout + done.stderr
    # only now (else pip would find this environment's hyla installed): torch and the rest from here, after
    # the venv's own site-packages, so that the installed hyla comes first
    (Path(site) / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return env


def outside_env(env: Path) -> dict[str, str]:
    """This process's environment without PYTHONPATH (the repository's src/ must not be seen, nor its
    hyla metadata by pip), with the venv's executables first on PATH."""
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**clean, "PATH": f"{env / 'bin'}{os.pathsep}{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}


def run_in(env: Path, cwd: Path, *args: str) -> str:
    """``args`` run in ``cwd`` under :func:`outside_env`; the output, after asserting success."""
    done = subprocess.run(
        list(args), cwd=cwd, env=outside_env(env), capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert done.returncode == 0, f"{' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_wheel_holds_every_package_file_the_license_and_the_citation(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(package_files() - names)
    assert not missing, f"not in the wheel: {missing[:10]}"
    assert {"hyla/configs/sraven.yaml", "hyla/configs/sweeps/table_a1_fuzzy.yaml"} <= names
    dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
    assert {f"{dist_info}/licenses/LICENSE", f"{dist_info}/licenses/CITATION.cff"} <= names
    metadata = zipfile.ZipFile(wheel).read(f"{dist_info}/METADATA").decode()
    import hyla

    assert f"Version: {hyla.__version__}\n" in metadata and "License-Expression: MIT" in metadata


@pytest.mark.slow
def test_the_installed_commands_run_from_another_folder(venv: Path, tmp_path: Path) -> None:
    """The README's commands, from a folder with nothing of the repository: the packaged configs and
    sweep by name, records under the working folder, and ``hyla.load`` of the run made."""
    hyla = str(venv / "bin" / "hyla")
    run_in(venv, tmp_path, hyla, "train", "sraven", *TINY, "--out", "runs/sraven")
    run_in(venv, tmp_path, hyla, "train", "fuzzy_logic", *TINY, "--out", "runs/fuzzy")
    emitted = run_in(venv, tmp_path, hyla, "sweep", "table_a1_fuzzy", "--emit-commands").splitlines()
    assert len(emitted) == 144 and all(line.startswith("hyla train fuzzy_logic") for line in emitted)
    assert "--out results/sweeps/table_a1_fuzzy/softmax-lr0.001-weight_decay0.1-seed0" in emitted[0]
    code = (
        "import hyla, torch; run = hyla.load('runs/fuzzy'); "
        "print(hyla.__file__); print(run.weights, run.step, run.config.data.task)"
    )
    where, loaded = run_in(venv, tmp_path, str(venv / "bin" / "python"), "-c", code).splitlines()
    assert Path(where).resolve().is_relative_to(venv.resolve()), f"imported {where}, not the installed hyla"
    assert loaded == "final 4 fuzzy_logic"
    assert (tmp_path / "runs" / "sraven" / "model.safetensors").is_file()
    # the demo starts from the package's copy of its record (no lab/tables/ here); 100 steps: its first log
    run_in(
        venv, tmp_path, hyla, "demo", "--steps", "100", "--eval-size", "64", "--variants", "softmax", "--out", "demo"
    )
    assert "softmax" in (tmp_path / "demo" / "report.md").read_text()


def test_a_users_yaml_wins_over_a_packaged_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hyla.train.config import CONFIG_DIR, resolve_config_path
    from hyla.train.sweeps import SWEEP_DIR, load_sweep

    monkeypatch.chdir(tmp_path)
    assert resolve_config_path("sraven") == CONFIG_DIR / "sraven.yaml"
    (tmp_path / "sraven").write_text("base: fuzzy_logic.yaml\n")  # a file named like a packaged config
    assert resolve_config_path("sraven") == Path("sraven")
    assert load_sweep("table_a1_fuzzy").name == "table_a1_fuzzy" and SWEEP_DIR.is_relative_to(CONFIG_DIR)
    with pytest.raises(ValueError, match=r"config 'nope' not found; give a YAML path or one of: .*sraven"):
        resolve_config_path("nope")
    with pytest.raises(ValueError, match=r"sweep 'nope' not found; give a YAML path or one of: .*table_a1_fuzzy"):
        load_sweep("nope")
