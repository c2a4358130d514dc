"""MKL's fast kernels on AMD CPUs: the vendor-check override, built, preloaded and recorded.

PyTorch's x86 wheels link Intel MKL, which picks its matrix-product kernels by CPU vendor: on an AMD CPU it
takes code paths far below what the core can do (the SRAVEN step is about 1.6x slower for it on a 2-core
AMD EPYC). MKL asks ``mkl_serv_intel_cpu_true()``, and ``libtorch_cpu`` calls it through its PLT, so a library
loaded before torch that defines it to return 1 gives MKL's best kernels for the CPU's instruction sets; the
PyTorch maintainers document this for their own wheels (pytorch/builder pull request 1245). The model and its
float32 arithmetic stay; only which MKL kernel sums a product changes, as between two CPUs.

The ``hyla`` command applies it by itself (``reexec_with_override``: before its first torch import it
re-executes itself once with the library in ``LD_PRELOAD``, so that workers it starts inherit it); ``import
hyla`` never does, since the library must be loaded before torch. In a script of your own, prepend what
``python -m hyla.cpu`` prints::

    $(python -m hyla.cpu) python train.py     # LD_PRELOAD=~/.cache/hyla/blas/mkl_vendor_override_....so

``SETTING_ENV`` (``HYLA_FAST_BLAS``) decides: ``auto`` (default) applies it on an AMD CPU where torch's BLAS
is MKL, ``on`` wherever torch's BLAS is MKL (on an Intel CPU MKL already takes these kernels: nothing changes),
``off`` never. The library is built with the system C compiler (``hyla.runtime.c_compiler``) into
``~/.cache/hyla/blas`` (``HYLA_CACHE_DIR``); where it cannot be (no compiler, another BLAS, not Linux) the
command goes on as before with one warning line.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

from hyla.runtime import c_compiler, c_compiler_version, cache_dir, cpuinfo_field, env_setting
from hyla.textio import write_text_atomic

#: the environment variable that turns the override on or off
SETTING_ENV = "HYLA_FAST_BLAS"
SETTINGS = ("auto", "on", "off")
#: set by ``reexec_with_override`` on the process it starts: a second try never re-executes again
TRIED_ENV = "HYLA_FAST_BLAS_TRIED"
LIBRARY_PREFIX = "mkl_vendor_override_"
#: the override, and a counter of MKL's calls to it: whether MKL consults it is then a fact a test can read
SOURCE = """\
static long calls = 0;
int mkl_serv_intel_cpu_true(void) { __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED); return 1; }
long hyla_mkl_vendor_override_calls(void) { return __atomic_load_n(&calls, __ATOMIC_RELAXED); }
"""


class FastBlasWarning(UserWarning):
    """The override would help here but could not be set up; training goes on with MKL as installed."""


def setting() -> str:
    """The value of ``SETTING_ENV`` (default ``auto``); a ValueError naming the allowed values if bad."""
    return env_setting(SETTING_ENV, SETTINGS)


def is_amd_cpu() -> bool:
    return cpuinfo_field("vendor_id") == "AuthenticAMD"


def torch_blas() -> str:
    """The BLAS torch was built with (``mkl``, ``open``, ``accelerate``, ...), lower case; ``unknown`` if torch
    does not say. Remembered per torch install (``_torch_blas_record``), so that where torch is not imported
    yet the answer does not import it: the ``hyla`` command decides to re-execute before its first torch import."""
    record = _torch_blas_record()
    if "torch" not in sys.modules and record is not None and record.exists():
        return record.read_text().strip()
    import torch

    found = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    blas = found.group(1).lower() if found else "unknown"
    if record is not None and not record.exists():
        with contextlib.suppress(OSError):  # a read-only cache only costs the next command a torch import
            record.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(record, blas)
    return blas


def _torch_blas_record() -> Path | None:
    """Where ``torch_blas`` remembers the answer for the torch that ``import torch`` would load: a file in
    ``cache_dir("blas")`` named by torch's path, its ``version.py`` (version, commit, CUDA) and the size of its
    CPU library, read without importing torch; None where torch is not found that way."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    try:
        stamp = (root / "version.py").read_bytes()
        cpu_library = next(iter(sorted((root / "lib").glob("libtorch_cpu.*"))), None)
        size = cpu_library.stat().st_size if cpu_library else 0
    except OSError:
        return None
    key = hashlib.sha256(f"{root}\0{size}\0".encode() + stamp).hexdigest()[:16]
    return cache_dir("blas") / f"torch_blas_{key}"


def override_loaded() -> bool:
    """Whether the override library is mapped into this process (preloaded, or loaded before torch)."""
    try:
        return LIBRARY_PREFIX in Path("/proc/self/maps").read_text()
    except OSError:
        return False


def blas_path() -> str:
    """What sums this process's float32 matrix products on the CPU, as ``made_by.jsonl`` records it: ``mkl``,
    ``mkl+vendor_override`` (MKL's kernels for the CPU's instruction sets whatever its vendor) or another BLAS."""
    blas = torch_blas()
    return f"{blas}+vendor_override" if blas == "mkl" and override_loaded() else blas


