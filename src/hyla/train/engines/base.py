"""What the training shell (``hyla.train.loop``) drives: an engine that trains R runs at once.

``Engine`` is written once for both engines: the setup (device and processes, validation, the runs'
tasks, each with its own held-out split, and model sizes, the compile and ``train.graph_step`` checks, the
data generators and their seeds), the micro-batch loop of a step (gradient accumulation and the step sums),
the step as one CUDA graph (``EngineGraph``) and a run's checkpoint in the lone format. Its two
subclasses give only what differs: ``hyla.train.engines.lone`` (one run: DDP, ``torch.compile``,
``torch.optim.AdamW``) and ``hyla.train.engines.stacked`` (R runs whose parameters are rows of one ``R x N``
tensor, one forward for all, the stacked AdamW). The shell owns everything else, also written once: the
loop, evaluation, metric flushing, logging, the non-finite check, checkpoints and signals.

Step numbering, one convention everywhere: ``step`` is the number of optimizer updates already made (0
before the first; a checkpoint at step N holds the state after N updates). ``train_step(step)`` makes
update ``step + 1`` with the schedule's learning rate ``lr_at(step)``; its metrics are logged at step
``step + 1``, and a non-finite loss in it is flagged as step ``step + 1``. A captured step's
``step_count`` is this ``step`` as a device tensor.

An engine's step adds each run's step metrics to ``StepSums`` on the device, so a step issues
no host synchronization; the shell reads them back only when it logs.
"""

from __future__ import annotations

import math
import os
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from hyla.tasks.base import Batch, Task
from hyla.train.build import build_tasks, sized_config
from hyla.train.config import ExperimentConfig
from hyla.train.engines.fast import (
    StepGraph,
    compile_mode,
    graph_step_unsupported_reason,
    keep_compiled_code_apart,
    uses_cudagraphs,
)
from hyla.train.engines.optim import load_optimizer_state
from hyla.train.run.checkpoint import CheckpointError, TrainingState, restore_generator
from hyla.train.seeds import data_stream_seed


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
    log, and the first update whose loss was not finite (-1: none yet), as device tensors.

    A step captured as a CUDA graph adds into fixed buffers (``fix_buffers``); they are then
    zeroed, not dropped, when taken.
    """

    def __init__(self, num_runs: int, keys: tuple[str, ...], device: torch.device) -> None:
        self.num_runs, self.keys, self.device = num_runs, keys, device
        self.sums_R: dict[str, Tensor] = {}
        self.nonfinite_R = torch.full((num_runs,), -1, dtype=torch.long, device=device)
        self.fixed = False

    @torch.no_grad()
    def add(self, means_R: dict[str, Tensor], loss_R: Tensor, update: int | Tensor) -> None:
        """Add ``means_R`` (float64, one per run); flag runs whose ``loss_R`` is not finite with ``update``
        (the update being made: ``step + 1``)."""
        flag_R = torch.where(~torch.isfinite(loss_R) & (self.nonfinite_R < 0), update, self.nonfinite_R)
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

    def run_sums(self, r: int) -> dict[str, float]:
        """Run ``r``'s sums, for its checkpoint (reads the device; float64, so exactly)."""
        return {k: v[r].item() for k, v in self.sums_R.items()}

    def load(self, per_run: list[dict[str, float]]) -> None:
        """Each run's sums from its checkpoint (``run_sums``)."""
        keys = set(per_run[0])
        if any(set(p) != keys for p in per_run):
            raise ValueError("the runs' checkpoints hold different metric accumulators")
        loaded = {k: torch.tensor([p[k] for p in per_run], dtype=torch.float64, device=self.device) for k in keys}
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


