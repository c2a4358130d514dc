"""``hyla sweep FILE``: a grid of runs you can stop and continue anywhere, recorded in the repository.

A sweep file (``configs/sweeps/*.yaml``, one per paper experiment; format in
:mod:`hyla.train.sweepfile`) names rows x grid x seeds over a base config. Run
``ROW-lr0.001-weight_decay0.1-seed0`` trains into ``ROOT/<sweep name>/<run>/`` (ROOT: ``results/sweeps``):
``config.yaml`` and ``metrics.jsonl`` are the record (committed); ``made_by.jsonl`` says which commit,
machine and device trained which steps and for how long; checkpoints and ``tb/`` stay local
(``.gitignore``). Order: the ``first`` rows, then by grid point, seed and row. A finished run (its
last evaluation written) is never rerun; a stopped one resumes from its checkpoint. Runs that the
stacked trainer can stack (same everything but seed and optimizer hyperparameters, all new) train as
one stack. ``--max-minutes`` stops with checkpoints before the budget ends. ``--jobs K`` trains K runs (or
stacks) at a time in K worker processes that share the cores (each ``cores // K`` threads), each taking the
next run in the order above; a worker's progress goes to ``<run>/train.log``. One ``hyla sweep`` at a time
per record directory: two commands would train the same pending runs.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import multiprocessing
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from hyla.textio import append_jsonl, print_warnings_on_one_line, read_jsonl, rewrite_jsonl
from hyla.train.config import CONFIG_DIR, load_config, parse_override_value
from hyla.train.sweepfile import (
    RECORD_ROOT,
    RunSpec,
    Sweep,
    check_run_configs,
    check_slurm,
    last_step,
    load_sweep,
    run_state,
)

LAUNCHERS = ("local", "slurm", "submitit-local")
#: each run's pieces: one line per piece of training, written when it starts (``ended``, ``to_step`` and
#: ``wall_s`` null) and completed when it ends; a piece killed outright keeps its start line
MADE_BY = "made_by.jsonl"
#: seconds kept free at the end of ``--max-minutes`` for the last checkpoint and evaluation (at most this,
#: at most a tenth of the budget)
BUDGET_MARGIN_S = 30.0


def provenance(device: str) -> dict[str, Any]:
    """Commit, machine and device: what every segment of a run records in ``made_by.jsonl``."""
    from hyla.bench import device_label

    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args], cwd=CONFIG_DIR.parent, capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = bool(git("status", "--porcelain", "--untracked-files=no", "--", "src"))
    return {
        "commit": commit + ("+changes" if dirty else ""),
        "machine": f"{platform.node()} {platform.machine()} {_cpu_model()}".strip(),
        "device": device_label(device),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


# ------------------------------------------------------------------------------ running
def finish_piece_record(path: Path, started: dict[str, Any], finished: dict[str, Any]) -> None:
    """Replace the piece's ``started`` line (the last of ``path``) by ``finished``, atomically; appended
    instead if that line is gone."""
    records = read_jsonl(path) if path.exists() else []
    if records and records[-1] == started:
        records[-1] = finished
    else:
        records.append(finished)
    rewrite_jsonl(path, records)


def plan_groups(specs: list[RunSpec], root: Path) -> list[list[RunSpec]]:
    """``specs`` (all not done) as the groups they train in, in sweep order: new runs that the stacked
    trainer can stack form one group; a stopped run resumes alone."""
    from hyla.train.stacked import stack_groups

    cfgs = [load_config(s.config, list(s.overrides)) for s in specs]
    states = [run_state(root / s.name) for s in specs]
    # only new runs stack: runs stopped at different steps resume one by one
    new = [i for i, st in enumerate(states) if st == "new"]
    groups = [[new[i] for i in g] for g in stack_groups([cfgs[i] for i in new])] if new else []
    groups += [[i] for i, st in enumerate(states) if st == "stopped"]
    groups.sort(key=min)
    return [[specs[i] for i in g] for g in groups]


def train_group(
    group: list[RunSpec],
    root: Path,
    *,
    device: str = "cpu",
    deadline: float | None = None,
    quiet: bool = True,
    stop_requested: Callable[[], bool] | None = None,
) -> list[str]:
    """Train one group of :func:`plan_groups` (a lone run or a stack) until done, ``deadline``
    (``time.monotonic()``) or ``stop_requested()`` (asked after every step; the group then stops with a
    checkpoint); record the piece in each run's ``made_by.jsonl`` as it starts and complete that line as it
    ends; return the names finished."""
    from hyla.train.loop import Trainer

    if deadline is not None and time.monotonic() >= deadline:
        return []
    cfgs = [load_config(s.config, list(s.overrides)) for s in group]
    outs = [root / s.name for s in group]
    resume = run_state(outs[0]) == "stopped"
    made = provenance(device)  # the code that trains, read before it starts (HEAD may move meanwhile)
    t0 = time.monotonic()
    engine = "lone" if len(group) == 1 else "stacked"
    trainer = Trainer(cfgs, outs, engine=engine, device=device, resume=resume, quiet=quiet, progress=not quiet)
    started = {
        **made,
        "ended": None,  # null until the piece ends: one killed outright (SIGKILL) keeps it so
        "from_step": trainer.step,  # the checkpoint's step (the metrics log may end a few steps before it)
        "to_step": None,
        "wall_s": None,
        "stacked_with": len(group),
    }
    trainer.deadline, trainer.stop_requested = deadline, stop_requested
    try:
        for out in outs:
            append_jsonl(out / MADE_BY, started)
        trainer.run()
    finally:
        trainer.close()
        ended = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        finished = {**started, "ended": ended, "to_step": trainer.step, "wall_s": round(time.monotonic() - t0, 1)}
        for out in outs:
            finish_piece_record(out / MADE_BY, started, finished)
    return [s.name for s in group] if trainer.step >= cfgs[0].train.steps else []


def train_runs(
    specs: list[RunSpec],
    root: Path,
    *,
    device: str = "cpu",
    deadline: float | None = None,
    quiet: bool = True,
    jobs: int = 1,
) -> list[str]:
    """Train ``specs`` (all not done) in stacks where possible, ``jobs`` groups at a time; returns the names
    finished now."""
    groups = plan_groups(specs, root)
    if jobs > 1 and len(groups) > 1:
        return _train_in_workers(groups, root, device=device, deadline=deadline, quiet=quiet, jobs=jobs)
    finished: list[str] = []
    for group in groups:
        if deadline is not None and time.monotonic() >= deadline:
            break
        finished += train_group(group, root, device=device, deadline=deadline, quiet=quiet)
    return finished


def worker_threads(jobs: int) -> int:
    """Intra-op threads of each of ``jobs`` workers: the cores shared out, at least one."""
    return max(1, (os.cpu_count() or 1) // jobs)


def wall_seconds(costs: list[float], jobs: int) -> float:
    """When the last of the groups costing ``costs`` seconds ends, ``jobs`` at a time, each started in order
    on the first worker free (what ``--jobs`` does)."""
    free_at = [0.0] * jobs
    for cost in costs:
        first_free = free_at.index(min(free_at))
        free_at[first_free] += cost
    return max(free_at)


#: in a worker process: the sweep's stop event (set by the main process on a signal or a failed group)
_STOP: Any = None


def _worker_init(threads: int, stop: Any) -> None:
    import torch

    from hyla.train.loop import STOP_SIGNALS

    global _STOP
    torch.set_num_threads(threads)
    print_warnings_on_one_line()
    _STOP = stop
    # a signal between groups must not end the worker (the pool would break): it stops the whole sweep;
    # while a group trains, the trainer's own handlers take over (checkpoint, Interrupted)
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda signum, frame: stop.set())


def _train_group_logged(group: list[RunSpec], root: Path, device: str, deadline: float | None) -> list[str]:
    """A worker's task: :func:`train_group`, its progress lines into the first run's ``train.log``;
    nothing once the sweep is stopping."""
    if _STOP is not None and _STOP.is_set():
        return []
    (root / group[0].name).mkdir(parents=True, exist_ok=True)
    with open(root / group[0].name / "train.log", "a") as log, contextlib.redirect_stdout(log):
        stop_requested = _STOP.is_set if _STOP is not None else None
        return train_group(group, root, device=device, deadline=deadline, quiet=True, stop_requested=stop_requested)


def _train_in_workers(
    groups: list[list[RunSpec]], root: Path, *, device: str, deadline: float | None, quiet: bool, jobs: int
) -> list[str]:
    """The groups over ``jobs`` worker processes (spawned: no state shared with this one but a stop event).
    The first error, a SIGTERM or Ctrl-C sets the event: running groups stop with checkpoints after their
    current step, queued ones do not start; then the error (or :class:`Interrupted`) is raised here."""
    from hyla.train.loop import Interrupted

    threads = worker_threads(jobs)
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_worker_init, initargs=(threads, stop))
    received: list[int] = []

    def on_sigterm(signum: int, frame: Any) -> None:
        received.append(signum)
        stop.set()

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    finished: list[str] = []
    error: BaseException | None = None
    try:
        futures = [pool.submit(_train_group_logged, group, root, device, deadline) for group in groups]
        print(f"{len(groups)} groups over {jobs} workers ({threads} threads each); logs: <run>/train.log", flush=True)
        for future in as_completed(futures):  # each as it ends, so "finished" lines come as runs finish
            if future.cancelled():
                continue
            if future.exception() is not None:
                if error is None:
                    error = future.exception()
                    stop.set()
                continue
            names = future.result()
            finished += names
            if names:
                print(f"finished: {', '.join(names)}", flush=True)
    except KeyboardInterrupt:  # Ctrl-C (it reached the workers too)
        received.append(signal.SIGINT)
        stop.set()
    finally:  # waits for the running groups to save and stop
        pool.shutdown(wait=True, cancel_futures=True)
        signal.signal(signal.SIGTERM, previous)
    if received:
        raise Interrupted(received[0])
    if error is not None:
        raise error
    return finished


def estimate_seconds(
    spec: RunSpec, device: str, cache: dict[str, tuple[float, float]], from_step: int = 0, threads: int | None = None
) -> float:
    """Seconds left for a run: measured seconds per step (a few steps after warm-up) and per evaluation,
    times the steps and evaluations it has left. One measurement per architecture (cached), with
    ``threads`` intra-op threads (what a ``--jobs`` worker gets) or torch's current number."""
    import torch

    from hyla.train.loop import Trainer

    cfg = load_config(spec.config, list(spec.overrides))
    arch = json.dumps({k: v for k, v in cfg.to_dict().items() if k not in ("seed", "name", "train")}, sort_keys=True)
    if arch not in cache:
        with tempfile.TemporaryDirectory() as tmp:
            probe = load_config(spec.config, [*spec.overrides, "train.eval_size=512"])
            trainer = Trainer(probe, Path(tmp) / "probe", device=device, quiet=True, progress=False)
            threads_before = torch.get_num_threads()
            torch.set_num_threads(threads or threads_before)
            try:
                for _ in range(2):
                    trainer.train_step()
                trainer.check_finite()
                t0 = time.perf_counter()
                for _ in range(5):
                    trainer.train_step()
                trainer.check_finite()
                per_step = (time.perf_counter() - t0) / 5
                t0 = time.perf_counter()
                trainer.evaluate()
                per_problem = (time.perf_counter() - t0) / (512 * len(trainer.task.splits))
                eval_s = per_problem * cfg.train.eval_size * len(trainer.task.splits)
            finally:
                torch.set_num_threads(threads_before)
                trainer.close()
        cache[arch] = (per_step, eval_s)
    per_step, eval_s = cache[arch]
    t = cfg.train
    evals = math.ceil(t.steps / t.eval_every) - from_step // t.eval_every
    return per_step * (t.steps - from_step) + eval_s * max(evals, 0)


