"""``hyla bench``: speed and memory measurements (never run by the tests).

Each benchmark is a module here exposing ``register(subparsers)``.
"""

from __future__ import annotations

import argparse
import importlib

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
