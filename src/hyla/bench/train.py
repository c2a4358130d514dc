"""``hyla bench train``: training throughput of one run and of R runs stacked in one process.

Times ``train_step`` only (sampling, forward, backward, AdamW; no evaluation or logging) after a
warm-up, with the config of the task (``configs/<task>.yaml``) and the given attention variants.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from hyla.bench import device_label, require_device
from hyla.train.config import load_config
from hyla.train.loop import Trainer
from hyla.train.stacked import StackedTrainer


def _time(step, steps: int, warmup: int, device: str) -> float:
    for _ in range(warmup):
        step()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps


def bench_variant(
    task: str, variant: str, seeds: int, steps: int, warmup: int, device: str, compile_model: bool = False
) -> dict[str, float]:
    overrides = [f"model.attention={variant}", "train.steps=1000000", f"train.compile={str(compile_model).lower()}"]
    with tempfile.TemporaryDirectory() as tmp:
        lone = Trainer(load_config(task, overrides), Path(tmp) / "lone", device=device, quiet=True, progress=False)
        t_lone = _time(lone.train_step, steps, warmup, device)
        lone.close()
        cfgs = [load_config(task, [*overrides, f"seed={s}"]) for s in range(seeds)]
        stacked = StackedTrainer(cfgs, [Path(tmp) / f"s{s}" for s in range(seeds)], device=device, quiet=True)
        t_stacked = _time(stacked.train_step, steps, warmup, device)
    batch = cfgs[0].train.batch_size
    return {
        "lone_steps_per_s": 1 / t_lone,
        "lone_problems_per_s": batch / t_lone,
        "stacked_steps_per_s": 1 / t_stacked,
        "stacked_problems_per_s_total": seeds * batch / t_stacked,
        "stacked_cost_vs_one_run": t_stacked / t_lone,
    }


def run(args: argparse.Namespace) -> int:
    require_device(args.device)
    device_name = device_label(args.device)
    print(f"task={args.task} seeds={args.seeds} steps={args.steps} compile={args.compile} device={device_name}")
    print(
        f"{'variant':10s} {'1 run steps/s':>14s} {'problems/s':>11s} {'R stacked steps/s':>18s} "
        f"{'problems/s (all)':>17s} {'cost vs 1 run':>14s}"
    )
    results = {}
    for v in [x.strip() for x in args.variants.split(",") if x.strip()]:
        r = bench_variant(args.task, v, args.seeds, args.steps, args.warmup, args.device, args.compile)
        results[v] = r
        print(
            f"{v:10s} {r['lone_steps_per_s']:14.2f} {r['lone_problems_per_s']:11.0f} {r['stacked_steps_per_s']:18.2f} "
            f"{r['stacked_problems_per_s_total']:17.0f} {r['stacked_cost_vs_one_run']:13.2f}x"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "device": device_name,
                    "task": args.task,
                    "seeds": args.seeds,
                    "steps": args.steps,
                    "variants": results,
                },
                indent=2,
            )
        )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="training steps/s of one run and of R stacked runs")
    p.add_argument("--task", default="sraven", help="a config name: sraven | fuzzy_logic | ...")
    p.add_argument("--variants", default="hyla")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--compile", action="store_true", help="torch.compile both the lone and the stacked model")
    p.add_argument("--json")
    p.set_defaults(func=run)
