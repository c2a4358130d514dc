"""The C library of hyla's CPU kernels (``hyla_cpu.c`` beside this file: the fused attention and the tanh GELU),
built on first use with the system C compiler and loaded through ctypes.

It is compiled (``cc``/``gcc``/``clang`` with OpenMP; ``HYLA_CC`` overrides) into ``~/.cache/hyla/kernels``
(``HYLA_CACHE_DIR`` overrides), keyed by the source, the flags, the compiler and the CPU; no PyTorch headers,
so it builds in about a second. It is built for the CPU it runs on (``-march=native``); ``HYLA_CPU_MARCH``
names another target (e.g. ``x86-64-v3``). Both the attention kernel and the models' GELU call it, so it sits
below both.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from hyla.runtime import c_compiler, c_compiler_version, cache_dir, cpuinfo_field


class CpuKernelUnavailableError(NotImplementedError):
    """The C library (or a kernel in it) cannot run here or for this case; the message names the cause."""


#: the ops with a ``torch.vmap`` batching rule registered (by the training layer, where stacking lives);
#: an op not in it steps aside inside ``torch.vmap``
BATCHED_OPS: set[str] = set()


SOURCE = Path(__file__).with_name("hyla_cpu.c")
BASE_FLAGS = (
    "-O3", "-fopenmp", "-shared", "-fPIC", "-std=c99",
    # the source vectorizes its sums itself (fixed order); these only let sqrt and the like inline
    "-fno-math-errno", "-fno-trapping-math",
)  # fmt: skip
#: the environment variable naming the ``-march`` target (default ``native``)
MARCH_ENV = "HYLA_CPU_MARCH"
#: the C functions' suffix for each dtype of ``COVERAGE["fused_cpu"]`` (one compiled copy per C type)
DTYPES = {torch.float32: "f32", torch.float64: "f64"}


_LIBRARY: ctypes.CDLL | None = None
_LOAD_ERROR: str | None = None


_compiler = c_compiler  # a module global, so that tests can take the compiler away


def target_march() -> str:
    """The ``-march`` target the kernel is built for: ``HYLA_CPU_MARCH``, default ``native``."""
    return os.environ.get(MARCH_ENV, "").strip() or "native"


def source_digest() -> str:
    """The first 12 hex digits of the kernel source's SHA-256: which version of the kernel a run used."""
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]


def build_flags() -> tuple[str, ...]:
    """The compiler flags: ``BASE_FLAGS`` and the ``-march`` target (``target_march``)."""
    return ("-march=" + target_march(), *BASE_FLAGS)


def _cpu_signature() -> str:
    # the flags decide what -march=native may use
    return cpuinfo_field("flags") or platform.processor() or platform.machine()


def _compile(compiler: str, flags: tuple[str, ...], out_dir: Path) -> Path:
    objects = []
    for real, suffix in (("float", "f32"), ("double", "f64")):
        obj = out_dir / f"{suffix}.o"
        cmd = [compiler, *flags, "-c", f"-DREAL={real}", f"-DSUFFIX={suffix}", str(SOURCE), "-o", str(obj)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr.strip()[-2000:]}")
        objects.append(str(obj))
    built = out_dir / "lib.so"
    done = subprocess.run([compiler, *flags, *objects, "-lm", "-o", str(built)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"linking the CPU kernel failed:\n{done.stderr.strip()[-2000:]}")
    return built


def _build(compiler: str) -> Path:
    version = c_compiler_version(compiler)
    flags = build_flags()
    key = hashlib.sha256(
        "\n".join([SOURCE.read_text(), " ".join(flags), version, _cpu_signature()]).encode()
    ).hexdigest()[:16]
    cache = cache_dir("kernels")
    target = cache / f"hyla_cpu_{key}.so"
    if target.exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    # the one slow first call (tens of seconds on a small CPU): said, so that it is not taken for a hang
    print(f"hyla: compiling the C attention kernel for this CPU once, into {cache} ...", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        try:
            built = _compile(compiler, flags, Path(tmp))
        except RuntimeError:  # e.g. Apple clang has no OpenMP: one thread is still far better than none
            built = _compile(compiler, tuple(f for f in flags if f != "-fopenmp"), Path(tmp))
        os.replace(built, target)  # atomic: concurrent processes never load a half-written library
    return target


def load_library() -> ctypes.CDLL:
    """The compiled kernel (building it on first use); raises CpuKernelUnavailableError if it cannot."""
    global _LIBRARY, _LOAD_ERROR
    if _LIBRARY is not None:
        return _LIBRARY
    if _LOAD_ERROR is None:
        compiler = _compiler()
        if compiler is None:
            _LOAD_ERROR = "no C compiler found (cc, gcc or clang; or set HYLA_CC)"
        else:
            try:
                _LIBRARY = ctypes.CDLL(str(_build(compiler)))
                return _LIBRARY
            except (OSError, RuntimeError) as err:
                _LOAD_ERROR = f"building it failed: {err}"
    raise CpuKernelUnavailableError(f"the fused CPU kernel is unavailable: {_LOAD_ERROR}")


def assume_constant_result(fn: Any) -> Any:
    """What ``torch.compiler.assume_constant_result`` does to ``fn``, without its ``import torch._dynamo``: that
    import is half of the seconds of ``import hyla`` on a CPU, and every ``hyla`` command would pay it.
    ``tests/test_c_kernel.py`` checks that the mark is still the one torch's decorator sets."""
    fn._dynamo_marked_constant = True
    return fn


@assume_constant_result  # torch.compile runs it once while tracing: building is no graph op
def library_problem() -> str:
    """Why the kernel cannot be loaded ("" when it can), building it on first use."""
    try:
        load_library()
    except CpuKernelUnavailableError as err:
        return str(err)
    return ""
