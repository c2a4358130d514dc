"""``hyla bench train``: training throughput of one run and of R runs stacked in one process.

Times the trainers' own ``train_step`` (sampling on the device, forward, backward, AdamW, the
per-step metric accumulation; no evaluation or logging) after a warm-up, with the task's config
(``hyla/configs/<task>.yaml``) and each given attention variant. Lone and stacked blocks of ``--steps``
steps alternate ``--repeats`` times and the median block is reported, which tempers a shared
machine's load changes (the load average is recorded too). ``--fast`` sets ``train.fast``
(``hyla.train.engines.fast``); ``--time-eval`` also times one evaluation, to project the wall time of
the config's full run; ``--check-syncs`` (CUDA) fails the step on any host synchronization.
On a CPU with at least as many runs as cores the lone step is also timed on one core: how well a
lone run already uses the cores bounds what stacking can save.
``--also-stack-forward`` times stacks of other ``train.stack_forward`` modes in the same rotation.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from hyla.bench import device_label, require_device, require_writable
from hyla.train.config import load_config
from hyla.train.loop import Trainer


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _block(step: Callable[[], None], steps: int, device: str) -> float:
    """Seconds per step over ``steps`` consecutive steps."""
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    return (time.perf_counter() - t0) / steps


def _check_syncs(step: Callable[[], None], device: str) -> str:
    """'none' when a few steps run under ``torch.cuda.set_sync_debug_mode('error')``, else the error."""
    if not device.startswith("cuda"):
        return "not checked (CPU)"
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            step()
        verdict = "none"
    except RuntimeError as err:
        verdict = f"host sync: {str(err).splitlines()[0]}"
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return verdict


def bench_variant(
    task: str,
    variant: str,
    seeds: int,
    steps: int,
    warmup: int,
    repeats: int,
    device: str,
    *,
    fast: bool = False,
    compile_model: bool = False,
    time_eval: bool = False,
    check_syncs: bool = False,
    overrides: list[str] | None = None,
    other_stack_forwards: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Lone vs ``seeds`` stacked runs of ``task`` with ``model.attention=variant``; each of
    ``other_stack_forwards`` (``train.stack_forward`` values) adds a stack timed in the same rotation."""
    for name, value, low in (("seeds", seeds, 1), ("steps", steps, 1), ("warmup", warmup, 0), ("repeats", repeats, 1)):
        if value < low:
            raise ValueError(f"{name} must be >= {low}, got {value}")
    # the setting of the recorded measurements, from when stacks needed runs
    # that share a split and draw no dropout masks: one split, nothing dropped (the paper configs stack too)
    stackable = ["model.attention_dropout=0", "data.split_seed=0"]
    base = [f"model.attention={variant}", f"train.fast={str(fast).lower()}", *stackable, *(overrides or [])]
    if compile_model:
        base.append("train.compile=true")
    full_cfg = load_config(task, base)
    full_steps, eval_every = full_cfg.train.steps, full_cfg.train.eval_every
    bench_overrides = [*base, "train.steps=100000000"]  # the schedule of a long run, never reached
    with tempfile.TemporaryDirectory() as tmp:
        lone = Trainer(
            load_config(task, bench_overrides), Path(tmp) / "lone", device=device, quiet=True, progress=False
        )
        cfgs = [load_config(task, [*bench_overrides, f"seed={s}"]) for s in range(seeds)]
        stacked = Trainer(
            cfgs, [Path(tmp) / f"s{s}" for s in range(seeds)], engine="stacked", device=device, quiet=True
        )

        def stack_of(mode: str) -> Trainer:
            mode_cfgs = [
                load_config(task, [*bench_overrides, f"seed={s}", f"train.stack_forward={mode}"]) for s in range(seeds)
            ]
            outs = [Path(tmp) / mode / f"s{s}" for s in range(seeds)]
            return Trainer(mode_cfgs, outs, engine="stacked", device=device, quiet=True)

        others = {mode: stack_of(mode) for mode in other_stack_forwards}
        for other in others.values():
            for _ in range(warmup):
                other.train_step()
        t_others: dict[str, list[float]] = {mode: [] for mode in others}
        t0 = time.perf_counter()
        for _ in range(warmup):
            lone.train_step()
        _sync(device)
        warm_lone = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(warmup):
            stacked.train_step()
        _sync(device)
        warm_stacked = time.perf_counter() - t0
        t_lone, t_stacked, t_lone_one_core = [], [], []
        cores = torch.get_num_threads()
        # the lone step on one core shows how much of the cores a lone run uses
        time_one_core = device == "cpu" and cores > 1 and seeds >= cores
        for _ in range(repeats):
            t_lone.append(_block(lone.train_step, steps, device))
            t_stacked.append(_block(stacked.train_step, steps, device))
            for mode, other in others.items():
                t_others[mode].append(_block(other.train_step, steps, device))
            if time_one_core:
                torch.set_num_threads(1)
                try:
                    t_lone_one_core.append(_block(lone.train_step, steps, device))
                finally:
                    torch.set_num_threads(cores)
        syncs = {}
        if check_syncs:
            syncs = {"lone": _check_syncs(lone.train_step, device), "stacked": _check_syncs(stacked.train_step, device)}
        eval_lone = eval_stacked = None
        if time_eval:
            _sync(device)
            t0 = time.perf_counter()
            lone.evaluate()
            _sync(device)
            eval_lone = time.perf_counter() - t0
            t0 = time.perf_counter()
            stacked.evaluate()
            _sync(device)
            eval_stacked = time.perf_counter() - t0
        lone.close()
        stacked.close()
        for other in others.values():
            other.close()
    lone_s, stacked_s = statistics.median(t_lone), statistics.median(t_stacked)
    forward_mode = stacked.engine.forward_mode
    batch = cfgs[0].train.batch_size
    n_evals = full_steps // eval_every + (full_steps % eval_every != 0)
    result: dict[str, Any] = {
        "lone_ms_per_step": 1e3 * lone_s,
        "lone_steps_per_s": 1 / lone_s,
        "lone_problems_per_s": batch / lone_s,
        "stacked_ms_per_step": 1e3 * stacked_s,
        "stacked_steps_per_s": 1 / stacked_s,
        "stacked_problems_per_s_per_run": batch / stacked_s,
        "stacked_problems_per_s_total": seeds * batch / stacked_s,
        "stacked_cost_vs_one_run": stacked_s / lone_s,
        "stack_forward": forward_mode,
        "lone_graph_step": lone.cfg.train.graph_step,
        "stacked_graph_step": cfgs[0].train.graph_step,
        "speedup_vs_sequential_runs": seeds * lone_s / stacked_s,
        "lone_block_ms": [1e3 * t for t in t_lone],
        "stacked_block_ms": [1e3 * t for t in t_stacked],
        "warmup_s": {"lone": warm_lone, "stacked": warm_stacked},
        "full_run_steps": full_steps,
        "projected_train_min": {"lone": full_steps * lone_s / 60, "stacked": full_steps * stacked_s / 60},
    }
    if device.startswith("cuda"):  # both trainers were alive together: the stack's peak plus the lone run's
        result["peak_memory_gib_lone_and_stack"] = torch.cuda.max_memory_allocated() / 2**30
    if others:
        result["other_stack_forwards"] = {
            mode: {
                "stacked_ms_per_step": 1e3 * statistics.median(t_others[mode]),
                "stacked_cost_vs_one_run": statistics.median(t_others[mode]) / lone_s,
                "stacked_block_ms": [1e3 * t for t in t_others[mode]],
            }
            for mode in others
        }
    if t_lone_one_core:
        one_core_s = statistics.median(t_lone_one_core)
        result["lone_one_core_ms_per_step"] = 1e3 * one_core_s
        result["lone_one_core_block_ms"] = [1e3 * t for t in t_lone_one_core]
        result["lone_speedup_all_cores_vs_one"] = one_core_s / lone_s
    if syncs:
        result["host_syncs_in_step"] = syncs
    if eval_lone is not None and eval_stacked is not None:
        result["eval_s"] = {"lone": eval_lone, "stacked": eval_stacked}
        result["projected_total_min"] = {
            "lone": (full_steps * lone_s + n_evals * eval_lone) / 60,
            "stacked": (full_steps * stacked_s + n_evals * eval_stacked) / 60,
        }
    return result