def apply_overrides(sweep: Sweep, items: list[str]) -> None:
    """``--override key=value``: added to every run of ``sweep`` (its config, so a stopped run resumes only
    under the same overrides)."""
    for item in items:
        if "=" not in item:
            raise ValueError(f"--override {item!r} must look like key.sub=value")
        key, raw = item.split("=", 1)
        sweep.overrides[key.strip()] = parse_override_value(item, raw)
    if items:
        check_run_configs(sweep, "--override " + " ".join(items))


def executor_parameters(slurm: dict[str, Any], device: str) -> dict[str, Any]:
    """submitit's parameters for one job from a sweep's ``slurm`` settings (default: 24 h, one GPU on CUDA)."""
    params: dict[str, Any] = {
        "timeout_min": int(slurm.get("time", 24 * 60)),
        "gpus_per_node": int(slurm.get("gpus", 1 if device.startswith("cuda") else 0)),
    }
    if "cpus" in slurm:
        params["cpus_per_task"] = int(slurm["cpus"])
    if "mem_gb" in slurm:
        params["mem_gb"] = slurm["mem_gb"]
    for key in ("partition", "account", "qos"):
        if key in slurm:
            params[f"slurm_{key}"] = slurm[key]  # AutoExecutor passes slurm_* to SLURM only
    return params