def wanted() -> bool:
    """Whether ``SETTING_ENV`` asks for the override on this machine (before checking it can be had)."""
    mode = setting()
    return mode == "on" or (mode == "auto" and is_amd_cpu())


def build_library() -> Path:
    """The override library, built on first use into ``cache_dir("blas")`` (atomically: processes starting
    together never load a half-written file); a RuntimeError saying why if it cannot be built."""
    if not sys.platform.startswith("linux"):
        raise RuntimeError(f"LD_PRELOAD is a Linux mechanism (this is {sys.platform})")
    compiler = c_compiler()
    if compiler is None:
        raise RuntimeError("no C compiler found (cc, gcc or clang; or set HYLA_CC)")
    key = hashlib.sha256((SOURCE + c_compiler_version(compiler)).encode()).hexdigest()[:16]
    target = cache_dir("blas") / f"{LIBRARY_PREFIX}{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        source, built = Path(tmp) / "override.c", Path(tmp) / "override.so"
        source.write_text(SOURCE)
        done = subprocess.run(
            [compiler, "-O2", "-shared", "-fPIC", str(source), "-o", str(built)], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {done.stderr.strip()[-500:]}")
        os.replace(built, target)
    return target


def override_library() -> tuple[Path | None, str | None]:
    """(the built override library, None) where it can be applied to a new process here, else (None, why not
    in one line)."""
    if not sys.platform.startswith("linux"):
        return None, f"LD_PRELOAD is a Linux mechanism (this is {sys.platform})"
    blas = torch_blas()
    if blas != "mkl":
        return None, f"torch's BLAS is {blas}, not MKL"
    try:
        return build_library(), None
    except (OSError, RuntimeError) as err:
        return None, f"the override library could not be built: {err}"


def preload_environment(environ: dict[str, str] | None = None, library: Path | None = None) -> dict[str, str]:
    """``environ`` (default ``os.environ``) with the override ``library`` (default: built or found in the
    cache) first in ``LD_PRELOAD``."""
    env = dict(os.environ if environ is None else environ)
    path = str(library or build_library())
    others = [p for p in env.get("LD_PRELOAD", "").split(":") if p and p != path]
    env["LD_PRELOAD"] = ":".join([path, *others])
    return env


def announce_reexec_once(library: Path) -> bool:
    """Say once per cache folder (a marker file there) that the command re-runs itself with the override; True
    if it said so now. Every later command re-runs silently: the line is news only the first time."""
    marker = cache_dir("blas") / "reexec_announced"
    if marker.exists():
        return False
    print(
        f"hyla: on this AMD CPU, each hyla command re-runs itself with LD_PRELOAD={library} so that MKL takes its "
        f"fast kernels ({SETTING_ENV}=off turns this off; the docs' backends page says why). Said once.",
        file=sys.stderr,
    )
    with contextlib.suppress(OSError):  # a read-only cache only means saying it again next time
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    return True


def reexec_with_override(args: list[str]) -> None:
    """Re-execute this process as ``python -m hyla ARGS`` with the override preloaded, if ``wanted`` and
    not loaded yet; return (and go on as installed) where it is not wanted, is loaded, or cannot be set up
    (then with one ``FastBlasWarning``). Call it from the command line's entry only, before any work."""
    if not wanted() or override_loaded():
        return
    if os.environ.get(TRIED_ENV):
        warnings.warn(
            f"{SETTING_ENV}: the override was preloaded but is not mapped; MKL runs as installed",
            FastBlasWarning,
            stacklevel=2,
        )
        return
    library, reason = override_library()
    if library is None:
        warnings.warn(
            f"{SETTING_ENV}: MKL runs as installed ({reason}); {SETTING_ENV}=off silences this",
            FastBlasWarning,
            stacklevel=2,
        )
        return
    env = preload_environment(library=library)
    env[TRIED_ENV] = "1"
    announce_reexec_once(library)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "hyla", *args], env)


def main(argv: list[str] | None = None) -> int:
    """``python -m hyla.cpu [--auto]``: print ``LD_PRELOAD=PATH``, to prepend to a command (nothing where MKL is
    not torch's BLAS, with the reason on stderr). With ``--auto``, print it only where the ``hyla`` command would
    preload it itself (``wanted``: ``SETTING_ENV`` and the CPU's vendor), else nothing, with exit 0."""
    parser = argparse.ArgumentParser(prog="python -m hyla.cpu", description=main.__doc__.splitlines()[0])
    parser.add_argument("--auto", action="store_true", help=f"only where {SETTING_ENV} asks for it on this CPU")
    args = parser.parse_args(argv)
    if args.auto:
        try:
            if not wanted():
                return 0
        except ValueError as err:
            print(f"hyla.cpu: {err}", file=sys.stderr)
            return 2
    library, reason = override_library()
    if library is None:
        print(f"hyla.cpu: nothing to preload: {reason}", file=sys.stderr)
        return 1
    print(f"LD_PRELOAD={preload_environment(library=library)['LD_PRELOAD']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
