"""``hyla bench data``: problems per second of the task generators, and SRAVEN's ambiguous fraction."""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from hyla.bench import device_label, require_device
from hyla.tasks import make_task


def throughput(task_name: str, batch_size: int, repeats: int, device: str, encode: bool = True) -> float:
    """Median problems/s of ``task.sample`` (encoded model inputs) at this batch size."""
    task = make_task(task_name)
    gen = torch.Generator(device).manual_seed(0)
    sample = task.sample if encode or task_name != "sraven" else task.sample_problems  # type: ignore[attr-defined]
    sample(batch_size, "train", gen)  # warm-up
    rates = []
    for _ in range(repeats):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        sample(batch_size, "train", gen)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        rates.append(batch_size / (time.perf_counter() - t0))
    return statistics.median(rates)


def ambiguous_fraction(num: int, seed: int, criterion: str) -> float:
    from hyla.tasks.sraven_ambiguity import is_ambiguous

    task = make_task("sraven")
    grid = task.sample_problems(num, "train", torch.Generator().manual_seed(seed))["grid"]
    return is_ambiguous(task, grid, criterion=criterion).float().mean().item()


def run(args: argparse.Namespace) -> int:
    require_device(args.device)
    device_name = device_label(args.device)
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    result: dict = {
        "device": device_name,
        "task": args.task,
        "torch": torch.__version__,
        "problems_per_s": {},
    }
    print(f"{args.task} on {device_name}")
    for bs in sizes:
        rate = throughput(args.task, bs, args.repeats, args.device)
        result["problems_per_s"][str(bs)] = rate
        line = f"batch {bs:>8d}: {rate:>12,.0f} problems/s (encoded inputs)"
        if args.task == "sraven":
            raw = throughput(args.task, bs, args.repeats, args.device, encode=False)
            result.setdefault("grids_per_s", {})[str(bs)] = raw
            line += f", {raw:>12,.0f} grids/s (no encoding)"
        print(line)
    if args.task == "sraven" and args.ambiguity:
        for criterion in ("any_panel", "paper"):
            frac = ambiguous_fraction(args.ambiguity, 0, criterion)
            result[f"ambiguous_fraction_{criterion}"] = frac
            print(f"ambiguous fraction ({criterion}, {args.ambiguity:,} training problems): {100 * frac:.2f}%")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="task generator throughput (problems/s) and SRAVEN ambiguity")
    p.add_argument("--task", default="sraven", help="sraven | fuzzy_logic")
    p.add_argument("--batch-sizes", default="128,4096,65536")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--ambiguity",
        type=int,
        default=0,
        metavar="N",
        help="also report the ambiguous fraction of N SRAVEN problems (both criteria)",
    )
    p.add_argument("--json")
    p.set_defaults(func=run)