def _submit(specs: list[RunSpec], sweep: Sweep, root: Path, launcher: str, device: str, extra: list[str]) -> int:
    """One job per group of :func:`plan_groups` (a stack of a row's runs, or a lone run) through submitit
    (``slurm``: a SLURM job array; ``submitit-local``: local processes), each asking what the sweep's
    ``slurm`` settings say; a preempted or timed-out job is requeued and resumes from its checkpoint."""
    try:
        import submitit
    except ImportError:
        print("hyla sweep: error: --launcher needs submitit (pip install 'hyla[sweep]')", file=sys.stderr)
        return 2
    try:
        executor = submitit.AutoExecutor(
            folder=str(root / "_submitit"), cluster="local" if launcher == "submitit-local" else "slurm"
        )
    except RuntimeError as err:  # e.g. no SLURM here: submitit says what it missed
        print(f"hyla sweep: error: --launcher {launcher}: {err}; use --launcher local here", file=sys.stderr)
        return 2
    executor.update_parameters(name=f"hyla_{sweep.name}", **executor_parameters(sweep.slurm, device))
    groups = plan_groups(specs, root)
    job = GroupJob(str(sweep.path), str(root), device, list(extra))
    jobs = executor.map_array(job, [[s.name for s in group] for group in groups])
    sizes = ", ".join(str(len(g)) for g in groups)
    print(
        f"submitted {len(jobs)} jobs for {len(specs)} runs ({launcher}; runs per job: {sizes}): job ids "
        f"{', '.join(j.job_id for j in jobs)}",
        flush=True,
    )
    if launcher == "submitit-local":
        for j in jobs:
            j.result()
    return 0