class Engine(ABC):
    """Trains the runs of ``cfgs`` on ``device`` (see the module docstring); ``run_dir`` is where a text
    task finds its saved tokenizer. A subclass builds its models in ``_build`` and gives one
    micro-batch's forward, loss and backward, the optimizer update, the evaluation forward and a run's
    lone model and optimizer; everything else is here."""

    def __init__(self, cfgs: list[ExperimentConfig], device: str, run_dir: Path | None = None) -> None:
        check_device(device)
        self.dist = init_distributed(device)
        self.world_size = self.dist.world  # processes a checkpoint of this engine is written by
        self.device = torch.device(
            f"cuda:{self.dist.local_rank}" if device == "cuda" and self.dist.world > 1 else device
        )
        if cfgs[0].train.batch_size % self.dist.world:
            raise ValueError(
                f"train.batch_size={cfgs[0].train.batch_size} must be divisible by the number of processes "
                f"({self.dist.world}): the global batch is split over them"
            )
        for cfg in cfgs:
            cfg.validate()
        # each run its own held-out split (runs whose split is the same share one task); what the shell asks of
        # ``self.task`` (splits, sizes, loss, metrics) is the same for all of them
        self.tasks, self.task_of = build_tasks(cfgs, run_dir)
        self.task: Task = self.tasks[0]
        self.cfgs = [sized_config(cfg, self.task) for cfg in cfgs]  # the runs' configs, models sized by the task
        self.cfg = self.cfgs[0]
        self.num_runs = len(cfgs)
        t = self.cfg.train
        if t.graph_step:
            reason = graph_step_unsupported_reason(self.device, self.dist.world)
            if reason is not None:
                raise ValueError(f"train.graph_step=true {reason}; allowed values here: false")
        mode = compile_mode(t, self.device, distributed=self.dist.world > 1)  # train.compile / train.fast
        if mode is not None:
            keep_compiled_code_apart()
        if t.graph_step and uses_cudagraphs(mode, self.device):
            mode = "default" if mode == "reduce-overhead" else "max-autotune-no-cudagraphs"  # the whole step is one
        self.compile_mode = mode
        self._cudagraphs = uses_cudagraphs(mode, self.device)
        #: the runs' own attention-dropout generators (a stack's); a lone run draws from the device's default one
        self.dropout_gens: list[torch.Generator] = []
        self._build()
        set_tf32(self.cfg, self.device)
        self.data_gens = [torch.Generator(self.device).manual_seed(self._data_seed(r)) for r in range(self.num_runs)]
        self.sums = StepSums(self.num_runs, ("loss", self.task.primary_metric), self.device)
        #: per run, the global norm of the last update's gradient (a fixed buffer: a captured step writes it)
        self.grad_norm_R = torch.full((self.num_runs,), math.nan, dtype=torch.float64, device=self.device)
        self.graph = self._step_graph() if t.graph_step else None

    # ----------------------------------------------------------------- what an engine gives
    @abstractmethod
    def _build(self) -> None:
        """The models, the optimizer and the forward (the task and the sized configs are set)."""

    @abstractmethod
    def _forward_loss(self, batches: list[Batch]) -> tuple[Tensor, Batch, Tensor]:
        """One micro-batch's forward (under autocast) on each run's ``batches[r]``: (outputs
        ``(R*B) x P x O`` in float32, run-major; the R batches as one; the scalar loss to differentiate)."""

    @abstractmethod
    def _backward(self, loss: Tensor, grads: Tensor | None) -> Tensor | None:
        """Backward of one micro-batch's ``loss``, accumulated onto the previous ones' ``grads``."""

    @abstractmethod
    def _flagged_losses(self, loss: Tensor, means_R: dict[str, Tensor]) -> Tensor:
        """Per run, the loss whose non-finite value stops the run (``loss`` or the metrics' ``means_R``)."""

    @abstractmethod
    def _grad_norm_R(self, grads: Tensor | None) -> Tensor:
        """Per run, the global L2 norm of the accumulated gradient (``grads`` or the parameters' ``.grad``)."""

    @abstractmethod
    def param_norm_R(self) -> Tensor:
        """Per run, the global L2 norm of all parameters now (the authors' code logs both norms)."""

    @abstractmethod
    def _update(self, step: int | Tensor, grads: Tensor | None) -> None:
        """The optimizer's update ``step + 1`` from the accumulated ``grads``."""

    @abstractmethod
    def _step_graph(self) -> EngineGraph:
        """``train.graph_step``'s captured step."""

    @abstractmethod
    def _lone_run(self, r: int, step: int) -> tuple[nn.Module, torch.optim.AdamW]:
        """Run ``r`` after ``step`` updates as a lone run's model and ``torch.optim.AdamW``."""

    def _store_run(self, r: int, model: nn.Module, optimizer: torch.optim.AdamW) -> None:
        """Put the ``_lone_run`` of run ``r``, loaded from a checkpoint, back into the engine (a lone
        run's are the engine's own)."""
        return None

    def _sync(self, last: bool) -> AbstractContextManager[Any]:
        """Around a micro-batch's forward and backward (DDP: all-reduce only after the ``last``)."""
        return nullcontext()

    @abstractmethod
    def evaluation(self) -> AbstractContextManager[None]:
        """Eval mode for the block, then train mode again."""

    @abstractmethod
    def eval_forward(self, x_RxBx: Tensor) -> Tensor:
        """Every run's outputs ``out_RxBxPxO`` on its own inputs ``x_RxBx...`` (no grad, in eval mode)."""

    @abstractmethod
    def describe(self, names: list[str], steps: int) -> str:
        """The line printed when training starts."""

    def close(self) -> None:
        """Release what the engine holds beyond its tensors (nothing yet)."""
        return None

    # ----------------------------------------------------------------- the step
    def train_step(self, step: int) -> None:
        """Update ``step + 1`` of every run (sampling, forward, backward, optimizer, ``sums``); no host
        synchronization."""
        if self.graph is not None:
            self.graph.replay(step)
        else:
            self.step_body(step)

    def step_body(self, step: int | Tensor) -> None:
        """Update ``step + 1``, ``step`` a device tensor inside a captured step: per micro-batch, sampling
        from each run's generator and split, forward, backward and the step sums; then the optimizer."""
        t = self.cfg.train
        accum = t.grad_accum_steps
        size = t.batch_size // self.dist.world // accum
        update = step + 1
        grads: Tensor | None = None
        for micro in range(accum):
            if self._cudagraphs:  # the previous forward's CUDA-graph outputs are no longer needed
                torch.compiler.cudagraph_mark_step_begin()
            batches = [self.tasks[k].sample(size, "train", gen) for k, gen in zip(self.task_of, self.data_gens)]
            with self._sync(last=micro == accum - 1):
                with autocast(self.cfg, self.device):
                    out, batch, loss = self._forward_loss(batches)
                grads = self._backward(loss / accum, grads)
            with torch.no_grad():
                m = self.task.metrics(out.detach(), batch)
                means_R = {k: m[k].double().view(self.num_runs, -1).mean(1) / accum for k in self.sums.keys}
                self.sums.add(means_R, self._flagged_losses(loss, means_R), update)
        with torch.no_grad():
            self.grad_norm_R.copy_(self._grad_norm_R(grads))
        self._update(step, grads)

    # ----------------------------------------------------------------- a run's checkpoint, in the lone format
    def export_run(self, r: int, step: int) -> tuple[dict[str, Tensor], dict[str, Any], dict[str, Tensor]]:
        """Run ``r`` after ``step`` updates: (model state, ``torch.optim.AdamW`` state, rng)."""
        model, optimizer = self._lone_run(r, step)
        # a lone run's dropout draws from the default generator of its device; a stacked run's own takes its place
        rng = {"torch_cpu": torch.get_rng_state()}
        if self.device.type == "cuda":
            rng["torch_cuda"] = torch.cuda.get_rng_state(self.device)
        if self.dropout_gens:
            rng[self._dropout_key] = self.dropout_gens[r].get_state()
        rng.update(generator_states(self.data_gens[r], self.dist))
        return model.state_dict(), optimizer.state_dict(), rng

    def load_run(self, r: int, state: TrainingState) -> None:
        """Put a lone-format checkpoint into run ``r`` (raises ``CheckpointError`` if it does not fit)."""
        model, optimizer = self._lone_run(r, state.step)
        try:
            model.load_state_dict(state.model)
            load_optimizer_state(optimizer, state.optimizer)
        except (RuntimeError, ValueError, KeyError) as err:
            raise CheckpointError(f"checkpoint does not fit this model/optimizer: {err}") from err
        self._store_run(r, model, optimizer)
        rng = state.rng
        data = rng[f"data_rank{self.dist.rank}"].to(torch.uint8)
        restore_generator(self.data_gens[r], data, self._data_seed(r, state.step), f"run {r}'s data stream")
        if self.dropout_gens:
            if self._dropout_key in rng:  # a checkpoint from a CPU continued on CUDA draws anew from here
                self.dropout_gens[r].set_state(rng[self._dropout_key].to(torch.uint8))
            return
        torch.set_rng_state(rng["torch_cpu"].to(torch.uint8))
        if self.device.type == "cuda" and "torch_cuda" in rng:
            torch.cuda.set_rng_state(rng["torch_cuda"].to(torch.uint8), self.device)

    def _data_seed(self, r: int, step: int = 0) -> int:
        """Run ``r``'s data-stream seed on this rank; ``step > 0``: a stream begun anew after ``step`` updates."""
        return data_stream_seed(self.cfgs[r].data_seed, self.dist.rank, restarted_at_step=step)

    @property
    def _dropout_key(self) -> str:
        return "torch_cuda" if self.device.type == "cuda" else "torch_cpu"


