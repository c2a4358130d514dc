"""The stacked engine: R independent runs in one process, stacked along a leading run dimension.

``hyla train CONFIG --seeds 0,1,2 --out DIR`` (runs ``DIR/seed0`` ...), ``--sweep`` and ``hyla sweep``
train here. Runs may differ in :data:`STACKABLE_KEYS` (seed, data seed, and the optimizer's
hyperparameters); runs that differ in anything else are split into groups trained one after
another (:func:`hyla.train.plan.plan_groups`, by :func:`stack_key`). Each run ``r`` of a stack

* is initialized exactly as the lone run with its seed (the R models are built one by one);
* draws its problems from its own generator, seeded as the lone run's, so it sees the same data;
* is updated by :class:`~hyla.train.optim.StackedAdamW` with its own learning-rate schedule and
  weight decay, with the arithmetic of ``torch.optim.AdamW`` (decay on the lone run's decayed
  parameters only);
* writes an ordinary run directory (the shell writes it; checkpoints hold ``torch.optim.AdamW``'s
  format), which ``hyla report`` reads and ``hyla train --resume`` continues, stacked or alone.

The R runs' parameters are views into one ``R x N`` tensor. On CUDA the forward is
``torch.func.vmap`` over ``functional_call`` of one template model: one call runs all R models, so a
GPU step launches the kernels of one run, each R times wider. On a CPU, where a step is compute-bound
and vmap's batched forms (``bmm`` for the per-run linear layers) are slower than the lone ones, the
runs are called one after another with the lone model's kernels (``train.stack_forward=loop``).
``train.fast`` compiles the forward as for a lone run (:mod:`hyla.train.fast`); ``train.graph_step``
(CUDA) captures the whole stacked step as one CUDA graph (:class:`StackedStepGraph`).
Attention dropout draws each run's masks from that run's own generator, which starts where the lone
run's default generator starts and is checkpointed as its state, so a run drops the same pairs stacked
or alone. A stacked run equals its lone run bit for bit with the loop forward, and up to floating-point
reordering with vmap (``tests/test_stacked.py``).
"""

from __future__ import annotations

import copy
import json
import os
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from hyla.attention.functional import draw_keep_mask, supplied_keep_masks
from hyla.tasks import task_entry
from hyla.tasks.base import Batch
from hyla.train.build import build_model, build_task, sized_config
from hyla.train.checkpoint import CheckpointError, TrainingState
from hyla.train.config import ExperimentConfig
from hyla.train.engine import Dist, StepSums, autocast, check_device, eval_mode, set_tf32
from hyla.train.fast import StepGraph, compile_mode, graph_step_unsupported_reason, uses_cudagraphs
from hyla.train.optim import StackedAdamW, decayed_parameter_names

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


def stack_forward_mode(setting: str, device: torch.device | str) -> str:
    """``train.stack_forward`` resolved for ``device``: ``vmap`` or ``loop``.

    ``auto`` is ``vmap`` on CUDA, where a step of these tiny models is launch-bound and one R times
    wider launch is what pays, and ``loop`` elsewhere (``results/train_throughput.md``). The
    retired ``threads`` (each run in its own CPU thread) reads as ``loop``.
    """
    if setting == "auto":
        return "vmap" if torch.device(device).type == "cuda" else "loop"
    return "loop" if setting == "threads" else setting


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
    task_reason = task_entry(cfg.data.task).task.not_stackable_because
    if task_reason:
        return f"data.task={cfg.data.task} ({task_reason})"
    if cfg.model.moe_experts:
        return "model.moe_experts > 0 (the MoE auxiliary loss is per model)"
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


def stack_key(cfg: ExperimentConfig) -> str | None:
    """What runs that stack together share (their config but :data:`STACKABLE_KEYS`), or None for a run
    that cannot be stacked at all (:func:`not_stackable_reason`)."""
    if not_stackable_reason(cfg):
        return None
    return json.dumps({k: v for k, v in sorted(_stack_view(cfg).items()) if k not in STACKABLE_KEYS})


# ------------------------------------------------------------------------------ the engine
@dataclass
class _Slot:
    """Where one parameter of the lone model lives in the ``R x N`` parameter tensor."""

    name: str
    offset: int
    numel: int
    shape: torch.Size

    @property
    def columns(self) -> slice:
        return slice(self.offset, self.offset + self.numel)


