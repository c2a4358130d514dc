"""Several independent runs in one process: R models stacked along a leading run dimension.

``hyla train CONFIG --seeds 0,1,2 --out DIR`` (runs ``DIR/seed0`` ...) and ``--sweep FILE.yaml``
train here. Runs may differ in :data:`STACKABLE_KEYS` (seed, data seed, and the optimizer's
hyperparameters); runs that differ in anything else are split into groups trained one after
another (:func:`stack_groups`). Each run ``r`` of a stack

* is initialized exactly as the lone run with its seed (the R models are built one by one);
* draws its problems from its own generator, seeded as the lone run's, so it sees the same data;
* is updated by AdamW with its own learning-rate schedule and weight decay, with the arithmetic of
  ``torch.optim.AdamW`` (weight decay on the lone model's >= 2-D parameters only);
* writes an ordinary run directory (``config.yaml``, ``metrics.jsonl``, ``tb/``, checkpoints whose
  optimizer state is in ``torch.optim.AdamW``'s format) that ``hyla report`` reads and that
  ``hyla train --resume`` continues, stacked or alone.

On CUDA the forward is ``torch.func.vmap`` over ``functional_call`` of one template model: one call
runs all R models, so a GPU step launches the kernels of one run, each R times wider. On CPU
(``train.stack_forward``, :func:`stack_forward_mode`) each run is a call of the lone model on that
run's row of the parameters, with the lone run's kernels: one after another (``loop``), or each run's
sampling, forward and backward in its own thread with a share of the CPU's cores (``threads``, the
default on a multi-core CPU; on the 2-core machine from 1% slower than ``loop`` to 14% faster, since a
lone run already keeps both cores busy: ``results/train_throughput.md``). Either way the R runs'
parameters are views into one ``R x N`` tensor, so the optimizer is ~8 elementwise kernels for all
parameters of all runs, with per-run learning rates and weight decays as ``R x 1`` tensors read from a
schedule table on the device (no host-to-device copy, no host synchronization per step).
``train.fast`` compiles the vmapped model as for a lone run (:mod:`hyla.train.fast`);
``train.graph_step`` (CUDA) captures the whole stacked step as one CUDA graph
(:class:`StackedStepGraph`).
A stacked run equals its lone run up to floating-point reordering (tests: losses within 1e-4).
"""

from __future__ import annotations

