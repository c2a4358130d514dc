"""``hyla bench data``: problems per second of the task generators, and SRAVEN's ambiguous fraction.

A measurement draws ``--num`` problems in batches of one batch size (``task.sample``: encoded model
inputs, what training consumes; for SRAVEN also ``sample_problems``: grids, rules and permutations
without the one-hot) and reports the median rate over ``--repeats`` measurements.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from hyla.bench import device_label, positive_ints, require_device, require_writable
from hyla.tasks import make_task, standalone_tasks, task_entry


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def throughput(task_name: str, batch_size: int, num: int, repeats: int, device: str, encode: bool = True) -> float:
    """Median problems/s of drawing ``num`` problems (rounded up to whole batches) in batches of ``batch_size``."""
    task = make_task(task_name)
    gen = torch.Generator(device).manual_seed(0)
    sample: Callable[..., Any] = task.sample if encode else task.sample_problems  # type: ignore[attr-defined]
    calls = max(1, math.ceil(num / batch_size))
    sample(batch_size, "train", gen)  # warm-up: tables copied to the device, allocator primed
    rates = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(calls):
            sample(batch_size, "train", gen)
        _sync(device)
        rates.append(calls * batch_size / (time.perf_counter() - t0))
    return statistics.median(rates)


def run(args: argparse.Namespace) -> int:
    require_device(args.device)
    task_name = args.task.replace("-", "_")
    if task_name not in standalone_tasks():
        raise SystemExit(f"--task {args.task!r} is unknown; allowed values: {', '.join(standalone_tasks())}")
    task = make_task(task_name)
    if args.num < 1 or args.repeats < 1:
        raise SystemExit(f"--num and --repeats must be >= 1, got {args.num} and {args.repeats}")
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = positive_ints("--batch-sizes", args.batch_sizes)
    require_writable("--json", args.json)
    device_name = device_label(args.device)
    result: dict[str, Any] = {
        "device": device_name,
        "task": task_name,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "num": args.num,
        "repeats": args.repeats,
        "problems_per_s": {},
    }
    print(f"{task_name} on {device_name}: {args.num:,} problems per measurement, median of {args.repeats}")
    for bs in sizes:
        rate = throughput(task_name, bs, args.num, args.repeats, args.device)
        result["problems_per_s"][str(bs)] = rate
        line = f"batch {bs:>8d}: {rate:>12,.0f} problems/s (encoded inputs)"
        if hasattr(task, "sample_problems"):  # problems without their encoding: how much the encoding costs
            raw = throughput(task_name, bs, args.num, args.repeats, args.device, encode=False)
            result.setdefault("grids_per_s", {})[str(bs)] = raw
            line += f", {raw:>12,.0f} problems/s (sample_problems: grids, no encoding)"
        print(line)
    if args.ambiguity:
        for criterion in task_entry(task_name).ambiguity_criteria:
            t0 = time.perf_counter()
            frac = task.ambiguous_fraction(args.ambiguity, 0, criterion)
            result[f"ambiguous_fraction_{criterion}"] = frac
            print(
                f"ambiguous fraction ({criterion}, {args.ambiguity:,} training problems, generator seed 0): "
                f"{100 * frac:.2f}% ({time.perf_counter() - t0:.1f} s)"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="task generator throughput (problems/s) and SRAVEN ambiguity")
    p.add_argument("--task", default="sraven", help="sraven | fuzzy_logic")
    p.add_argument("--num", type=int, default=65_536, help="problems per measurement (whole batches)")
    p.add_argument("--batch-sizes", default="128,4096,16384", help="comma-separated batch sizes")
    p.add_argument("--repeats", type=int, default=5, help="measurements per batch size (median reported)")
    p.add_argument("--device", default="cpu", help="cpu | cuda (the generator's device)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument(
        "--ambiguity",
        type=int,
        default=0,
        metavar="N",
        help="also report the ambiguous fraction of N SRAVEN training problems (both criteria)",
    )
    p.add_argument("--json", help="write the results here")
    p.set_defaults(func=run)
