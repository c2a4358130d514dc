"""A sweep's pending runs as the groups they train in, and one group trained as one recorded piece.

The grouping and the engine are the planner's (``hyla.train.sweeps``, shared with ``hyla train``); the
run directories' states and ``made_by.jsonl`` are ``hyla.train.run.folder``'s. Here: what a piece records
(commit, machine, device, on CPU what decides how its sums round, steps, wall time) and the training of one
group until done, a deadline or a stop. A run whose loss becomes NaN/inf is recorded as failed (its piece says
why) and skipped by later sweeps unless retried; its group's other runs stay resumable.
"""

from __future__ import annotations

import contextlib
import datetime
import platform
import shlex
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hyla import cpu
from hyla.ops import gelu, moe
from hyla.ops.clib import MARCH_ENV, source_digest, target_march
from hyla.runtime import cpu_model, cpuinfo_field
from hyla.train.config import RESUMABLE_CHANGES, ExperimentConfig
from hyla.train.run.checkpoint import CheckpointError, checkpoint_step, latest_checkpoint
from hyla.train.run.folder import METRICS, finish_piece_record, read_pieces, run_state, start_piece_record
from hyla.train.run.lock import FolderLock
from hyla.train.sweeps import RunSpec, engine_for, plan_groups

#: the checkout this code runs from (this file is its src/hyla/sweep/groups.py), whose commit a piece records
SOURCE_ROOT = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class Group:
    """Runs that train together (a stack, or a lone run), their loaded configs, and the step of the checkpoint
    they resume from (``None``: they start from scratch)."""

    specs: tuple[RunSpec, ...]
    cfgs: tuple[ExperimentConfig, ...]
    resume_from: int | None

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.specs]

    @property
    def resume(self) -> bool:
        return self.resume_from is not None


def states_and_pending(specs: list[RunSpec], root: Path) -> tuple[dict[str, str], list[RunSpec]]:
    """Each run's state by name (``hyla.train.run.folder.run_state`` of ``root/NAME``: ``done``, ``stopped`` or
    ``new``) and the runs not done, in ``specs``' order. Reads the records, which may be damaged
    (``hyla.train.run.checkpoint.CheckpointError``)."""
    states = {s.name: run_state(root / s.name) for s in specs}
    return states, [s for s in specs if states[s.name] != "done"]


def failed_runs(specs: list[RunSpec], states: dict[str, str], root: Path) -> dict[str, str]:
    """The runs not done whose last piece failed (its loss became NaN/inf), by name: why, as that piece says."""
    failed = {}
    for s in specs:
        pieces = read_pieces(root / s.name) if states[s.name] != "done" else []
        if pieces and pieces[-1].get("failed"):
            failed[s.name] = str(pieces[-1]["failed"])
    return failed


class RunsFailed(RuntimeError):
    """Runs whose loss became NaN/inf (``failed``: name -> why), recorded as failed; ``finished``: the runs that
    finished beside them; ``bf16``: whether a failed one trained in bf16."""

    def __init__(self, failed: dict[str, str], finished: list[str] | None = None, bf16: bool = False) -> None:
        super().__init__(f"{len(failed)} runs failed: " + "; ".join(f"{n} ({why})" for n, why in failed.items()))
        self.failed, self.finished, self.bf16 = dict(failed), list(finished or []), bf16

    def __reduce__(self) -> tuple[type, tuple[dict[str, str], list[str], bool]]:  # from a worker process
        return (RunsFailed, (self.failed, self.finished, self.bf16))


def at_or_past(specs: list[RunSpec], states: dict[str, str], root: Path, step: int) -> list[str]:
    """The stopped runs among ``specs`` whose checkpoint is at ``step`` or past it (``--stop-at-step``: nothing
    to train for them)."""
    return [s.name for s in specs if states[s.name] == "stopped" and (checkpoint_step(root / s.name) or 0) >= step]


def plan_sweep(
    specs: list[RunSpec],
    configs: dict[str, ExperimentConfig],
    states: dict[str, str],
    root: Path,
    max_stack: int | None = None,
) -> list[Group]:
    """``specs`` (all not done; ``states`` by name, ``configs`` by name) as the groups they train in, stacks of
    at most ``max_stack`` runs (``hyla.train.sweeps.plan_groups``), the group with the fewest steps left
    first (ties in sweep order): under a time budget, runs near their end finish instead of waiting behind
    new ones."""
    cfgs = [configs[s.name] for s in specs]
    resume_from = [checkpoint_step(root / s.name) if states[s.name] == "stopped" else None for s in specs]
    groups = plan_groups(cfgs, resume_from, max_stack)
    groups.sort(key=lambda g: cfgs[g[0]].train.steps - (resume_from[g[0]] or 0))
    return [Group(tuple(specs[i] for i in g), tuple(cfgs[i] for i in g), resume_from[g[0]]) for g in groups]


