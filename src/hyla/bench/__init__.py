"""``hyla bench``: speed and memory measurements (never run by the tests).

Each benchmark is a module here exposing ``register(subparsers)``.
"""

from __future__ import annotations

import argparse
import importlib
import platform

import torch

BENCHMARKS: dict[str, str] = {
    "step": "hyla.bench.step",
    "attention": "hyla.bench.attention",
    "train": "hyla.bench.train",
    "data": "hyla.bench.data",
}


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("bench", help="speed and memory benchmarks")
    bench_sub = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    for module_name in BENCHMARKS.values():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name is not None and err.name.startswith("hyla"):
                continue
            raise
        module.register(bench_sub)


def require_device(device: str) -> None:
    """Exit with a clear message when CUDA is asked for but absent."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda asked for, but torch.cuda.is_available() is False")


def device_label(device: str) -> str:
    """The GPU's name, or the CPU architecture and thread count: what every benchmark records."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name()
    return f"cpu ({platform.machine()}, {torch.get_num_threads()} threads)"