class GroupJob:
    """A submitit job: train one group of a sweep's runs (a stack or a lone run), resuming what is stopped.
    submitit calls :meth:`checkpoint` when the job is preempted or times out: the job is requeued as it
    is, and the runs continue from their newest checkpoint (``train.checkpoint_every``)."""

    def __init__(self, sweep_path: str, root: str, device: str, extra: list[str]) -> None:
        self.sweep_path, self.root, self.device, self.extra = sweep_path, root, device, extra

    def __call__(self, run_names: list[str]) -> list[str]:
        sweep = load_sweep(self.sweep_path)
        apply_overrides(sweep, self.extra)
        out_root = Path(self.root)
        specs = [s for s in sweep.runs() if s.name in run_names and run_state(out_root / s.name) != "done"]
        return train_runs(specs, out_root, device=self.device) if specs else []

    def checkpoint(self, run_names: list[str]) -> Any:
        import submitit

        return submitit.helpers.DelayedSubmission(self, run_names)


# ------------------------------------------------------------------------------ command line
def parse_slurm(items: list[str]) -> dict[str, Any]:
    """``--slurm KEY=VALUE`` (repeatable): numbers read as numbers."""
    values: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--slurm {item!r} must look like KEY=VALUE, e.g. partition=gpu or time=240")
        values[key.strip()] = parse_override_value(f"--slurm {item}", raw)
    return values


