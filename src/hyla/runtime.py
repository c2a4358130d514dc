"""Process-level settings for the ``hyla`` command line (not applied on ``import hyla``), and the facts
about this machine's CPU that records and caches name."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: glibc refuses an mmap threshold above half its heap size (32 MiB on 64-bit)
MMAP_THRESHOLD_BYTES = 32 * 2**20
TRIM_THRESHOLD_BYTES = 2**30
CPUINFO = Path("/proc/cpuinfo")


def tune_cpu_allocator() -> bool:
    """Let glibc's malloc keep and reuse freed blocks of up to 32 MiB instead of unmapping them.

    PyTorch's CPU allocator is plain ``malloc``. By default glibc serves blocks of a few MiB (HYLA's
    ``B x H x Q x K`` score tensors are 10 MiB at SRAVEN sizes) with ``mmap`` or returns them to the
    kernel on ``free``, so every new tensor of that size page-faults on first touch: on the 2-core
    machine that costs about as much as the arithmetic of an elementwise op on it, and a training
    step does dozens. Raising the mmap and trim thresholds keeps
    those blocks in the heap for reuse; the cost is that the process keeps its peak memory instead
    of returning it. Same effect as ``MALLOC_MMAP_THRESHOLD_``/``MALLOC_TRIM_THRESHOLD_`` in the
    environment, or preloading jemalloc/tcmalloc as PyTorch's CPU tuning guide suggests.

    Applies only on Linux with glibc; ``HYLA_TUNE_MALLOC=0`` turns it off. Returns whether it applied.
    """
    if os.environ.get("HYLA_TUNE_MALLOC", "1").lower() in ("0", "false", "no", "off"):
        return False
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl): nothing to tune
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok_mmap = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    ok_trim = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    return bool(ok_mmap and ok_trim)


def env_setting(name: str, allowed: tuple[str, ...]) -> str:
    """The value of the environment variable ``name``, lower case, default ``allowed[0]``; a ValueError naming the
    allowed values if it is another."""
    value = os.environ.get(name, allowed[0]).strip().lower() or allowed[0]
    if value not in allowed:
        raise ValueError(f"{name}={os.environ[name]!r} is not valid; allowed values: {', '.join(allowed)}")
    return value


def cpuinfo_field(name: str) -> str | None:
    """The value on the first ``name`` line of ``CPUINFO`` (``"model name"``, ``"flags"``), or None where there
    is no such line or file (not Linux)."""
    try:
        text = CPUINFO.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return None


def cpu_model() -> str:
    """The CPU's model name, e.g. ``"AMD EPYC 7B13"``; ``platform`` 's guess off Linux."""
    return cpuinfo_field("model name") or platform.processor() or platform.machine()


def c_compiler() -> str | None:
    """The system C compiler that hyla builds its small libraries with: ``HYLA_CC``, else ``cc``, ``gcc`` or
    ``clang``, the first found on ``PATH``; None without one."""
    for name in (os.environ.get("HYLA_CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def c_compiler_version(compiler: str) -> str:
    """``compiler --version``'s output: part of the cache key of what hyla builds with it ("" if it says
    nothing)."""
    return subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout


def cache_dir(kind: str) -> Path:
    """Where hyla caches what it builds (``kind``: ``kernels``, ``blas``): ``HYLA_CACHE_DIR``, default
    ``~/.cache/hyla``, then ``kind``."""
    return Path(os.environ.get("HYLA_CACHE_DIR", Path.home() / ".cache" / "hyla")) / kind


def tensorboard_installed(quiet: bool) -> bool:
    """Whether TensorBoard logs can be written (an extra: the records need none of it); says so if not."""
    import importlib.util

    if importlib.util.find_spec("tensorboard") is not None:
        return True
    if not quiet:
        print("hyla: TensorBoard is not installed, so no tb/ logs (pip install 'hyla[tensorboard]')", flush=True)
    return False