import copy
import json
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from hyla.tasks.base import Batch
from hyla.train.checkpoint import (
    CheckpointError,
    TrainingState,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from hyla.train.config import ExperimentConfig
from hyla.train.fast import StepGraph, compile_mode, graph_step_unsupported_reason, uses_cudagraphs
from hyla.train.loop import (
    NonFiniteLossError,
    build_model,
    build_task,
    drive,
    resume_differences,
)
from hyla.train.optim import build_optimizer, decayed_parameter_names, lr_at
from hyla.train.rundir import append_metrics, check_new_or_resumable, truncate_metrics_after, write_config

#: config keys in which the runs of one stack may differ
STACKABLE_KEYS = (
    "seed",
    "name",
    "train.data_seed",
    "train.lr",
    "train.weight_decay",
    "train.warmup_steps",
    "train.final_lr_fraction",
)
BETA1, BETA2, EPS = 0.9, 0.999, 1e-8  # torch.optim.AdamW's defaults, which the lone trainer uses
SCHEDULE_CHUNK = 4096  # steps of per-run learning rates computed at once and copied to the device


def stack_forward_mode(
    setting: str, device: torch.device | str, *, num_runs: int = 2, fast: bool = False, cpu_threads: int | None = None
) -> str:
    """``train.stack_forward`` resolved for ``device``: ``vmap``, ``loop`` or ``threads``.

    ``auto`` is ``vmap`` on CUDA, where a step of these tiny models is launch-bound and one R times
    wider launch is what pays. On a CPU the step is compute-bound and vmap's batched forms (``bmm``
    for the per-run linear layers) are slower than the lone ones (``results/train_throughput.md``), so
    the runs are called one by one: in parallel threads (``threads``) when there are several runs and
    several cores (``cpu_threads``, default ``torch.get_num_threads()``), else in turn (``loop``;
    also under ``fast``, since ``torch.compile`` is not thread-safe).
    """
    if setting != "auto":
        return setting
    if torch.device(device).type == "cuda":
        return "vmap"
    cores = torch.get_num_threads() if cpu_threads is None else cpu_threads
    return "threads" if num_runs > 1 and cores > 1 and not fast else "loop"


class RunThreads:
    """``count`` worker threads, each running torch ops with ``threads_each`` intra-op threads.

    ``torch.set_num_threads`` is per thread for OpenMP and MKL, but it also sets the process-wide
    default that a thread's first parallel op adopts; so each worker first triggers its own
    initialization, then sets its count, and the caller's count is restored once all workers have.
    """

    def __init__(self, count: int, threads_each: int) -> None:
        if count < 1 or threads_each < 1:
            raise ValueError(f"count and threads_each must be >= 1, got {count} and {threads_each}")
        caller_threads = torch.get_num_threads()
        ready = threading.Barrier(count + 1, timeout=60)  # a worker that fails to start breaks it

        def start() -> None:
            torch.get_num_threads()  # this thread's lazy init, from the process-wide default
            torch.set_num_threads(threads_each)
            ready.wait()

        # a worker blocked in its initializer is not idle, so each submit below starts a new thread
        self._pool = ThreadPoolExecutor(count, thread_name_prefix="hyla-run", initializer=start)
        started = [self._pool.submit(torch.get_num_threads) for _ in range(count)]
        ready.wait()
        self.worker_threads = sorted(f.result() for f in started)
        torch.set_num_threads(caller_threads)

    def map(self, fn: Any, items: list[Any]) -> list[Any]:
        """``[fn(item) for item in items]`` computed in the workers (exceptions re-raised here)."""
        return list(self._pool.map(fn, items))

    def close(self) -> None:
        self._pool.shutdown(wait=True)


# ------------------------------------------------------------------------------ which runs stack
def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def _stack_view(cfg: ExperimentConfig) -> dict[str, Any]:
    """The flat config, with the split seed resolved: runs whose split follows their seed share no task."""
    return {**_flat(cfg.to_dict()), "data.split_seed": cfg.split_seed}


def not_stackable_reason(cfg: ExperimentConfig) -> str | None:
    """Why a run cannot be part of a stack (it is then trained alone), or None."""
    if cfg.data.task == "text":
        return "data.task=text (language-model runs are trained one by one)"
    if cfg.model.moe_experts:
        return "model.moe_experts > 0 (the MoE auxiliary loss is per model)"
    if cfg.model.attention_dropout:
        return "model.attention_dropout > 0 (a stacked run would not draw its lone run's dropout masks)"
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return "launched with torchrun (stacked runs use one process)"
    return None


def check_stackable(cfgs: list[ExperimentConfig]) -> None:
    """Raise ValueError unless the runs can be trained as one stack."""
    if not cfgs:
        raise ValueError("cfgs must hold at least one run")
    reason = not_stackable_reason(cfgs[0])
    if reason:
        raise ValueError(f"these runs cannot be stacked: {reason}")
    base = _stack_view(cfgs[0])
    for cfg in cfgs[1:]:
        other = _stack_view(cfg)
        bad = sorted(k for k in base if base[k] != other[k] and k not in STACKABLE_KEYS)
        if bad:
            raise ValueError(
                f"runs can be stacked only if they differ in {', '.join(STACKABLE_KEYS)}; these differ too: "
                f"{', '.join(bad)} (train them as separate stacks)"
            )


def stack_groups(cfgs: list[ExperimentConfig]) -> list[list[int]]:
    """Indices of ``cfgs`` grouped into stacks (in order of first appearance); a run that cannot be
    stacked at all (:func:`not_stackable_reason`) forms a group of its own."""
    groups: dict[str, list[int]] = {}
    for i, cfg in enumerate(cfgs):
        if not_stackable_reason(cfg):
            groups[f"alone{i}"] = [i]
            continue
        key = json.dumps({k: v for k, v in sorted(_stack_view(cfg).items()) if k not in STACKABLE_KEYS})
        groups.setdefault(key, []).append(i)
    return list(groups.values())


# ------------------------------------------------------------------------------ the trainer
@dataclass
class _Run:
    cfg: ExperimentConfig
    out: Path
    gen: torch.Generator
    writer: Any = None


@dataclass
class _Slot:
    """Where one parameter of the lone model lives in the ``R x N`` parameter tensor."""

    name: str
    offset: int
    numel: int
    shape: torch.Size


def _concat(batches: list[Batch]) -> Batch:
    """The R runs' batches as one batch of R*B problems (run-major)."""
    return Batch(
        torch.cat([b.inputs for b in batches]),
        torch.cat([b.targets for b in batches]),
        {k: torch.cat([b.info[k] for b in batches]) for k in batches[0].info},
    )


class StackedStepGraph(StepGraph):
    """``train.graph_step`` for a stack: all R runs' step (sampling from R generators, the stacked
    forward and backward, the stacked AdamW reading its schedule row on the device, the metric sums)
    as one CUDA graph. The trainer's state is already in fixed buffers (``flat_RxN``, the AdamW
    moments, the schedule table); the metric sums become buffers before capture."""

    def __init__(self, trainer: StackedTrainer) -> None:
        super().__init__(trainer.device)
        self.trainer = trainer

    def replay(self, step: int) -> None:
        """Run step ``step`` (0-based) of every run; captures the graph on first use."""
        self.trainer._load_schedule(step)  # the captured step reads the row of its chunk
        self._replay(step)

    def _body(self) -> None:
        self.trainer._step_body(self.step_count, in_place=True)
        self.step_count.add_(1)

    def _generators(self) -> list[torch.Generator]:
        return [run.gen for run in self.trainer.runs]

    def _before_capture(self) -> None:
        tr = self.trainer
        zeros_R = torch.zeros(tr.num_runs, dtype=torch.float64, device=tr.device)
        keys = ("loss", tr.task.primary_metric)
        tr._acc_R = {k: tr._acc_R.get(k, zeros_R).clone() for k in keys}

    @torch.no_grad()
    def _snapshot(self) -> dict[str, Any]:
        tr = self.trainer
        snap: dict[str, Any] = {
            "tensors": [t.clone() for t in self._state()],
            "gens": [run.gen.get_state() for run in tr.runs],
        }
        if tr.device.type == "cuda":  # the default generator, which torch.cuda.graph registers itself
            snap["cuda_rng"] = torch.cuda.get_rng_state(tr.device)
        return snap

    @torch.no_grad()
    def _restore(self, snap: dict[str, Any]) -> None:
        for t, saved in zip(self._state(), snap["tensors"]):
            t.copy_(saved)
        for run, state in zip(self.trainer.runs, snap["gens"]):
            run.gen.set_state(state)
        if "cuda_rng" in snap:
            torch.cuda.set_rng_state(snap["cuda_rng"], self.trainer.device)

    def _state(self) -> list[Tensor]:
        """Every tensor a step updates in place, in a fixed order."""
        tr = self.trainer
        sums = [tr._acc_R[k] for k in sorted(tr._acc_R)]
        return [tr.flat_RxN, tr.exp_avg_RxN, tr.exp_avg_sq_RxN, tr._nonfinite_R, *sums]


class StackedTrainer:
    """Train ``len(cfgs)`` runs at once; ``out_dirs[r]`` receives run ``r``.

    ``run()`` trains to ``train.steps`` with the lone :class:`~hyla.train.loop.Trainer`'s logging,
    evaluation, checkpointing, ``stop_at_step``, NaN check and signal handling.
    """

    def __init__(
        self,
        cfgs: list[ExperimentConfig],
        out_dirs: list[Path],
        *,
        device: str = "cpu",
        resume: bool = False,
        quiet: bool = False,
        stop_at_step: int | None = None,
    ) -> None:
        if len(cfgs) != len(out_dirs):
            raise ValueError(f"out_dirs must hold one directory per run: {len(cfgs)} runs, {len(out_dirs)} dirs")
        if len({Path(p).resolve() for p in out_dirs}) != len(out_dirs):
            raise ValueError(f"out_dirs must be distinct, got {[str(p) for p in out_dirs]}")
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError("--device cuda asked for, but no CUDA device is available (allowed here: cpu)")
        check_stackable(cfgs)
        self.device = torch.device(device)
        self.quiet, self.stop_at_step = quiet, stop_at_step
        self.deadline: float | None = None
        self.cfg = cfgs[0]
        self.task = build_task(cfgs[0])
        models = [build_model(cfg, self.task).to(self.device) for cfg in cfgs]  # seeds as the lone runs
        for cfg in cfgs:
            cfg.validate()
        num_runs = len(cfgs)
        self.template = copy.deepcopy(models[0])

        # parameters: decayed ones (as in the lone run's optimizer) first, each run's a row of flat_RxN
        named = list(self.template.named_parameters())
        decayed = decayed_parameter_names(self.template, self.cfg.train.weight_decay_mask)
        ordered = [n for n, _ in named if n in decayed] + [n for n, _ in named if n not in decayed]
        shapes = dict(named)
        self.slots: list[_Slot] = []
        offset = 0
        for name in ordered:
            self.slots.append(_Slot(name, offset, shapes[name].numel(), shapes[name].shape))
            offset += shapes[name].numel()
        self.num_decayed = sum(s.numel for s in self.slots if s.name in decayed)
        with torch.no_grad():
            rows = [dict(m.named_parameters()) for m in models]
            self.flat_RxN = torch.stack([torch.cat([r[s.name].reshape(-1) for s in self.slots]) for r in rows])
        self.params: dict[str, nn.Parameter] = {
            s.name: nn.Parameter(self.flat_RxN[:, s.offset : s.offset + s.numel].view(num_runs, *s.shape))
            for s in self.slots
        }
        self._param_list = list(self.params.values())
        self.buffers: dict[str, Tensor] = {
            name: torch.stack([dict(m.named_buffers())[name] for m in models])
            for name, _ in self.template.named_buffers()
        }
        self.exp_avg_RxN = torch.zeros_like(self.flat_RxN)
        self.exp_avg_sq_RxN = torch.zeros_like(self.flat_RxN)
        del models, rows

        self.runs = [
            _Run(cfg, Path(out), torch.Generator(self.device).manual_seed(cfg.data_seed * 1009))
            for cfg, out in zip(cfgs, out_dirs)
        ]
        self.step = 0
        self._n = 0  # steps accumulated into the runs' train metrics since the last log
        self._acc_R: dict[str, Tensor] = {}  # metric -> R sums of per-step means since the last log
        self._nonfinite_R = torch.full((num_runs,), -1, dtype=torch.long, device=self.device)
        self._schedule_chunk = -1
        self._schedule_SxRx3 = torch.empty(0)

        positions = self.task.num_output_positions
        template = self.template

        def one_run(p: dict[str, Tensor], b: dict[str, Tensor], x: Tensor) -> Tensor:
            return functional_call(template, (p, b), (x,), {"last_positions": positions})

        self.forward_mode = stack_forward_mode(
            self.cfg.train.stack_forward, self.device, num_runs=num_runs, fast=self.cfg.train.fast
        )
        if self.forward_mode == "threads" and (self.device.type != "cpu" or self.cfg.train.fast):
            raise ValueError(
                f"train.stack_forward=threads runs eager CPU steps (device {self.device}, train.fast="
                f"{str(self.cfg.train.fast).lower()}); allowed values here: auto, vmap, loop"
            )
        self._threads: RunThreads | None = None
        self._run_models: list[nn.Module] = []
        self._run_params_buffers: list[tuple[dict[str, Tensor], dict[str, Tensor]]] = []
        graph_step = self.cfg.train.graph_step
        if graph_step:
            reason = graph_step_unsupported_reason(self.device, 1)
            if reason is None and self.forward_mode == "threads":
                reason = "captures one thread's step (train.stack_forward=threads)"
            if reason is not None:
                raise ValueError(f"train.graph_step=true {reason}; allowed values here: false")
        mode = compile_mode(self.cfg.train, self.device)
        if graph_step and uses_cudagraphs(mode, self.device):
            mode = "default" if mode == "reduce-overhead" else "max-autotune-no-cudagraphs"  # the whole step is one
        self._cudagraphs = uses_cudagraphs(mode, self.device)
        if self.forward_mode == "vmap":
            self._forward_train = vmap(one_run, in_dims=(0, 0, 0))  # each run its own batch
            self._forward_eval = vmap(one_run, in_dims=(0, 0, None))  # one batch for all runs
            if mode is not None:
                self._forward_train = torch.compile(self._forward_train, mode=mode)
        elif self.forward_mode == "threads":
            # functional_call swaps a module's parameters for the call, so each thread has its own module;
            # each run's leaves are its row of flat_RxN, so the optimizer's in-place update moves them
            self._run_models = [copy.deepcopy(self.template) for _ in range(num_runs)]
            self._run_params_buffers = [
                (
                    {
                        s.name: self.flat_RxN[r, s.offset : s.offset + s.numel].view(s.shape).detach().requires_grad_()
                        for s in self.slots
                    },
                    {n: b[r] for n, b in self.buffers.items()},  # views: a resume writes into the stacked buffers
                )
                for r in range(num_runs)
            ]
            cores = torch.get_num_threads()
            self._threads = RunThreads(num_runs, max(1, cores // num_runs))
            self._forward_eval = self._threaded_eval_forward
        else:
            # run by run: each run gets the lone model's kernels, and its parameters are row r of the
            # stacked ones, so autograd still delivers the R x N gradient the stacked optimizer reads
            one_run_train = torch.compile(one_run, mode=mode) if mode is not None else one_run

            def loop(fn: Any, shared_input: bool) -> Any:
                def forward(p: dict[str, Tensor], b: dict[str, Tensor], x: Tensor) -> Tensor:
                    outs = []
                    for r in range(num_runs):
                        row_p, row_b = {n: t[r] for n, t in p.items()}, {n: t[r] for n, t in b.items()}
                        outs.append(fn(row_p, row_b, x if shared_input else x[r]))
                    return torch.stack(outs)

                return forward

            self._forward_train = loop(one_run_train, shared_input=False)
            self._forward_eval = loop(one_run, shared_input=True)
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = self.cfg.train.tf32
            torch.backends.cudnn.allow_tf32 = self.cfg.train.tf32

        if resume:
            self._restore()
        else:
            for run in self.runs:
                check_new_or_resumable(run.out, resume=False)
        self._graph = StackedStepGraph(self) if graph_step else None
        from torch.utils.tensorboard import SummaryWriter

        for run in self.runs:
            write_config(run.out, run.cfg)
            run.writer = SummaryWriter(str(run.out / "tb"))

    @property
    def num_runs(self) -> int:
        return len(self.runs)

    # --------------------------------------------------------------------------- optimizer
    def _schedule_row(self, step: int | Tensor) -> Tensor:
        """Per-run ``1 - lr * wd``, ``-lr / (1 - beta1^t)`` and ``sqrt(1 - beta2^t)`` at ``step`` (R x 3).

        Computed in float64 on the host as ``torch.optim.AdamW`` does, rounded to float32 as its
        kernels do, for ``SCHEDULE_CHUNK`` steps at a time into one device table; a step reads a row.
        ``step`` as a device tensor (a captured step) reads the row on the device; the host then loads
        the chunk before each replay (:meth:`_load_schedule`).
        """
        if isinstance(step, Tensor):
            return self._schedule_SxRx3.index_select(0, step.remainder(SCHEDULE_CHUNK).view(1))[0]
        self._load_schedule(step)
        return self._schedule_SxRx3[step % SCHEDULE_CHUNK]

    def _load_schedule(self, step: int) -> None:
        chunk = step // SCHEDULE_CHUNK
        if chunk == self._schedule_chunk:
            return
        rows = []
        for s in range(chunk * SCHEDULE_CHUNK, (chunk + 1) * SCHEDULE_CHUNK):
            bias_correction1, bias_correction2_sqrt = 1 - BETA1 ** (s + 1), (1 - BETA2 ** (s + 1)) ** 0.5
            row = []
            for run in self.runs:
                lr = lr_at(s, run.cfg)
                row.append([1 - lr * run.cfg.train.weight_decay, -(lr / bias_correction1), bias_correction2_sqrt])
            rows.append(row)
        table = torch.tensor(rows, dtype=torch.float32)
        if self.device.type == "cuda":
            table = table.pin_memory()
        if self._schedule_SxRx3.shape == table.shape:  # in place: a captured step reads this buffer
            self._schedule_SxRx3.copy_(table, non_blocking=True)
        else:
            self._schedule_SxRx3 = table.to(self.device, non_blocking=True)
        self._schedule_chunk = chunk

    @torch.no_grad()
    def _adamw_step(self, grad_RxN: Tensor, schedule_Rx3: Tensor) -> None:
        """``torch.optim.AdamW``'s update (single-tensor arithmetic) of all runs' parameters at once."""
        decay_Rx1, neg_step_size_Rx1, bias_correction2_sqrt_Rx1 = schedule_Rx3.split(1, dim=1)
        p, m, v = self.flat_RxN, self.exp_avg_RxN, self.exp_avg_sq_RxN
        p[:, : self.num_decayed].mul_(decay_Rx1)
        m.lerp_(grad_RxN, 1 - BETA1)
        v.mul_(BETA2).addcmul_(grad_RxN, grad_RxN, value=1 - BETA2)
        denom = (v.sqrt() / bias_correction2_sqrt_Rx1).add_(EPS)
        p.addcdiv_(m * neg_step_size_Rx1, denom)

    # --------------------------------------------------------------------------- steps
    def _autocast(self) -> Any:
        if not self.cfg.train.bf16:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def train_step(self) -> None:
        """One optimizer step of every run; no host synchronization."""
        if self._graph is not None:
            self._graph.replay(self.step)
        elif self._threads is not None:
            self._threaded_train_step()
        else:
            self._step_body(self.step, in_place=False)
        self._n += 1
        self.step += 1

    def _step_body(self, step: int | Tensor, *, in_place: bool) -> None:
        """Sampling, forward, backward, AdamW and the metric sums of 0-based step ``step``. ``in_place``
        (a step captured by ``train.graph_step``, ``step`` a device tensor) updates the sums and the
        non-finite flags in their buffers."""
        t = self.cfg.train
        r_count, accum = self.num_runs, t.grad_accum_steps
        grad_RxN: Tensor | None = None
        for _ in range(accum):
            if self._cudagraphs:
                torch.compiler.cudagraph_mark_step_begin()
            batches = [self.task.sample(t.batch_size // accum, "train", run.gen) for run in self.runs]
            x_RxBx = torch.stack([b.inputs for b in batches])
            batch = _concat(batches)
            with self._autocast():
                out_RxBxPxO = self._forward_train(self.params, self.buffers, x_RxBx)
                out = out_RxBxPxO.flatten(0, 1).float()
                # the task loss is a mean over problems: R x (mean over R*B) sums the runs' own losses
                loss = self.task.loss(out, batch) * r_count
            grads = torch.autograd.grad(loss / accum, self._param_list, allow_unused=True, materialize_grads=True)
            g_RxN = torch.cat([g.reshape(r_count, -1) for g in grads], dim=1)
            grad_RxN = g_RxN if grad_RxN is None else grad_RxN.add_(g_RxN)
            with torch.no_grad():
                m = self.task.metrics(out.detach(), batch)
                keys = ("loss", self.task.primary_metric)
                self._record({k: m[k].double().view(r_count, -1).mean(1) / accum for k in keys}, step, in_place)
        assert grad_RxN is not None
        self._adamw_step(grad_RxN, self._schedule_row(step))

    @torch.no_grad()
    def _record(self, means_R: dict[str, Tensor], step: int | Tensor, in_place: bool) -> None:
        """Add a (micro-)step's per-run mean loss and metric to the sums since the last log and flag runs
        whose loss is not finite with ``step + 1``; ``in_place`` (a captured step) writes into the buffers."""
        flag_R = torch.where(~torch.isfinite(means_R["loss"]) & (self._nonfinite_R < 0), step + 1, self._nonfinite_R)
        if in_place:
            self._nonfinite_R.copy_(flag_R)
            for k, v_R in means_R.items():
                self._acc_R[k].add_(v_R)
        else:
            self._nonfinite_R = flag_R
            for k, v_R in means_R.items():
                self._acc_R[k] = self._acc_R[k] + v_R if k in self._acc_R else v_R

    def _run_forward(self, r: int, x: Tensor) -> Tensor:
        return functional_call(
            self._run_models[r], self._run_params_buffers[r], (x,), {"last_positions": self.task.num_output_positions}
        )

    def _run_step(self, r: int, grad_RxN: Tensor) -> dict[str, Tensor]:
        """Run ``r``'s share of a step (its thread): sampling, forward, backward into ``grad_RxN[r]``;
        returns its mean loss and primary metric over the step's problems."""
        t = self.cfg.train
        accum = t.grad_accum_steps
        leaves = list(self._run_params_buffers[r][0].values())
        sums: dict[str, Tensor] = {}
        for micro in range(accum):
            batch = self.task.sample(t.batch_size // accum, "train", self.runs[r].gen)
            with self._autocast():
                out = self._run_forward(r, batch.inputs).float()
                loss = self.task.loss(out, batch)
            grads = torch.autograd.grad(loss / accum, leaves, allow_unused=True, materialize_grads=True)
            if micro == 0:
                torch.cat([g.reshape(-1) for g in grads], out=grad_RxN[r])
            else:
                grad_RxN[r].add_(torch.cat([g.reshape(-1) for g in grads]))
            with torch.no_grad():
                m = self.task.metrics(out.detach(), batch)
                for k in ("loss", self.task.primary_metric):
                    value = m[k].double().mean() / accum
                    sums[k] = sums[k] + value if k in sums else value
        return sums

    def _threaded_train_step(self) -> None:
        assert self._threads is not None
        grad_RxN = torch.empty_like(self.flat_RxN)
        per_run = self._threads.map(lambda r: self._run_step(r, grad_RxN), list(range(self.num_runs)))
        self._record({k: torch.stack([p[k] for p in per_run]) for k in per_run[0]}, self.step, in_place=False)
        self._adamw_step(grad_RxN, self._schedule_row(self.step))

    def _threaded_eval_forward(self, p: dict[str, Tensor], b: dict[str, Tensor], x: Tensor) -> Tensor:
        assert self._threads is not None

        def forward(r: int) -> Tensor:
            with torch.no_grad(), self._autocast():  # grad mode and autocast are per thread
                return self._run_forward(r, x)

        return torch.stack(self._threads.map(forward, list(range(self.num_runs))))

    def _flush_train_metrics(self) -> list[dict[str, float]]:
        """Mean train metrics per run since the last log (one host read for all runs)."""
        if not self._acc_R or self._n == 0:
            return [{} for _ in self.runs]
        keys = sorted(self._acc_R)
        values = (torch.stack([self._acc_R[k] for k in keys], dim=1) / float(self._n)).tolist()
        if self._graph is not None:  # the captured step adds into these buffers: keep them, zeroed
            for v in self._acc_R.values():
                v.zero_()
        else:
            self._acc_R = {}
        self._n = 0
        return [self.task.summarize(dict(zip(keys, row))) for row in values]

    def _check_finite(self) -> None:
        bad = [(run, s) for run, s in zip(self.runs, self._nonfinite_R.tolist()) if s >= 0]
        if bad:
            where = ", ".join(f"{run.cfg.name} (step {s})" for run, s in bad)
            raise NonFiniteLossError(
                f"loss became NaN/inf in {where}; stopped all {self.num_runs} stacked runs. The last good "
                f"checkpoints ({latest_checkpoint(bad[0][0].out) or 'none yet'}, ...) are kept; lower train.lr "
                "or try train.bf16=false"
            )

    @torch.no_grad()
    def evaluate(self) -> list[dict[str, dict[str, float]]]:
        """Per run: mean per-problem metrics over ``eval_size`` problems of every split (the lone
        trainer's problems: generators seeded ``eval_seed * 101 + split index``)."""
        t = self.cfg.train
        models = [self.template, *self._run_models]
        for model in models:
            model.eval()
        results: list[dict[str, dict[str, float]]] = [{} for _ in self.runs]
        for i, split in enumerate(self.task.splits):
            gen = torch.Generator(self.device).manual_seed(t.eval_seed * 101 + i)
            sums: dict[str, Tensor] = {}
            count = 0
            for b in range(math.ceil(t.eval_size / t.eval_batch_size)):
                n = min(t.eval_batch_size, t.eval_size - b * t.eval_batch_size)
                batch = self.task.sample(n, split, gen)
                with self._autocast():
                    out_RxBxPxO = self._forward_eval(self.params, self.buffers, batch.inputs)
                per_run = [self.task.metrics(out_RxBxPxO[r].float(), batch) for r in range(self.num_runs)]
                for k in per_run[0]:
                    s_R = torch.stack([m[k].double().sum() for m in per_run])
                    sums[k] = sums[k] + s_R if k in sums else s_R
                count += n
            keys = sorted(sums)
            table = (torch.stack([sums[k] for k in keys], dim=1) / float(count)).tolist()
            for r, row in enumerate(table):
                results[r][split] = self.task.summarize(dict(zip(keys, row)))
        for model in models:
            model.train()
        return results

    def _log(self, run: _Run, split: str, values: dict[str, float]) -> None:
        append_metrics(run.out, self.step, split, values)
        for k, v in values.items():
            run.writer.add_scalar(f"{split}/{k}", v, self.step)

    def run(self) -> list[dict[str, dict[str, float]]]:
        """Train to ``train.steps``; returns each run's last evaluation."""
        t = self.cfg.train
        metric = self.task.primary_metric
        if self.step == 0:
            n_params = self.flat_RxN.shape[1]
            print(
                f"{self.num_runs} stacked runs ({', '.join(r.cfg.name for r in self.runs)}): {n_params:,} parameters "
                f"each, {t.steps} steps, device {self.device}, train.stack_forward={self.forward_mode}"
                + (", whole step as one CUDA graph" if self._graph is not None else ""),
                flush=True,
            )

        def log(s: int, steps_per_s: float) -> None:
            flushed = self._flush_train_metrics()
            for run, values in zip(self.runs, flushed):
                self._log(run, "train_batch", {**values, "lr": lr_at(s - 1, run.cfg)})
                run.writer.add_scalar("perf/steps_per_s", steps_per_s, s)
                run.writer.add_scalar("perf/problems_per_s", steps_per_s * t.batch_size, s)
            per_run = " ".join(
                f"{r.cfg.name}:{metric}={v.get(metric, float('nan')):.4g}" for r, v in zip(self.runs, flushed)
            )
            print(f"step {s}/{t.steps} ({steps_per_s:.1f} steps/s x {self.num_runs} runs) {per_run}", flush=True)

        def evaluate(s: int) -> list[dict[str, dict[str, float]]]:
            results = self.evaluate()
            for run, res in zip(self.runs, results):
                for split, values in res.items():
                    self._log(run, split, values)
            print(
                f"eval step {s}: "
                + "; ".join(
                    f"{run.cfg.name} " + ", ".join(f"{sp} {metric}={v[metric]:.4f}" for sp, v in res.items())
                    for run, res in zip(self.runs, results)
                ),
                flush=True,
            )
            return results

        try:
            last = drive(self, log=log, evaluate=evaluate, say=lambda text: print(text, flush=True))
        finally:
            for run in self.runs:
                run.writer.flush()
        return last or [{} for _ in self.runs]

    def close(self) -> None:
        if self._threads is not None:
            self._threads.close()
            self._threads = None
        for run in self.runs:
            if run.writer is not None:
                run.writer.close()

    # --------------------------------------------------------------------------- checkpoints
    def _lone(self, r: int) -> tuple[nn.Module, torch.optim.AdamW]:
        """Run ``r`` as an ordinary model and ``torch.optim.AdamW`` (checkpoints in the lone format)."""
        model = copy.deepcopy(self.template)
        with torch.no_grad():
            model.load_state_dict(
                {**{k: v[r] for k, v in self.params.items()}, **{k: v[r] for k, v in self.buffers.items()}}
            )
        opt = build_optimizer(model, self.runs[r].cfg, self.device)
        slots = {s.name: s for s in self.slots}
        names = {id(p): n for n, p in model.named_parameters()}
        for group in opt.param_groups:
            group["lr"] = lr_at(max(self.step - 1, 0), self.runs[r].cfg)
            for p in group["params"]:
                s = slots[names[id(p)]]
                cols = slice(s.offset, s.offset + s.numel)
                opt.state[p] = {
                    "step": torch.tensor(float(self.step)),
                    "exp_avg": self.exp_avg_RxN[r, cols].reshape(s.shape).clone(),
                    "exp_avg_sq": self.exp_avg_sq_RxN[r, cols].reshape(s.shape).clone(),
                }
        return model, opt

    def save(self) -> None:
        """One ordinary checkpoint per run (what the lone trainer writes at this step)."""
        for r, run in enumerate(self.runs):
            model, opt = self._lone(r)
            rng: dict[str, Tensor] = {"torch_cpu": torch.get_rng_state(), "data_rank0": run.gen.get_state()}
            if self._n:
                rng.update({f"acc_{k}": v[r].detach().clone() for k, v in self._acc_R.items()})
                rng["acc__n"] = torch.tensor(float(self._n), dtype=torch.float64)
            save_checkpoint(
                run.out,
                TrainingState(
                    self.step, run.cfg.to_dict(), model.state_dict(), opt.state_dict(), rng, {"world_size": 1}
                ),
            )

    def _restore(self) -> None:
        steps: set[int] = set()
        acc: dict[str, list[Tensor]] = {}
        ns: set[float] = set()
        for r, run in enumerate(self.runs):
            ckpt = latest_checkpoint(run.out)
            if ckpt is None:
                raise CheckpointError(
                    f"--resume: no checkpoint in {run.out} (expected {run.out}/checkpoints/latest); "
                    "drop --resume to start new runs"
                )
            state = load_checkpoint(ckpt)
            diffs = resume_differences(state.config, run.cfg)
            if diffs:
                raise CheckpointError(
                    f"{run.out}: the checkpoint was written by a different configuration; refusing to resume:\n  "
                    + "\n  ".join(diffs)
                )
            if state.extra.get("world_size", 1) != 1:
                raise CheckpointError(f"{run.out}: written by {state.extra['world_size']} processes; resume it alone")
            model, opt = self._lone(r)
            try:
                model.load_state_dict(state.model)
                opt.load_state_dict(state.optimizer)
            except (RuntimeError, ValueError, KeyError) as err:
                raise CheckpointError(f"{run.out}: checkpoint does not fit this model/optimizer: {err}") from err
            names = {id(p): n for n, p in model.named_parameters()}
            slots = {s.name: s for s in self.slots}
            with torch.no_grad():
                for n, p in model.named_parameters():
                    self.params[n][r] = p.to(self.device)
                for n, b in model.named_buffers():
                    self.buffers[n][r] = b.to(self.device)
                for p, st in opt.state.items():
                    s = slots[names[id(p)]]
                    cols = slice(s.offset, s.offset + s.numel)
                    self.exp_avg_RxN[r, cols] = st["exp_avg"].reshape(-1).to(self.device)
                    self.exp_avg_sq_RxN[r, cols] = st["exp_avg_sq"].reshape(-1).to(self.device)
            run.gen.set_state(state.rng["data_rank0"].to(torch.uint8))
            for k, v in state.rng.items():
                if k.startswith("acc_") and k != "acc__n":
                    acc.setdefault(k.removeprefix("acc_"), []).append(v.to(self.device, torch.float64))
            ns.add(float(state.rng["acc__n"]) if "acc__n" in state.rng else 0.0)
            steps.add(state.step)
            truncate_metrics_after(run.out, state.step)
        if len(steps) != 1 or len(ns) != 1:
            raise CheckpointError(
                f"the stacked runs' checkpoints are at different steps {sorted(steps)}; resume them one by one"
            )
        self.step = steps.pop()
        self._n = int(ns.pop())
        if self._n:
            if any(len(v) != self.num_runs for v in acc.values()):
                raise CheckpointError("the stacked runs' checkpoints hold different metric accumulators")
            self._acc_R = {k: torch.stack(v) for k, v in acc.items()}
