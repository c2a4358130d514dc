"""MKL's vendor-check override (hyla.cpu): when it applies, that MKL really consults it, that the command line
preloads it and records it, and that runs resume across it in both directions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import hyla
from hyla import cpu, runtime
from hyla.attention import Attention
from hyla.cli import main
from tiny import tiny_overrides

needs_mkl_and_cc = pytest.mark.skipif(
    not sys.platform.startswith("linux") or runtime.c_compiler() is None or cpu.torch_blas() != "mkl",
    reason="needs Linux, a C compiler and torch built with MKL",
)


def _cpuinfo(tmp_path: Path, vendor: str) -> Path:
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nvendor_id\t: {vendor}\nmodel name\t: a CPU\n")
    return path


@pytest.mark.parametrize(
    ("vendor", "value", "wanted"),
    [
        ("AuthenticAMD", None, True),
        ("AuthenticAMD", "auto", True),
        ("AuthenticAMD", "off", False),
        ("GenuineIntel", None, False),
        ("GenuineIntel", "on", True),
        ("GenuineIntel", " OFF ", False),
    ],
)
def test_wanted_on_amd_by_default_and_as_the_setting_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, vendor: str, value: str | None, wanted: bool
) -> None:
    monkeypatch.setattr(runtime, "CPUINFO", _cpuinfo(tmp_path, vendor))
    if value is None:
        monkeypatch.delenv(cpu.SETTING_ENV, raising=False)
    else:
        monkeypatch.setenv(cpu.SETTING_ENV, value)
    assert cpu.wanted() is wanted


def test_a_bad_setting_is_one_line_naming_the_allowed_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(cpu.SETTING_ENV, "fast")
    with pytest.raises(ValueError, match=r"^HYLA_FAST_BLAS='fast' is not valid; allowed values: auto, on, off$"):
        cpu.setting()
    assert main(["data", "fuzzy-logic", "--split", "train", "--num", "2", "--out", "unused.npz"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "hyla: error: HYLA_FAST_BLAS='fast' is not valid; allowed values: auto, on, off"
    assert not Path("unused.npz").exists()


def test_without_a_compiler_the_command_goes_on_with_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(cpu.SETTING_ENV, "on")
    monkeypatch.delenv(cpu.TRIED_ENV, raising=False)
    monkeypatch.setenv("HYLA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cpu, "c_compiler", lambda: None)
    monkeypatch.setattr(cpu, "torch_blas", lambda: "mkl")
    monkeypatch.setattr(cpu, "override_loaded", lambda: False)

    def no_exec(*args: object) -> None:
        raise AssertionError("re-executed without a library to preload")

    monkeypatch.setattr(os, "execve", no_exec)
    with pytest.warns(cpu.FastBlasWarning, match=r"MKL runs as installed \(.*no C compiler found.*HYLA_FAST_BLAS=off"):
        cpu.reexec_with_override(["train", "x"])
    monkeypatch.setattr(cpu, "torch_blas", lambda: "open")
    with pytest.warns(cpu.FastBlasWarning, match="torch's BLAS is open, not MKL"):
        cpu.reexec_with_override(["train", "x"])
    # the process that was started with it preloaded, where it did not map, does not try again
    monkeypatch.setattr(cpu, "torch_blas", lambda: "mkl")
    monkeypatch.setenv(cpu.TRIED_ENV, "1")
    with pytest.warns(cpu.FastBlasWarning, match="preloaded but is not mapped"):
        cpu.reexec_with_override(["train", "x"])


def test_the_command_decides_before_importing_torch(tmp_path: Path) -> None:
    """``import hyla`` and the command line's module import no torch, and torch's BLAS, once asked, is remembered
    for that torch install: the ``hyla`` command then re-executes with the preload before its first torch import
    (one torch import per command on an AMD CPU, not two)."""
    probe = (
        "import sys, hyla, hyla.cli; from hyla import cpu; before = 'torch' in sys.modules; "
        "blas = cpu.torch_blas(); print(before, blas, 'torch' in sys.modules)"
    )
    env = {**os.environ, "HYLA_CACHE_DIR": str(tmp_path)}

    def run_probe() -> list[str]:
        return subprocess.run(
            [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
        ).stdout.split()

    first, second = run_probe(), run_probe()
    assert first[0] == second[0] == "False"  # nothing imported torch before the question
    assert first[2] == "True" and second[2] == "False"  # asked torch once; the second answer came from the record
    assert first[1] == second[1] == cpu.torch_blas()
    assert [p.name.startswith("torch_blas_") for p in (tmp_path / "blas").iterdir()] == [True]
    # what `import hyla` offers comes from the attention module on first use
    assert hyla.Attention is Attention and {"Attention", "PRESETS", "attention_preset", "load"} <= set(dir(hyla))
    with pytest.raises(AttributeError, match="module 'hyla' has no attribute 'Atention'"):
        _ = hyla.Atention  # type: ignore[attr-defined]


@needs_mkl_and_cc
def test_the_library_is_built_once_into_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYLA_CACHE_DIR", str(tmp_path))
    built = cpu.build_library()
    assert built.parent == tmp_path / "blas" and built.name.startswith(cpu.LIBRARY_PREFIX)
    assert sorted(p.name for p in built.parent.iterdir()) == [built.name]  # no leftovers
    assert cpu.build_library() == built
    env = cpu.preload_environment({"LD_PRELOAD": "/lib/other.so"})
    assert env["LD_PRELOAD"] == f"{built}:/lib/other.so"
    assert cpu.preload_environment(env)["LD_PRELOAD"] == env["LD_PRELOAD"]  # not twice


PROBE = """
import ctypes, json, sys
import torch
from hyla import cpu
torch.set_num_threads(1)
torch.manual_seed(0)
a, b = torch.randn(256, 64), torch.randn(64, 96)
c = a @ b
torch.nn.functional.linear(a, b.T, torch.randn(96)).sum()
calls = None
if cpu.override_loaded():
    lib = ctypes.CDLL([l.split()[-1] for l in open('/proc/self/maps') if cpu.LIBRARY_PREFIX in l][0])
    lib.hyla_mkl_vendor_override_calls.restype = ctypes.c_long
    calls = lib.hyla_mkl_vendor_override_calls()
