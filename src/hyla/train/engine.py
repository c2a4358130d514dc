"""What the training shell (:mod:`hyla.train.loop`) drives: an engine that trains R runs at once.

Two engines implement :class:`Engine`: :mod:`hyla.train.lone` (one run: DDP, ``torch.compile``, the
MoE auxiliary loss, the whole step as one CUDA graph) and :mod:`hyla.train.stacked` (R runs whose
parameters are rows of one ``R x N`` tensor). The shell owns everything else, written once: the
loop, evaluation, metric flushing, logging, the non-finite check, checkpoints and signals.

An engine's step adds each run's step metrics to :class:`StepSums` on the device, so a step issues
no host synchronization; the shell reads them back only when it logs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import Tensor

from hyla.tasks.base import Task
from hyla.train.checkpoint import TrainingState
from hyla.train.config import ExperimentConfig


@dataclass
class Dist:
    """This process's place in a ``torchrun`` job (rank 0 of 1 without one)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device: str) -> Dist:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1): NCCL on CUDA, gloo on CPU."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device.startswith("cuda"):
        torch.cuda.set_device(local)
    return Dist(dist.get_rank(), dist.get_world_size(), local)


def check_device(device: str) -> None:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda asked for, but no CUDA device is available (allowed here: cpu)")


def autocast(cfg: ExperimentConfig, device: torch.device) -> AbstractContextManager[Any]:
    """bfloat16 autocast when ``train.bf16``, else nothing."""
    if not cfg.train.bf16:
        return nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


@contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """``model`` in eval mode for the block, then in train mode again."""
    model.eval()
    try:
        yield
    finally:
        model.train()


def set_tf32(cfg: ExperimentConfig, device: torch.device) -> None:
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = cfg.train.tf32
        torch.backends.cudnn.allow_tf32 = cfg.train.tf32


class StepSums:
    """Per run, the sums of each (micro-)step's mean ``keys`` (loss and primary metric) since the last
    log, and the first step whose loss was not finite (-1: none yet), as device tensors.

    A step captured as a CUDA graph adds into fixed buffers (:meth:`fix_buffers`); they are then
    zeroed, not dropped, when taken.
    """

    def __init__(self, num_runs: int, keys: tuple[str, ...], device: torch.device) -> None:
        self.num_runs, self.keys, self.device = num_runs, keys, device
        self.sums_R: dict[str, Tensor] = {}
        self.nonfinite_R = torch.full((num_runs,), -1, dtype=torch.long, device=device)
        self.fixed = False

    @torch.no_grad()
    def add(self, means_R: dict[str, Tensor], loss_R: Tensor, next_step: int | Tensor) -> None:
        """Add ``means_R`` (float64, one per run); flag runs whose ``loss_R`` is not finite with ``next_step``."""
        flag_R = torch.where(~torch.isfinite(loss_R) & (self.nonfinite_R < 0), next_step, self.nonfinite_R)
        if self.fixed:
            self.nonfinite_R.copy_(flag_R)
            for k, v_R in means_R.items():
                self.sums_R[k].add_(v_R)
        else:
            self.nonfinite_R = flag_R
            for k, v_R in means_R.items():
                self.sums_R[k] = self.sums_R[k] + v_R if k in self.sums_R else v_R

    def fix_buffers(self) -> None:
        zeros_R = torch.zeros(self.num_runs, dtype=torch.float64, device=self.device)
        self.sums_R = {k: self.sums_R.get(k, zeros_R).clone() for k in self.keys}
        self.nonfinite_R = self.nonfinite_R.clone()
        self.fixed = True

    def take(self) -> tuple[list[str], Tensor] | None:
        """(keys, ``R x K`` sums) since the last take, or None if nothing was added; starts anew."""
        if not self.sums_R:
            return None
        keys = sorted(self.sums_R)
        sums_RxK = torch.stack([self.sums_R[k] for k in keys], dim=1)
        if self.fixed:
            for v in self.sums_R.values():
                v.zero_()
        else:
            self.sums_R = {}
        return keys, sums_RxK

    def bad_runs(self) -> list[tuple[int, int]]:
        """(run, step) of every run whose loss was not finite (reads the device)."""
        return [(r, s) for r, s in enumerate(self.nonfinite_R.tolist()) if s >= 0]

    def run_state(self, r: int) -> dict[str, Tensor]:
        return {k: v[r].detach().clone() for k, v in self.sums_R.items()}

    def load(self, per_run: list[dict[str, Tensor]]) -> None:
        keys = set(per_run[0])
        if any(set(p) != keys for p in per_run):
            raise ValueError("the runs' checkpoints hold different metric accumulators")
        loaded = {k: torch.stack([p[k].to(self.device, torch.float64).reshape(()) for p in per_run]) for k in keys}
        if self.fixed:
            for k, v in self.sums_R.items():
                v.copy_(loaded.get(k, torch.zeros_like(v)))
        else:
            self.sums_R = loaded

    def snapshot(self) -> dict[str, Tensor]:
        return {**{k: v.clone() for k, v in self.sums_R.items()}, "_nonfinite": self.nonfinite_R.clone()}

    def restore(self, snap: dict[str, Tensor]) -> None:
        for k, v in self.sums_R.items():
            v.copy_(snap.get(k, torch.zeros_like(v)))
        self.nonfinite_R.copy_(snap["_nonfinite"])


class Engine(Protocol):
    """What the shell needs of an engine training ``num_runs`` runs."""

    cfgs: list[ExperimentConfig]  # the runs' configs, models sized by the task
    task: Task
    device: torch.device
    dist: Dist
    sums: StepSums
    num_runs: int
    world_size: int  # processes a checkpoint of this engine was written by

    def train_step(self, step: int) -> None:
        """0-based step ``step`` of every run: sampling, forward, backward, optimizer, :attr:`sums`."""

    def evaluation(self) -> AbstractContextManager[None]:
        """Eval mode for the block, then train mode again."""

    def eval_forward(self, x: Tensor) -> Tensor:
        """Every run's outputs ``out_RxBxPxO`` on one batch of inputs ``x_Bx...`` (no grad, in eval mode)."""

    def export_run(self, r: int, step: int) -> tuple[dict[str, Tensor], dict[str, Any], dict[str, Tensor]]:
        """Run ``r`` at ``step`` in the lone checkpoint format: (model state, ``torch.optim.AdamW`` state, rng)."""

    def load_run(self, r: int, state: TrainingState) -> None:
        """Put a lone-format checkpoint into run ``r`` (raises ``CheckpointError`` if it does not fit)."""

    def describe(self, names: list[str], steps: int) -> str:
        """The line printed when training starts."""

    def close(self) -> None: ...


def generator_states(gen: torch.Generator, d: Dist) -> dict[str, Tensor]:
    """``data_rank{i}``: the data generator's state on every rank (a collective under DDP)."""
    state = gen.get_state()
    if d.world == 1:
        return {"data_rank0": state}
    states: list[Any] = [None] * d.world
    dist.all_gather_object(states, state.cpu())
    return {f"data_rank{r}": s for r, s in enumerate(states)}
