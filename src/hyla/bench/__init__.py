"""``hyla bench``: speed and memory measurements (never run by the tests).

Each benchmark is a module here exposing ``register(subparsers)``.
"""

from __future__ import annotations

import argparse
import importlib
import platform
from pathlib import Path

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
    """Exit with a clear message when the device is no device, or CUDA is asked for but absent."""
    try:
        torch.device(device)
    except RuntimeError:
        raise SystemExit(f"--device {device!r} is not a device; use cpu or cuda") from None
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda asked for, but torch.cuda.is_available() is False")


def positive_ints(option: str, text: str) -> list[int]:
    """``"128,4096"`` as ``[128, 4096]``; anything but comma-separated integers >= 1 exits naming ``option``."""
    try:
        values = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise SystemExit(f"{option} takes comma-separated integers >= 1, e.g. 128,4096; got {text!r}")
    return values


def require_writable(option: str, path: str | None) -> None:
    """Exit before measuring, not after, when an output file cannot be written where ``option`` says."""
    if path is not None and not Path(path).resolve().parent.is_dir():
        raise SystemExit(f"{option} {path}: its folder {Path(path).resolve().parent} does not exist")


def device_label(device: str) -> str:
    """The GPU's name, or the CPU architecture and thread count: what every benchmark records."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name()
    return f"cpu ({platform.machine()}, {torch.get_num_threads()} threads)"