def provenance(device: str, *, mixture_of_experts: bool = False) -> dict[str, Any]:
    """Commit, machine and device: what every piece of a run records in ``made_by.jsonl`` (of a model with MoE
    layers also how a CPU computes their experts)."""
    from hyla.bench import device_label

    def git(*args: str) -> str:
        if not (SOURCE_ROOT / ".git").exists():  # an installed wheel: no commit to name (not the cwd's repository)
            return ""
        try:
            return subprocess.run(
                ["git", *args], cwd=SOURCE_ROOT, capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = bool(git("status", "--porcelain", "--untracked-files=no", "--", "src"))
    made = {
        "commit": commit + ("+changes" if dirty else ""),
        "machine": f"{platform.node()} {platform.machine()} {cpu_model()}".strip(),
        "device": device_label(device),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    made["cpu"] = cpu_identity()
    made["versions"] = software_versions(device)
    made["command"] = shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])
    if device == "cpu":  # what decides how a CPU run's sums round, so a retrain can pin both
        made["cpu_capability"] = torch.backends.cpu.get_cpu_capability()  # PyTorch's kernels (ATEN_CPU_CAPABILITY)
        made["kernel_march"] = target_march()  # the C kernel's -march
        made["kernel_source"] = source_digest()  # and its version: a new kernel may sum in another order
        made["blas"] = cpu.blas_path()  # which library's kernels sum the matrix products (hyla.cpu)
        made["gelu"] = gelu.gelu_path()  # what computes a tanh GELU: the C kernel or torch
        if mixture_of_experts:
            made["moe"] = moe.moe_path()  # every expert on every token, or each on its routed tokens
    return made


def cpu_identity() -> str:
    """The CPU's model name with its family and model numbers: one name ("AMD EPYC") covers generations that
    round alike only on some instruction sets (Zen 3 without AVX-512, Zen 5 with it)."""
    family, model = cpuinfo_field("cpu family"), cpuinfo_field("model")
    return cpu_model() + (f" (family {family}, model {model})" if family and model else "")


def software_versions(device: str) -> dict[str, str | None]:
    """Python, torch, CUDA and the GPU driver (None off a GPU, or where the driver does not say)."""
    versions: dict[str, str | None] = {"python": platform.python_version(), "torch": torch.__version__}
    versions["cuda"] = torch.version.cuda if not device.startswith("cpu") else None
    driver = None
    with contextlib.suppress(OSError):  # the NVIDIA kernel module says its version here on Linux
        words = Path("/proc/driver/nvidia/version").read_text().split()
        driver = next((w for w in words if w[:1].isdigit() and "." in w), None)
    versions["driver"] = driver if not device.startswith("cpu") else None
    return versions


def piece_settings(cfg: ExperimentConfig) -> dict[str, Any]:
    """The settings of a piece that may differ between pieces of one run and change its numbers' rounding or
    schedule of evaluations: how a step is computed (fast path, graph step, TF32, compile, backend), bf16 and
    the logging, evaluation and checkpoint cadence."""
    values = cfg.to_dict()
    return {key: values[key.split(".")[0]][key.split(".")[1]] for key in (*RESUMABLE_CHANGES, "train.bf16")}


#: what a CPU piece records of how its sums round, and the environment variable that pins each (None: only
#: the code of the earlier piece, e.g. a worktree of its commit, continues alike)
ROUNDING_SETTINGS: dict[str, str | None] = {
    "cpu_capability": "ATEN_CPU_CAPABILITY",
    "kernel_march": MARCH_ENV,
    "kernel_source": None,
    "blas": cpu.SETTING_ENV,
    "gelu": gelu.SETTING_ENV,
    "moe": moe.SETTING_ENV,
}
#: a recorded value -> the value of its setting that gives it again, where the two differ
PIN_VALUES: dict[str, dict[str, str]] = {
    "blas": {"mkl": "off", "mkl+vendor_override": "on"},
    "gelu": {"torch": "off", "c_kernel": "auto"},
    "moe": {"routed": "auto"},
}
#: what a CPU piece recorded before a setting had its key: the MoE experts were computed densely
RECORDED_BEFORE_KEY: dict[str, str] = {"moe": "dense"}


def rounding_change(run_dir: Path, made: dict[str, Any]) -> str | None:
    """A warning if ``made`` (this piece's ``provenance``) rounds otherwise than the run's last recorded
    piece: results stay valid, but the run no longer retraces bit for bit what one machine would train."""
    pieces = read_pieces(run_dir)
    last = pieces[-1] if pieces else {}
    if str(last.get("device", "")).startswith("cpu"):
        last = {**{k: v for k, v in RECORDED_BEFORE_KEY.items() if k in made}, **last}
    changed = [k for k in ROUNDING_SETTINGS if k in last and k in made and last[k] != made[k]]
    if not changed:
        return None
    was = ", ".join(f"{k}={last[k]}" for k in changed)
    now = ", ".join(f"{k}={made[k]}" for k in changed)
    pins = [
        f"set {ROUNDING_SETTINGS[k]}={PIN_VALUES.get(k, {}).get(last[k], str(last[k]).lower())}"
        for k in changed
        if ROUNDING_SETTINGS[k]
    ]
    if any(ROUNDING_SETTINGS[k] is None for k in changed):
        pins.append(f"train from a worktree of commit {last.get('commit', '?')}")
    pin = " and ".join(pins)
    return f"{run_dir.name}: its last piece ran with {was}, this one with {now}; to continue alike, {pin}"