def comma_list(text: str) -> list[str]:
    """``"a, b,,c"`` as ``["a", "b", "c"]``: the values of ``--only`` and of each ``--where``."""
    return [v.strip() for v in text.split(",") if v.strip()]


def parse_where(items: list[str]) -> dict[str, list[str]]:
    """``--where KEY=V1[,V2...]`` (repeatable) as ``{KEY: [V1, V2, ...]}``; a repeated key adds values."""
    where: dict[str, list[str]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not key.strip() or not comma_list(values):
            raise ValueError(f"--where takes KEY=VALUE[,VALUE...], e.g. train.lr=0.001 or seed=2; got {item!r}")
        where.setdefault(key.strip(), []).extend(comma_list(values))
    return where


def dry_run(name: str, specs: list[RunSpec], states: dict[str, str], root: Path, device: str, jobs: int) -> None:
    """Print each run's state and estimated minutes left, then the total and, with ``jobs`` > 1, the wall
    time of ``--jobs`` (each probe measured with a worker's threads, alone on the machine)."""
    threads = worker_threads(jobs) if jobs > 1 and device == "cpu" else None
    cache: dict[str, tuple[float, float]] = {}
    seconds: dict[str, float] = {}
    pending = [s for s in specs if states[s.name] != "done"]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    print(f"{name}: {len(specs)} runs, {len(specs) - len(pending)} done, {len(pending)} to train ({device})")
    for s in specs:
        if states[s.name] == "done":
            print(f"  {s.name}: done")
            continue
        step = last_step(root / s.name) if states[s.name] == "stopped" else 0
        seconds[s.name] = estimate_seconds(s, device, cache, step, threads)
        print(f"  {s.name}: {states[s.name]} at step {step}, about {seconds[s.name] / 60:.1f} min")
    total = sum(seconds.values())
    print(f"estimated: {total / 60:.1f} min for the {len(pending)} runs left (one after another)")
    if jobs > 1 and pending:
        # a stack costs about its runs one after another on a CPU (results/train_throughput.md)
        costs = [sum(seconds[s.name] for s in group) for group in plan_groups(pending, root)]
        print(
            f"with --jobs {jobs}: about {wall_seconds(costs, jobs) / 60:.1f} min "
            f"({threads or 'all'} threads each; runs sharing the machine each go somewhat slower than measured alone)"
        )
    if load > 0.5 * (os.cpu_count() or 1):
        print(f"note: the machine was busy while measuring (load average {load:.1f}): these are overestimates")


def selected_runs(args: argparse.Namespace) -> tuple[Sweep, list[RunSpec]]:
    """The sweep file with ``--override`` applied and the runs that ``--only`` and ``--where`` keep; bad
    arguments raise ``ValueError`` naming the option."""
    sweep = load_sweep(args.file)
    apply_overrides(sweep, args.override)
    sweep.slurm.update(check_slurm(parse_slurm(args.slurm), "--slurm"))
    specs = sweep.runs(comma_list(args.only) if args.only else None, parse_where(args.where))
    if args.max_minutes is not None and not args.max_minutes > 0:
        raise ValueError(f"--max-minutes must be > 0, got {args.max_minutes}")
    if args.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--device cuda asked for, but no CUDA device is available (allowed here: cpu)")
    return sweep, specs


def run(args: argparse.Namespace) -> int:
    from hyla.train.checkpoint import CheckpointError
    from hyla.train.cli import failure_exit_code
    from hyla.train.loop import Interrupted, NonFiniteLossError

    t_start = time.monotonic()
    try:
        sweep, specs = selected_runs(args)
        root = Path(args.root) / sweep.name
        states = {s.name: run_state(root / s.name) for s in specs}  # reads the records: they may be damaged
        pending = [s for s in specs if states[s.name] != "done"]
        if args.emit_commands:
            for s in pending:
                print(s.command(root / s.name, args.device, resume=states[s.name] == "stopped"))
            return 0
        if args.dry_run:
            dry_run(sweep.name, specs, states, root, args.device, args.jobs)
            return 0
    except (ValueError, CheckpointError) as err:
        print(f"hyla sweep: error: {err}", file=sys.stderr)
        return 2
    if not pending:
        print(f"{sweep.name}: all {len(specs)} runs are done ({root})")
        return 0
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # a file in the way, no permission: the user's --root
        print(f"hyla sweep: error: --root {args.root}: cannot make {root} ({err.strerror})", file=sys.stderr)
        return 2
    if args.launcher != "local":
        return _submit(pending, sweep, Path(args.root) / sweep.name, args.launcher, args.device, args.override)
    deadline = None
    if args.max_minutes is not None:
        deadline = t_start + args.max_minutes * 60 - min(BUDGET_MARGIN_S, 6 * args.max_minutes)
    print(f"{sweep.name}: {len(pending)} of {len(specs)} runs to train into {root}", flush=True)
    try:
        finished = train_runs(
            pending, root, device=args.device, deadline=deadline, quiet=not args.progress, jobs=args.jobs
        )
    except (ValueError, CheckpointError, NonFiniteLossError, Interrupted) as err:
        return failure_exit_code("hyla sweep", err, "(checkpoints saved); run the same command to continue")
    left = len(pending) - len(finished)
    print(
        f"{sweep.name}: {len(finished)} runs finished now, {left} left"
        + (" (time budget reached; run the same command to continue)" if left else "")
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="run a sweep file (configs/sweeps/): resumable, recorded under results/sweeps")
    p.add_argument("file", help="a sweep YAML path or a name in configs/sweeps/ (e.g. table_a1_fuzzy)")
    p.add_argument("--only", metavar="ROWS", help="comma-separated rows to run (default: all)")
    p.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="KEY=V[,V]",
        help="only runs at these grid values or seeds, e.g. --where train.lr=0.001 --where seed=2 (repeatable)",
    )
    p.add_argument("--max-minutes", type=float, metavar="M", help="stop with checkpoints before M minutes pass")
    p.add_argument("--device", default="cpu", help="cpu | cuda (default cpu)")
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="K",
        help="train K runs at a time in K processes sharing the cores (default 1); logs in <run>/train.log",
    )
    p.add_argument("--dry-run", action="store_true", help="list the runs and their estimated cost; train nothing")
    p.add_argument("--emit-commands", action="store_true", help="print one `hyla train` command per pending run")
    p.add_argument("--launcher", default="local", choices=LAUNCHERS, help="local (default) | slurm | submitit-local")
    p.add_argument(
        "--slurm",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="what each job asks of the cluster, over the sweep file's slurm: block "
        "(partition, account, qos, time [min], cpus, mem_gb, gpus)",
    )
    p.add_argument("--root", default=str(RECORD_ROOT), help="where sweep records go (default results/sweeps)")
    p.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="add to every run's config, e.g. train.fast=true on a GPU (repeatable)",
    )
    p.add_argument("--progress", action="store_true", help="progress bars instead of one line per log interval")
    p.set_defaults(func=run)