def _command(args: argparse.Namespace) -> str:
    """The command line that reproduces this measurement."""
    parts = [
        f"hyla bench train --task {args.task} --variants {args.variants} --seeds {args.seeds} --steps {args.steps}",
        f"--repeats {args.repeats} --warmup {args.warmup} --device {args.device}",
    ]
    parts += [flag for flag, on in (("--fast", args.fast), ("--compile", args.compile)) if on]
    parts += [flag for flag, on in (("--time-eval", args.time_eval), ("--check-syncs", args.check_syncs)) if on]
    parts += [f"--override {o}" for o in args.overrides]
    if args.also_stack_forward:
        parts.append(f"--also-stack-forward {args.also_stack_forward}")
    return " ".join(parts)


def run(args: argparse.Namespace) -> int:
    require_device(args.device)
    require_writable("--json", args.json)
    variants = [x.strip() for x in args.variants.split(",") if x.strip()]
    if not variants:
        raise SystemExit("hyla bench train: error: --variants must name at least one attention variant")
    device_name = device_label(args.device)
    load_before = os.getloadavg()
    print(
        f"task={args.task} seeds={args.seeds} steps={args.steps}x{args.repeats} fast={args.fast} "
        f"compile={args.compile} device={device_name} "
        f"load={load_before[0]:.2f}"
    )
    header = (
        f"{'variant':10s} {'1 run steps/s':>13s} {'problems/s':>10s} | {'stack steps/s':>13s} {'problems/s/run':>14s} "
        f"{'problems/s all':>14s} {'cost vs 1 run':>13s} | {'full run min (1 / stack)':>24s}"
    )
    print(header)
    results: dict[str, Any] = {}
    for v in variants:
        try:
            r = bench_variant(
                args.task,
                v,
                args.seeds,
                args.steps,
                args.warmup,
                args.repeats,
                args.device,
                fast=args.fast,
                compile_model=args.compile,
                time_eval=args.time_eval,
                check_syncs=args.check_syncs,
                overrides=args.overrides,
                other_stack_forwards=tuple(m.strip() for m in args.also_stack_forward.split(",") if m.strip()),
            )
        except ValueError as err:
            print(f"hyla bench train: error: {err}", file=sys.stderr)
            return 2
        except Exception as err:  # a variant that fails (compilation, capture) is recorded; the others still run
            message = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]
            print(f"{v:10s} failed: {message}", flush=True)
            results[v] = {"error": message}
            continue
        results[v] = r
        proj = r.get("projected_total_min", r["projected_train_min"])
        print(
            f"{v:10s} {r['lone_steps_per_s']:13.2f} {r['lone_problems_per_s']:10.0f} | "
            f"{r['stacked_steps_per_s']:13.2f} "
            f"{r['stacked_problems_per_s_per_run']:14.0f} {r['stacked_problems_per_s_total']:14.0f} "
            f"{r['stacked_cost_vs_one_run']:12.2f}x | {proj['lone']:11.1f} / {proj['stacked']:10.1f}",
            flush=True,
        )
        print(
            f"{'':10s} stacked forward: {r['stack_forward']} (train.stack_forward); "
            f"step as one CUDA graph (train.graph_step): {r['lone_graph_step']}"
        )
        if "lone_one_core_ms_per_step" in r:
            print(
                f"{'':10s} lone step on one core {r['lone_one_core_ms_per_step']:.1f} ms vs "
                f"{r['lone_ms_per_step']:.1f} ms on {torch.get_num_threads()} "
                f"({r['lone_speedup_all_cores_vs_one']:.2f}x)"
            )
        for mode, o in r.get("other_stack_forwards", {}).items():
            print(
                f"{'':10s} stack with train.stack_forward={mode}: {1e3 / o['stacked_ms_per_step']:.2f} steps/s, "
                f"{o['stacked_cost_vs_one_run']:.2f}x one run (same rotation)"
            )
        if "host_syncs_in_step" in r:
            print(f"{'':10s} host syncs in train_step: {r['host_syncs_in_step']}")
    load_after = os.getloadavg()
    full_steps = next((r["full_run_steps"] for r in results.values() if "error" not in r), 0)
    print(
        f"full run = the config's train.steps ({full_steps:,})"
        + (" plus its evaluations" if args.time_eval else ", training steps only")
        + f"; load average before/after: {load_before[0]:.2f}/{load_after[0]:.2f}"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "command": _command(args),
                    "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "device": device_name,
                    "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                    "torch": torch.__version__,
                    "load_average_before_after": [load_before[0], load_after[0]],
                    "task": args.task,
                    "seeds": args.seeds,
                    "steps": args.steps,
                    "repeats": args.repeats,
                    "fast": args.fast,
                    "compile": args.compile,
                    "overrides": args.overrides,
                    "variants": results,
                },
                indent=2,
            )
            + "\n"
        )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="training steps/s of one run and of R runs stacked in one process")
    p.add_argument("--task", default="sraven", help="a config name: sraven | fuzzy_logic | ...")
    p.add_argument("--variants", default="hyla", help="comma-separated model.attention values")
    p.add_argument("--seeds", type=int, default=3, help="R, the runs in the stack")
    p.add_argument("--steps", type=int, default=20, help="steps per timed block")
    p.add_argument("--repeats", type=int, default=3, help="timed blocks per trainer (alternating); the median counts")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation, CUDA-graph recording)")
    p.add_argument("--device", default="cpu", help="cpu | cuda")
    p.add_argument("--fast", action="store_true", help="train.fast=true: compile (CUDA graphs on CUDA)")
    p.add_argument("--compile", action="store_true", help="train.compile=true (no CUDA graphs unless --fast)")
    p.add_argument("--time-eval", action="store_true", help="also time one evaluation; project the full run")
    p.add_argument("--check-syncs", action="store_true", help="CUDA: verify train_step makes no host synchronization")
    p.add_argument("--override", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument(
        "--also-stack-forward",
        default="",
        metavar="MODES",
        help="comma-separated train.stack_forward values: more stacks timed in the same rotation (A/B on one machine)",
    )
    p.add_argument("--json", help="write the results (and machine, load, date) to this file")
    p.set_defaults(func=run)