def _concat(batches: list[Batch]) -> Batch:
    """The R runs' batches as one batch of R*B problems (run-major)."""
    return Batch(
        torch.cat([b.inputs for b in batches]),
        torch.cat([b.targets for b in batches]),
        {k: torch.cat([b.info[k] for b in batches]) for k in batches[0].info},
    )


def default_generator_copy(device: torch.device) -> torch.Generator:
    """A new generator in the state of torch's default generator of ``device``."""
    gen = torch.Generator(device)
    state = torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()
    gen.set_state(state)
    return gen


class StackedEngine:
    """Train ``len(cfgs)`` runs at once (see the module docstring)."""

    dist = Dist()
    world_size = 1

    def __init__(self, cfgs: list[ExperimentConfig], device: str = "cpu") -> None:
        check_device(device)
        check_stackable(cfgs)
        self.device = torch.device(device)
        for cfg in cfgs:
            cfg.validate()
        self.task = build_task(cfgs[0])
        self.cfgs = cfgs = [sized_config(cfg, self.task) for cfg in cfgs]
        self.cfg = cfgs[0]
        models, self.dropout_gens = [], []
        for cfg in cfgs:  # seeded as the lone runs; each run's dropout generator where its lone run's starts
            models.append(build_model(cfg, self.task).to(self.device))
            self.dropout_gens.append(default_generator_copy(self.device))
        self.num_runs = num_runs = len(cfgs)
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
        self.columns = {s.name: s.columns for s in self.slots}
        with torch.no_grad():
            rows = [dict(m.named_parameters()) for m in models]
            self.flat_RxN = torch.stack([torch.cat([r[s.name].reshape(-1) for s in self.slots]) for r in rows])
        self.params: dict[str, nn.Parameter] = {
            s.name: nn.Parameter(self.flat_RxN[:, s.columns].view(num_runs, *s.shape)) for s in self.slots
        }
        self._param_list = list(self.params.values())
        self.buffers: dict[str, Tensor] = {
            name: torch.stack([dict(m.named_buffers())[name] for m in models])
            for name, _ in self.template.named_buffers()
        }
        num_decayed = sum(s.numel for s in self.slots if s.name in decayed)
        self.optimizer = StackedAdamW(self.flat_RxN, num_decayed, cfgs)
        del models, rows

        self.gens = [torch.Generator(self.device).manual_seed(cfg.data_seed * 1009) for cfg in cfgs]
        self.sums = StepSums(num_runs, ("loss", self.task.primary_metric), self.device)
        self._build_forward()
        set_tf32(self.cfg, self.device)
        self.graph = StackedStepGraph(self) if self.cfg.train.graph_step else None

    def _build_forward(self) -> None:
        """``_forward_train(params, buffers, x_RxBx...)`` and ``_forward_eval(params, buffers, x_Bx...)``,
        both ``-> out_RxBxPxO``, as ``train.stack_forward``, ``train.fast`` and ``train.graph_step`` ask."""
        t = self.cfg.train
        self.forward_mode = stack_forward_mode(t.stack_forward, self.device)
        if t.graph_step:
            reason = graph_step_unsupported_reason(self.device, 1)
            if reason is not None:
                raise ValueError(f"train.graph_step=true {reason}; allowed values here: false")
        mode = compile_mode(t, self.device)
        if t.graph_step and uses_cudagraphs(mode, self.device):
            mode = "default" if mode == "reduce-overhead" else "max-autotune-no-cudagraphs"  # the whole step is one
        self._cudagraphs = uses_cudagraphs(mode, self.device)
        positions, template = self.task.num_output_positions, self.template

        def one_run(p: dict[str, Tensor], b: dict[str, Tensor], x: Tensor, keep: list[Tensor] | None) -> Tensor:
            with supplied_keep_masks(keep) if keep is not None else nullcontext():
                return functional_call(template, (p, b), (x,), {"last_positions": positions})

        if self.forward_mode == "vmap":
            masks = 0 if self.cfg.model.attention_dropout > 0 else None  # each run its own masks, if any
            self._forward_train = vmap(one_run, in_dims=(0, 0, 0, masks))  # each run its own batch
            self._forward_eval = vmap(one_run, in_dims=(0, 0, None, None))  # one batch for all runs
            if mode is not None:
                self._forward_train = torch.compile(self._forward_train, mode=mode)
            return
        # run by run: each run gets the lone model's kernels, and its parameters are row r of the
        # stacked ones, so autograd still delivers the R x N gradient the stacked optimizer reads
        one_run_train = torch.compile(one_run, mode=mode) if mode is not None else one_run

        def loop(fn: Any, shared_input: bool) -> Any:
            def forward(p: dict[str, Tensor], b: dict[str, Tensor], x: Tensor, keep: list[Tensor] | None) -> Tensor:
                outs = []
                for r in range(self.num_runs):
                    row_p, row_b = {n: t[r] for n, t in p.items()}, {n: t[r] for n, t in b.items()}
                    row_keep = None if keep is None else [m[r] for m in keep]
                    outs.append(fn(row_p, row_b, x if shared_input else x[r], row_keep))
                return torch.stack(outs)

            return forward

        self._forward_train = loop(one_run_train, shared_input=False)
        self._forward_eval = loop(one_run, shared_input=True)

    def describe(self, names: list[str], steps: int) -> str:
        return (
            f"{self.num_runs} stacked runs ({', '.join(names)}): {self.flat_RxN.shape[1]:,} parameters each, "
            f"{steps} steps, device {self.device}, train.stack_forward={self.forward_mode}"
            + (", whole step as one CUDA graph" if self.graph is not None else "")
        )

    # --------------------------------------------------------------------------- steps
    def train_step(self, step: int) -> None:
        """One optimizer step of every run; no host synchronization."""
        if self.graph is not None:
            self.graph.replay(step)
        else:
            self.step_body(step)

    def step_body(self, step: int | Tensor) -> None:
        """Sampling, forward, backward, AdamW and the step sums of 0-based step ``step`` (a device tensor
        inside a captured step)."""
        t = self.cfg.train
        r_count, accum = self.num_runs, t.grad_accum_steps
        grad_RxN: Tensor | None = None
        for _ in range(accum):
            if self._cudagraphs:
                torch.compiler.cudagraph_mark_step_begin()
            batches = [self.task.sample(t.batch_size // accum, "train", gen) for gen in self.gens]
            x_RxBx = torch.stack([b.inputs for b in batches])
            batch = _concat(batches)
            with autocast(self.cfg, self.device):
                out_RxBxPxO = self._forward_train(self.params, self.buffers, x_RxBx, self._draw_keep_masks(x_RxBx))
                out = out_RxBxPxO.flatten(0, 1).float()
                # the task loss is a mean over problems: R x (mean over R*B) sums the runs' own losses
                loss = self.task.loss(out, batch) * r_count
            grads = torch.autograd.grad(loss / accum, self._param_list, allow_unused=True, materialize_grads=True)
            g_RxN = torch.cat([g.reshape(r_count, -1) for g in grads], dim=1)
            grad_RxN = g_RxN if grad_RxN is None else grad_RxN.add_(g_RxN)
            with torch.no_grad():
                m = self.task.metrics(out.detach(), batch)
                means_R = {k: m[k].double().view(r_count, -1).mean(1) / accum for k in self.sums.keys}
                self.sums.add(means_R, means_R["loss"], step + 1)
        assert grad_RxN is not None
        self.optimizer.step(grad_RxN, self.optimizer.schedule_row(step))

    def _draw_keep_masks(self, x_RxBx: Tensor) -> list[Tensor] | None:
        """Attention dropout's keep-masks of one training forward, ``R x 1 x 1 x Q x K`` per dropping
        layer: run r's drawn from its own generator in the order its lone run draws them (None: no dropout)."""
        shapes = self.template.dropout_mask_shapes(x_RxBx.shape[2], self.task.num_output_positions)
        if not shapes:
            return None
        p = self.cfg.model.attention_dropout
        per_run = [[draw_keep_mask(q, k, p, self.device, gen) for q, k in shapes] for gen in self.dropout_gens]
        return [torch.stack(layer) for layer in zip(*per_run)]

    def evaluation(self) -> AbstractContextManager[None]:
        return eval_mode(self.template)

    def eval_forward(self, x: Tensor) -> Tensor:
        return self._forward_eval(self.params, self.buffers, x, None)

    # --------------------------------------------------------------------------- checkpoints
    def _lone_model(self, r: int) -> nn.Module:
        model = copy.deepcopy(self.template)
        with torch.no_grad():
            model.load_state_dict(
                {**{k: v[r] for k, v in self.params.items()}, **{k: v[r] for k, v in self.buffers.items()}}
            )
        return model

    def export_run(self, r: int, step: int) -> tuple[dict[str, Tensor], dict[str, Any], dict[str, Tensor]]:
        model = self._lone_model(r)
        opt = self.optimizer.to_adamw(r, model, self.columns, step)
        # the lone format: a lone run's dropout draws from the default generator of its device
        rng = {"torch_cpu": torch.get_rng_state(), "data_rank0": self.gens[r].get_state()}
        rng["torch_cuda" if self.device.type == "cuda" else "torch_cpu"] = self.dropout_gens[r].get_state()
        return model.state_dict(), opt.state_dict(), rng

    def load_run(self, r: int, state: TrainingState) -> None:
        model = self._lone_model(r)
        opt = self.optimizer.to_adamw(r, model, self.columns, state.step)
        try:
            model.load_state_dict(state.model)
            opt.load_state_dict(state.optimizer)
        except (RuntimeError, ValueError, KeyError) as err:
            raise CheckpointError(f"checkpoint does not fit this model/optimizer: {err}") from err
        with torch.no_grad():
            for n, p in model.named_parameters():
                self.params[n][r] = p.to(self.device)
            for n, b in model.named_buffers():
                self.buffers[n][r] = b.to(self.device)
        self.optimizer.load_adamw(r, opt, model, self.columns)
        self.gens[r].set_state(state.rng["data_rank0"].to(torch.uint8))
        dropout_state = state.rng.get("torch_cuda" if self.device.type == "cuda" else "torch_cpu")
        if dropout_state is not None:  # a checkpoint from a CPU continued on CUDA draws anew from here
            self.dropout_gens[r].set_state(dropout_state.to(torch.uint8))

    def close(self) -> None:
        pass


class StackedStepGraph(StepGraph):
    """``train.graph_step`` for a stack: all R runs' step (sampling from R generators, the stacked
    forward and backward, the stacked AdamW reading its schedule row on the device, the step sums)
    as one CUDA graph. The engine's state is already in fixed buffers (``flat_RxN``, the AdamW
    moments, the schedule table); the step sums become buffers before capture."""

    def __init__(self, engine: StackedEngine) -> None:
        super().__init__(engine.device)
        self.engine = engine

    def replay(self, step: int) -> None:
        """Run step ``step`` (0-based) of every run; captures the graph on first use."""
        self.engine.optimizer.load_schedule(step)  # the captured step reads the row of its chunk
        self._replay(step)

    def _body(self) -> None:
        self.engine.step_body(self.step_count)
        self.step_count.add_(1)

    def _generators(self) -> list[torch.Generator]:
        return [*self.engine.gens, *self.engine.dropout_gens]

    def _before_capture(self) -> None:
        self.engine.sums.fix_buffers()

    @torch.no_grad()
    def _snapshot(self) -> dict[str, Any]:
        e = self.engine
        opt = e.optimizer
        snap: dict[str, Any] = {
            "tensors": [t.clone() for t in (opt.flat_RxN, opt.exp_avg_RxN, opt.exp_avg_sq_RxN)],
            "sums": e.sums.snapshot(),
            "gens": [gen.get_state() for gen in [*e.gens, *e.dropout_gens]],
        }
        if e.device.type == "cuda":  # the default generator, which torch.cuda.graph registers itself
            snap["cuda_rng"] = torch.cuda.get_rng_state(e.device)
        return snap

    @torch.no_grad()
    def _restore(self, snap: dict[str, Any]) -> None:
        e = self.engine
        opt = e.optimizer
        for t, saved in zip((opt.flat_RxN, opt.exp_avg_RxN, opt.exp_avg_sq_RxN), snap["tensors"]):
            t.copy_(saved)
        e.sums.restore(snap["sums"])
        for gen, state in zip([*e.gens, *e.dropout_gens], snap["gens"]):
            gen.set_state(state)
        if "cuda_rng" in snap:
            torch.cuda.set_rng_state(snap["cuda_rng"], e.device)