def saved_step(run_dir: Path) -> int | None:
    """The step of ``run_dir``'s last saved checkpoint (None: none, or unreadable): how far a piece got for good."""
    try:
        return checkpoint_step(run_dir)
    except CheckpointError:
        return None


def drop_unsaved_metrics(run_dir: Path) -> None:
    """A run the sweep trained before that saved no checkpoint (it failed or was killed first) starts afresh: its
    metrics (all past its checkpoint, none, as a resume would drop them) go, so the new piece can begin."""
    if latest_checkpoint(run_dir) is None and (run_dir / METRICS).is_file() and read_pieces(run_dir):
        (run_dir / METRICS).unlink()


def train_group(
    group: Group,
    root: Path,
    *,
    device: str = "cpu",
    deadline: float | None = None,
    quiet: bool = True,
    stop_requested: Callable[[], bool] | None = None,
    stop_at_step: int | None = None,
) -> list[str]:
    """Train one group until done, ``stop_at_step``, ``deadline`` (``time.monotonic()``) or ``stop_requested()``
    (asked after every step; the group then stops with a checkpoint), its run directories locked; record the
    piece in each run's ``made_by.jsonl`` as it starts and complete that line as it ends (``to_step``: its last
    checkpoint); return the names finished. Runs whose loss became NaN/inf are recorded as failed and raise
    ``RunsFailed``."""
    if deadline is not None and time.monotonic() >= deadline:
        return []
    with contextlib.ExitStack() as locks:
        for name in group.names:
            locks.enter_context(FolderLock(root / name, "hyla sweep", "the run directory"))
        return _train_locked_group(group, root, device, deadline, quiet, stop_requested, stop_at_step)


def _train_locked_group(
    group: Group,
    root: Path,
    device: str,
    deadline: float | None,
    quiet: bool,
    stop_requested: Callable[[], bool] | None,
    stop_at_step: int | None,
) -> list[str]:
    from hyla.train.loop import NonFiniteLossError, Trainer

    cfgs, outs = list(group.cfgs), [root / name for name in group.names]
    # the code that trains, read before it starts (HEAD may move meanwhile)
    made = provenance(device, mixture_of_experts=any(cfg.model.moe_experts for cfg in cfgs))
    if not group.resume:
        for out in outs:
            drop_unsaved_metrics(out)
    t0 = time.monotonic()
    trainer = Trainer(
        cfgs,
        outs,
        engine=engine_for(cfgs),
        device=device,
        resume=group.resume,
        stop_at_step=stop_at_step,
        quiet=quiet,
        progress=not quiet,
    )
    started = {
        **made,
        "ended": None,  # null until the piece ends: one killed outright (SIGKILL) keeps it so
        "from_step": trainer.step,  # the checkpoint's step (the metrics log may end a few steps before it)
        "to_step": None,
        "wall_s": None,
        "stacked_with": len(cfgs),
        "settings": piece_settings(cfgs[0]),  # a stack's runs share them (plan_groups stacks only such runs)
    }
    # a resume that changed settings says which, in its run's piece (config.yaml stays as the run was created)
    started_by = {
        out: started | ({"config_changes": c} if (c := trainer.config_changes.get(out)) else {}) for out in outs
    }
    trainer.deadline, trainer.stop_requested = deadline, stop_requested
    for out in outs:
        if (change := rounding_change(out, made)) is not None:
            warnings.warn(change, stacklevel=2)
    failed: dict[str, str] = {}
    bf16 = False
    try:
        for out in outs:
            start_piece_record(out, started_by[out])
        try:
            trainer.run()
        except NonFiniteLossError as err:  # this group's failure, recorded; the sweep goes on with the next
            bad = err.bad or [(r, trainer.step) for r in range(len(outs))]
            failed, bf16 = {group.names[r]: f"loss became NaN/inf at step {step}" for r, step in bad}, err.bf16
    finally:
        trainer.close()
        ended = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        wall_s = round(time.monotonic() - t0, 1)
        for name, out in zip(group.names, outs):
            # only the steps saved count: the next piece continues from the checkpoint, not from trainer.step
            finished = {**started_by[out], "ended": ended, "to_step": saved_step(out), "wall_s": wall_s}
            finish_piece_record(out, started_by[out], finished | ({"failed": failed[name]} if name in failed else {}))
    if failed:
        raise RunsFailed(failed, bf16=bf16)
    return group.names if trainer.step >= cfgs[0].train.steps else []