torch.save(c, sys.argv[1])
print(json.dumps({"loaded": cpu.override_loaded(), "blas": cpu.blas_path(), "calls": calls}))
"""


@needs_mkl_and_cc
@pytest.mark.parametrize(
    ("vendor", "value", "prints"),
    [
        ("AuthenticAMD", None, True),
        ("AuthenticAMD", "off", False),
        ("GenuineIntel", None, False),
        ("GenuineIntel", "on", True),
    ],
)
def test_auto_prints_the_preload_only_where_the_command_would_apply_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    vendor: str,
    value: str | None,
    prints: bool,
) -> None:
    monkeypatch.setattr(runtime, "CPUINFO", _cpuinfo(tmp_path, vendor))
    monkeypatch.setenv("HYLA_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    if value is None:
        monkeypatch.delenv(cpu.SETTING_ENV, raising=False)
    else:
        monkeypatch.setenv(cpu.SETTING_ENV, value)
    assert cpu.main(["--auto"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("LD_PRELOAD=") and cpu.LIBRARY_PREFIX in out if prints else out == ""
    monkeypatch.setenv(cpu.SETTING_ENV, "fast")
    assert cpu.main(["--auto"]) == 2
    assert capsys.readouterr().err.strip() == (
        "hyla.cpu: HYLA_FAST_BLAS='fast' is not valid; allowed values: auto, on, off"
    )


@needs_mkl_and_cc
def test_mkl_consults_the_preloaded_override(tmp_path: Path) -> None:
    """What ``python -m hyla.cpu`` prints, prepended to a command, puts the override where MKL asks it (the
    counter in the library counts MKL's calls): torch's MKL calls the vendor check through its PLT."""
    # no LD_PRELOAD from outside: `make test` preloads the override for the whole suite on an AMD CPU
    env = {key: value for key, value in os.environ.items() if key != "LD_PRELOAD"} | {"HYLA_CACHE_DIR": str(tmp_path)}
    line = subprocess.run(
        [sys.executable, "-m", "hyla.cpu"], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert line.startswith("LD_PRELOAD=") and cpu.LIBRARY_PREFIX in line
    key, _, value = line.partition("=")
    with_it = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "with.pt")],
        env={**env, key: value},
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(with_it.stdout) | {"calls": 0} == {"loaded": True, "blas": "mkl+vendor_override", "calls": 0}
    assert json.loads(with_it.stdout)["calls"] > 0
    without = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "without.pt")], env=env, capture_output=True, text=True, check=True
    )
    assert json.loads(without.stdout) == {"loaded": False, "blas": "mkl", "calls": None}
    product, product_as_installed = torch.load(tmp_path / "with.pt"), torch.load(tmp_path / "without.pt")
    if runtime.cpuinfo_field("vendor_id") == "GenuineIntel":  # MKL's own check says yes: the same kernels
        assert torch.equal(product, product_as_installed)
    else:  # other kernels sum in another order: float32 rounding of 64-term dot products of N(0, 1) terms
        assert (product - product_as_installed).abs().max() < 1e-4 * product_as_installed.abs().max()


@pytest.mark.slow
@needs_mkl_and_cc
def test_the_command_preloads_it_records_it_and_resumes_across_it(tmp_path: Path) -> None:
    """A sweep piece trained with the override (``on``: on an Intel CPU MKL's kernels stay the same) and one
    without continue one run: each piece records its BLAS path, and the change is named with the setting
    that gives the earlier one again."""
    overrides = dict(o.split("=", 1) for o in tiny_overrides(steps=8, every=4, warmup_steps=2))
    spec = {
        "name": "tiny",
        "config": "fuzzy_logic",
        "rows": {"softmax": {"model.attention": "softmax"}},
        "seeds": [0],
        "overrides": {k: yaml.safe_load(v) for k, v in overrides.items()},
    }
    sweep = tmp_path / "tiny.yaml"
    sweep.write_text(yaml.safe_dump(spec))
    env = {**os.environ, "HYLA_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    # the override is built into a fresh cache; the C kernel comes from the suite's (its build has its own test)
    kernels = runtime.cache_dir("kernels")
    kernels.mkdir(parents=True, exist_ok=True)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "kernels").symlink_to(kernels, target_is_directory=True)
    env.pop(cpu.TRIED_ENV, None)
    env.pop("LD_PRELOAD", None)

    def sweep_piece(setting: str, steps: int) -> subprocess.CompletedProcess[str]:
        command = ["sweep", str(sweep), "--root", str(tmp_path / "r"), "--override", f"train.steps={steps}"]
        return subprocess.run(
            [sys.executable, "-m", "hyla", *command],
            env={**env, cpu.SETTING_ENV: setting},
            capture_output=True,
            text=True,
            check=True,
            cwd=tmp_path,
        )

    sweep_piece("on", 4)
    run = tmp_path / "r" / "tiny" / "softmax-seed0"
    # the record then reads as a run stopped at step 4 of 8 (a sweep resumes only what is not done)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["train"]["steps"] = 8
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    second = sweep_piece("off", 8)
    pieces = [json.loads(line) for line in (run / "made_by.jsonl").read_text().splitlines()]
    assert [(p["blas"], p["from_step"], p["to_step"]) for p in pieces] == [
        ("mkl+vendor_override", 0, 4),
        ("mkl", 4, 8),
    ]
    assert "blas=mkl+vendor_override, this one with blas=mkl; to continue alike, set HYLA_FAST_BLAS=on" in second.stderr
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert max(m["step"] for m in metrics) == 8


def test_the_reexecution_is_announced_once_per_cache(monkeypatch: pytest.MonkeyPatch, tmp_path, capsys) -> None:
    from hyla import cpu

    monkeypatch.setenv("HYLA_CACHE_DIR", str(tmp_path))
    library = tmp_path / "blas" / "mkl_vendor_override_x.so"
    assert cpu.announce_reexec_once(library) is True
    said = capsys.readouterr().err
    assert str(library) in said and "HYLA_FAST_BLAS=off" in said
    assert cpu.announce_reexec_once(library) is False and capsys.readouterr().err == ""
