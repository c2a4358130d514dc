"""Does MKL's vendor check decide its float32 kernels on this CPU? torch.mm at the SRAVEN model's shapes, one
thread, in four processes per round (rounds alternate them): MKL as installed, with hyla's override preloaded
(``mkl_serv_intel_cpu_true`` returns 1, what ``hyla`` does on an AMD CPU), and with the check answering 0 (what
MKL's own check answers on an AMD CPU). On an Intel CPU the first two are the same kernels and the third shows
what the check costs; on an AMD CPU the first and the third are alike and the second is the gain. A fourth
process times the same products on numpy's OpenBLAS (its kernels chosen by instruction set, not vendor): the
limit measured beside MKL's. Its row names the kernels OpenBLAS took (threadpoolctl): a numpy build older than
the CPU may take older ones (on a Zen 5, Haswell's AVX2 kernels); ``OPENBLAS_CORETYPE=SkylakeX`` before the
command times its AVX-512 kernels instead.

    PYTHONPATH=src python benchmarks/speed/mkl_vendor_check.py --rounds 3 > lab/tables/fast_blas_check.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from hyla import cpu
from hyla.runtime import c_compiler, cpu_model, cpuinfo_field

#: (m, k, n) of the SRAVEN model's products (batch 128 x 36 tokens = 4608 rows; width 128, MLP 256) and a square
SHAPES = [(4608, 128, 192), (4608, 128, 256), (4608, 256, 128), (2048, 2048, 2048)]
TIMER = """
import json, sys, time, numpy, torch
torch.set_num_threads(1)
out = {}
for m, k, n in json.loads(sys.argv[1]):
    a, b = torch.randn(m, k), torch.randn(k, n)
    if sys.argv[2] == "numpy":
        a, b = a.numpy(), b.numpy()
    for _ in range(3):
        a @ b
    reps = max(5, int(4e9 / (2 * m * k * n)))
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    out[f"{m}x{k}x{n}"] = 2 * m * k * n * reps / (time.perf_counter() - t0) / 1e9
kernels = None
if sys.argv[2] == "numpy":
    from threadpoolctl import threadpool_info
    kernels = ", ".join(i.get("architecture", "?") for i in threadpool_info() if i["internal_api"] == "openblas")
print(json.dumps({"rates": out, "kernels": kernels}))
"""


def vendor_no_library(folder: Path) -> Path:
    """A library whose ``mkl_serv_intel_cpu_true`` answers 0: MKL's paths for a CPU it does not know."""
    source, built = folder / "no.c", folder / "no.so"
    source.write_text("int mkl_serv_intel_cpu_true(void) { return 0; }\n")
    compiler = c_compiler()
    if compiler is None:
        raise SystemExit("no C compiler found (cc, gcc or clang; or set HYLA_CC)")
    subprocess.run([compiler, "-O2", "-shared", "-fPIC", str(source), "-o", str(built)], check=True)
    return built


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if cpu.torch_blas() != "mkl":
        raise SystemExit(f"torch's BLAS is {cpu.torch_blas()}, not MKL: nothing to measure")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", cpu.TRIED_ENV)}
    with tempfile.TemporaryDirectory() as tmp:
        modes = {
            "as installed": env,
            "override (check says 1)": cpu.preload_environment(env),
            "check says 0": {**env, "LD_PRELOAD": str(vendor_no_library(Path(tmp)))},
            "numpy (OpenBLAS)": env,
        }
        rates: dict[str, dict[str, list[float]]] = {mode: {} for mode in modes}
        kernels: dict[str, str] = {}
        for _ in range(args.rounds):
            for mode, mode_env in modes.items():
                done = subprocess.run(
                    [sys.executable, "-c", TIMER, json.dumps(SHAPES), "numpy" if "numpy" in mode else "torch"],
                    env={**mode_env, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"},
                    capture_output=True,
                    text=True,
                    check=True,
                )
                measured = json.loads(done.stdout)
                for shape, rate in measured["rates"].items():
                    rates[mode].setdefault(shape, []).append(rate)
                if measured["kernels"]:
                    kernels[mode] = measured["kernels"]
    shapes = list(rates["as installed"])
    print(f"CPU: {cpu_model()} ({cpuinfo_field('vendor_id')}); float32 matrix products, one thread, GFLOP/s,")
    print(f"median (min-max) of {args.rounds} rounds, modes alternating within each round\n")
    print("| mode | " + " | ".join(shapes) + " |")
    print("|---|" + "---|" * len(shapes))
    for mode, by_shape in rates.items():
        cells = [f"{statistics.median(v):.0f} ({min(v):.0f}-{max(v):.0f})" for v in by_shape.values()]
        label = f"{mode}, {kernels[mode]} kernels" if mode in kernels else mode
        print(f"| {label} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