class EngineGraph(StepGraph):
    """``train.graph_step``: an engine's whole step (sampling, forward, backward, the optimizer, the step
    sums and the non-finite flags) captured once as one CUDA graph and replayed every step. Subclasses
    write what a step reads from the host into fixed buffers (``_load_step``) and snapshot the state
    their optimizer updates; the generators, the step sums and the default RNGs are handled here."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine.device)
        self.engine = engine

    def replay(self, step: int) -> None:
        """Make update ``step + 1`` of every run; captures the graph on first use."""
        self._load_step(step)
        self._replay(step)

    def _load_step(self, step: int) -> None:
        """Write what update ``step + 1`` reads of the schedule into the buffers the captured step reads."""

    def _snapshot_state(self) -> Any:
        raise NotImplementedError

    def _restore_state(self, snap: Any) -> None:
        raise NotImplementedError

    def _body(self) -> None:
        self.engine.step_body(self.step_count)
        self.step_count.add_(1)

    def _generators(self) -> list[torch.Generator]:
        return [*self.engine.data_gens, *self.engine.dropout_gens]

    def _before_capture(self) -> None:
        self.engine.sums.fix_buffers()

    @torch.no_grad()
    def _snapshot(self) -> dict[str, Any]:
        e = self.engine
        snap = {
            "state": self._snapshot_state(),
            "sums": e.sums.snapshot(),
            "gens": [gen.get_state() for gen in self._generators()],
            "cpu_rng": torch.get_rng_state(),
        }
        if e.device.type == "cuda":  # the default generator, which torch.cuda.graph registers itself
            snap["cuda_rng"] = torch.cuda.get_rng_state(e.device)
        return snap

    @torch.no_grad()
    def _restore(self, snap: dict[str, Any]) -> None:
        e = self.engine
        self._restore_state(snap["state"])
        e.sums.restore(snap["sums"])
        for gen, state in zip(self._generators(), snap["gens"]):
            gen.set_state(state)
        torch.set_rng_state(snap["cpu_rng"])
        if "cuda_rng" in snap:
            torch.cuda.set_rng_state(snap["cuda_rng"], e.device)


def global_norms_R(tensors_Rx: list[Tensor]) -> Tensor:
    """Per run, the L2 norm of all ``tensors_Rx`` together (each ``R x ...``, row r run r's), in float64 as
    ``optax.global_norm``: the norm of the per-tensor norms. The lone and the stacked engine both call this,
    in the model's parameter order, so that a stack logs its lone runs' numbers."""
    norms_RxP = torch.stack(
        [torch.linalg.vector_norm(t.detach().reshape(t.shape[0], -1), dim=1, dtype=torch.float64) for t in tensors_Rx],
        dim=1,
    )
    return torch.linalg.vector_norm(norms_RxP, dim=1)


def generator_states(gen: torch.Generator, d: Dist) -> dict[str, Tensor]:
    """``data_rank{i}``: the data generator's state on every rank (a collective under DDP)."""
    state = gen.get_state()
    if d.world == 1:
        return {"data_rank0": state}
    states: list[Any] = [None] * d.world
    dist.all_gather_object(states, state.cpu())
    return {f"data_rank{r}": s for r, s in enumerate(states)}
