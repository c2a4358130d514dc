"""The stacked engine: R independent runs in one process, stacked along a leading run dimension.

``hyla train CONFIG --seeds 0,1,2 --out DIR`` (runs ``DIR/seed0`` ...), ``--sweep`` and ``hyla sweep``
train here. Runs may differ in ``STACKABLE_KEYS`` (seed, data seed, held-out split and the
optimizer's hyperparameters); runs that differ in anything else are split into groups trained one after
another (``hyla.train.sweeps.plan_groups``, by ``stack_key``). Each run ``r`` of a stack

* is initialized exactly as the lone run with its seed (the R models are built one by one);
* has its own task, with the held-out split of its ``split_seed`` (the paper configs': its seed), and
  draws its training problems inside the step from its own generator, seeded as the lone run's, and its
  evaluation problems from its own split as the lone run does, so it sees the same data;
* adds its own MoE load-balancing term (``train.moe_aux_weight``) to the loss, as its lone run does;
* is updated by ``StackedAdamW`` with its own learning-rate schedule and
  weight decay, with the arithmetic of ``torch.optim.AdamW`` (decay on the lone run's decayed
  parameters only; on the CPU its fused kernel run by run, so a loop stack's numbers are its lone runs');
* writes an ordinary run directory (the shell writes it; checkpoints hold ``torch.optim.AdamW``'s
  format), which ``hyla report`` reads and ``hyla train --resume`` continues, stacked or alone.

The R runs' parameters are views into one ``R x N`` tensor, each aligned as a lone run's (``ALIGN_BYTES``).
On CUDA the forward is ``torch.func.vmap`` over ``functional_call`` of one template model: one call runs all R
models, so a GPU step launches the kernels of one run, each R times wider. On a CPU, where a step is compute-bound
and vmap's batched forms (``bmm`` for the per-run linear layers) are slower than the lone ones, the
runs are called one after another with the lone model's kernels (``train.stack_forward=loop``).
``train.fast`` compiles the forward as for a lone run (``hyla.train.engines.fast``); ``train.graph_step``
(CUDA) captures the whole stacked step as one CUDA graph (``StackedStepGraph``).
Attention dropout draws each run's masks from that run's own generator, which starts where the lone
run's default generator starts and is checkpointed as its state, so a run drops the same pairs stacked
or alone. A stacked run equals its lone run bit for bit with the loop forward, and up to floating-point
reordering with vmap (``tests/train/test_stacked.py``).
"""

from __future__ import annotations

import copy
import os
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from hyla.attention.functional import draw_keep_mask
from hyla.tasks.base import Batch
from hyla.train.build import build_model
from hyla.train.config import ExperimentConfig, config_key, flat_config
from hyla.train.engines import vmap_rules  # noqa: F401  (a vmap stack's C kernels: their batching rules)
from hyla.train.engines.base import Engine, EngineGraph, eval_mode, global_norms_R
from hyla.train.engines.optim import StackedAdamW, decayed_parameter_names

#: config keys in which the runs of one stack may differ
STACKABLE_KEYS = (
    "seed",
    "name",
    "data.split_seed",
    "train.data_seed",
    "train.init_weights",
    "train.lr",
    "train.weight_decay",
    "train.warmup_steps",
    "train.final_lr_fraction",
)


def stack_forward_mode(setting: str, device: torch.device | str) -> str:
    """``train.stack_forward`` resolved for ``device``: ``vmap`` or ``loop``.

    ``auto`` is ``vmap`` on CUDA, where a step of these tiny models is launch-bound and one R times
    wider launch is what pays, and ``loop`` elsewhere (measured). The
    retired ``threads`` (each run in its own CPU thread) reads as ``loop``.
    """
    if setting == "auto":
        return "vmap" if torch.device(device).type == "cuda" else "loop"
    return "loop" if setting == "threads" else setting


# ------------------------------------------------------------------------------ which runs stack
#: ``data.task`` -> why its runs are never stacked: the stacked engine's rule, not a fact of the task
UNSTACKABLE_TASKS: dict[str, str] = {"text": "language-model runs are trained one by one"}


def not_stackable_reason(cfg: ExperimentConfig) -> str | None:
    """Why a run cannot be part of a stack (it is then trained alone), or None."""
    task_reason = UNSTACKABLE_TASKS.get(cfg.data.task)
    if task_reason:
        return f"data.task={cfg.data.task} ({task_reason})"
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return "launched with torchrun (stacked runs use one process)"
    return None


def stack_differences(cfgs: list[ExperimentConfig]) -> list[str]:
    """The config keys outside ``STACKABLE_KEYS`` in which ``cfgs`` differ (none: they may share a stack)."""
    flats = [flat_config(cfg.to_dict()) for cfg in cfgs]
    return sorted(k for k in flats[0] if k not in STACKABLE_KEYS and any(f.get(k) != flats[0][k] for f in flats[1:]))


def check_stackable(cfgs: list[ExperimentConfig]) -> None:
    """Raise ValueError unless the runs can be trained as one stack."""
    if not cfgs:
        raise ValueError("cfgs must hold at least one run")
    reason = not_stackable_reason(cfgs[0])
    if reason:
        raise ValueError(f"these runs cannot be stacked: {reason}")
    bad = stack_differences(cfgs)
    if bad:
        raise ValueError(
            f"runs can be stacked only if they differ in {', '.join(STACKABLE_KEYS)}; these differ too: "
            f"{', '.join(bad)} (train them as separate stacks)"
        )


def stack_key(cfg: ExperimentConfig) -> str | None:
    """What runs that stack together share (their config but ``STACKABLE_KEYS``), or None for a run
    that cannot be stacked at all (``not_stackable_reason``)."""
    if not_stackable_reason(cfg):
        return None
    return config_key(flat_config(cfg.to_dict()), STACKABLE_KEYS)


# ------------------------------------------------------------------------------ the engine
#: where each parameter of a stacked run starts: the CPU allocator's alignment, that of a lone run's parameters.
#: A product's bits can depend on its operand's address: on a CPU, ``g_1xM @ w_DxM.T`` (the backward of an MoE
#: expert that was routed a single token) differed in the last bits with ``w`` 4 bytes off 16.
ALIGN_BYTES = 64


@dataclass
class ParamSlot:
    """Where one parameter of the lone model lives in the ``R x N`` parameter tensor (``ALIGN_BYTES`` apart)."""

    name: str
    offset: int
    numel: int
    shape: torch.Size
    decayed: bool

    @property
    def columns(self) -> slice:
        return slice(self.offset, self.offset + self.numel)


def stack_layout(model: nn.Module, decayed: set[str]) -> tuple[list[ParamSlot], int]:
    """Where each of ``model``'s parameters lives in a stacked run's row, and the row's length: the decayed ones
    first (as the lone run's optimizer groups them), each starting on ``ALIGN_BYTES``, as a lone run's does."""
    named = list(model.named_parameters())
    align = ALIGN_BYTES // named[0][1].element_size()
    slots, offset = [], 0
    for name, p in [(n, p) for n, p in named if n in decayed] + [(n, p) for n, p in named if n not in decayed]:
        slots.append(ParamSlot(name, offset, p.numel(), p.shape, name in decayed))
        offset = -(-(offset + p.numel()) // align) * align
    return slots, offset


def decay_groups(slots: list[ParamSlot]) -> tuple[list[slice], list[slice]]:
    """The decayed and the undecayed parameters' columns, as ``StackedAdamW`` takes them."""
    return [s.columns for s in slots if s.decayed], [s.columns for s in slots if not s.decayed]


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


class StackedEngine(Engine):
    """Train ``len(cfgs)`` runs at once (see the module docstring)."""

    def __init__(self, cfgs: list[ExperimentConfig], device: str = "cpu") -> None:
        check_stackable(cfgs)
        super().__init__(cfgs, device)

    def _build(self) -> None:
        models = []
        for cfg in self.cfgs:  # seeded as the lone runs; each run's dropout generator where its lone run's starts
            models.append(build_model(cfg, self.task).to(self.device))
            self.dropout_gens.append(default_generator_copy(self.device))
        num_runs = self.num_runs
        self.template = copy.deepcopy(models[0])

        # each run's parameters a row of flat_RxN
        decayed = decayed_parameter_names(self.template, self.cfg.train.weight_decay_mask)
        self.slots, width = stack_layout(self.template, decayed)
        self.columns = {s.name: s.columns for s in self.slots}
        dtype = next(self.template.parameters()).dtype
        # the zeros after each slot up to the next: the gradient's padding, in one `cat` with the gradients
        ends = [s.offset for s in self.slots[1:]] + [width]
        self._gaps = [
            torch.zeros(num_runs, end - s.columns.stop, dtype=dtype, device=self.device)
            for s, end in zip(self.slots, ends, strict=True)
        ]
        with torch.no_grad():
            rows = [dict(m.named_parameters()) for m in models]
            self.flat_RxN = torch.zeros(num_runs, width, dtype=dtype, device=self.device)
            for r, row in enumerate(rows):
                for s in self.slots:
                    self.flat_RxN[r, s.columns] = row[s.name].reshape(-1)
        self.params: dict[str, nn.Parameter] = {
            s.name: nn.Parameter(self.flat_RxN[:, s.columns].view(num_runs, *s.shape)) for s in self.slots
        }
        self._param_list = list(self.params.values())
        self.buffers: dict[str, Tensor] = {
            name: torch.stack([dict(m.named_buffers())[name] for m in models])
            for name, _ in self.template.named_buffers()
        }
        self.optimizer = StackedAdamW(self.flat_RxN, *decay_groups(self.slots), self.cfgs)
        del models, rows
        self._build_forward()

    def _build_forward(self) -> None:
        """``_forward_train(params, buffers, x_RxBx..., keep)`` and ``_forward_eval(params, buffers, x_RxBx...)``,
        both ``-> (out_RxBxPxO, aux_R)`` (each run on its own inputs; ``aux_R`` each run's MoE load-balancing
        term), as ``train.stack_forward``, ``train.fast`` and ``train.graph_step`` ask."""
        self.forward_mode = stack_forward_mode(self.cfg.train.stack_forward, self.device)
        mode, positions, template = self.compile_mode, self.task.num_output_positions, self.template

        def one_run(
            p: dict[str, Tensor], b: dict[str, Tensor], x: Tensor, keep: list[Tensor] | None
        ) -> tuple[Tensor, Tensor]:
            out = functional_call(template, (p, b), (x,), {"last_positions": positions, "dropout_keeps": keep})
            return out, template.pop_aux_loss()  # this run's term, read inside its own call

        if self.forward_mode == "vmap":
            masks = 0 if self.cfg.model.attention_dropout > 0 else None  # each run its own masks, if any
            self._forward_train = vmap(one_run, in_dims=(0, 0, 0, masks))  # each run its own batch
            self._forward_eval = vmap(one_run, in_dims=(0, 0, 0, None))
            if mode is not None:
                self._forward_train = torch.compile(self._forward_train, mode=mode)
            return
        # run by run: each run gets the lone model's kernels, and its parameters are row r of the
        # stacked ones, so autograd still delivers the R x N gradient the stacked optimizer reads
        one_run_train = torch.compile(one_run, mode=mode) if mode is not None else one_run

        def loop(fn: Any) -> Any:
            def forward(
                p: dict[str, Tensor], b: dict[str, Tensor], x_RxBx: Tensor, keep: list[Tensor] | None = None
            ) -> tuple[Tensor, Tensor]:
                outs = []
                for r in range(self.num_runs):
                    row_p, row_b = {n: t[r] for n, t in p.items()}, {n: t[r] for n, t in b.items()}
                    outs.append(fn(row_p, row_b, x_RxBx[r], None if keep is None else [m[r] for m in keep]))
                return torch.stack([o for o, _ in outs]), torch.stack([a for _, a in outs])

            return forward

        self._forward_train = loop(one_run_train)
        self._forward_eval = loop(one_run)

    def describe(self, names: list[str], steps: int) -> str:
        return (
            f"{self.num_runs} stacked runs ({', '.join(names)}): {sum(s.numel for s in self.slots):,} parameters each, "
            f"{steps} steps, device {self.device}, train.stack_forward={self.forward_mode}"
            + (", whole step as one CUDA graph" if self.graph is not None else "")
        )

    # --------------------------------------------------------------------------- steps
    def _forward_loss(self, batches: list[Batch]) -> tuple[Tensor, Batch, Tensor]:
        x_RxBx = torch.stack([b.inputs for b in batches])
        batch = _concat(batches)
        out_RxBxPxO, aux_R = self._forward_train(self.params, self.buffers, x_RxBx, self._draw_keep_masks(x_RxBx))
        out = out_RxBxPxO.flatten(0, 1).float()
        # the task loss is a mean over problems: R x (mean over R*B) sums the runs' own losses
        loss = self.task.loss(out, batch) * self.num_runs
        if self.cfg.model.moe_experts:  # each run's own load-balancing term, weighted as its lone run's
            loss = loss + self.cfg.train.moe_aux_weight * aux_R.sum()
        return out, batch, loss

    def _backward(self, loss: Tensor, grads: Tensor | None) -> Tensor:
        """The gradient ``grad_RxN`` in ``flat_RxN``'s columns, summed over the micro-batches so far."""
        per_param = torch.autograd.grad(loss, self._param_list, allow_unused=True, materialize_grads=True)
        parts = (t for g, gap in zip(per_param, self._gaps, strict=True) for t in (g.reshape(self.num_runs, -1), gap))
        g_RxN = torch.cat(list(parts), dim=1)
        return g_RxN if grads is None else grads.add_(g_RxN)

    def _grad_norm_R(self, grads: Tensor | None) -> Tensor:
        assert grads is not None
        return global_norms_R([grads[:, self.columns[n]] for n, _ in self.template.named_parameters()])

    def param_norm_R(self) -> Tensor:
        return global_norms_R([self.params[n] for n, _ in self.template.named_parameters()])

    def _flagged_losses(self, loss: Tensor, means_R: dict[str, Tensor]) -> Tensor:
        return means_R["loss"]  # each run's own (``loss`` is their sum)

    def _update(self, step: int | Tensor, grads: Tensor | None) -> None:
        assert grads is not None
        self.optimizer.update(step, grads)

    def _step_graph(self) -> StackedStepGraph:
        return StackedStepGraph(self)

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

    def eval_forward(self, x_RxBx: Tensor) -> Tensor:
        return self._forward_eval(self.params, self.buffers, x_RxBx, None)[0]

    # --------------------------------------------------------------------------- checkpoints
    def _lone_run(self, r: int, step: int) -> tuple[nn.Module, torch.optim.AdamW]:
        model = copy.deepcopy(self.template)
        with torch.no_grad():
            model.load_state_dict(
                {**{k: v[r] for k, v in self.params.items()}, **{k: v[r] for k, v in self.buffers.items()}}
            )
        return model, self.optimizer.to_adamw(r, model, self.columns, step)

    @torch.no_grad()
    def _store_run(self, r: int, model: nn.Module, optimizer: torch.optim.AdamW) -> None:
        for n, p in model.named_parameters():
            self.params[n][r] = p.to(self.device)
        for n, b in model.named_buffers():
            self.buffers[n][r] = b.to(self.device)
        self.optimizer.load_adamw(r, optimizer, model, self.columns)


class StackedStepGraph(EngineGraph):
    """``train.graph_step`` for a stack: the stacked AdamW reads its schedule row on the device, from
    the table of the step's chunk, loaded before each replay. The parameters and the AdamW moments are
    already fixed buffers (``flat_RxN``, its moments)."""

    engine: StackedEngine

    def _load_step(self, step: int) -> None:
        self.engine.optimizer.load_schedule(step)  # the captured step reads the row of its chunk

    def _snapshot_state(self) -> list[Tensor]:
        opt = self.engine.optimizer
        return [t.clone() for t in (opt.flat_RxN, opt.exp_avg_RxN, opt.exp_avg_sq_RxN)]

    def _restore_state(self, snap: list[Tensor]) -> None:
        opt = self.engine.optimizer
        for t, saved in zip((opt.flat_RxN, opt.exp_avg_RxN, opt.exp_avg_sq_RxN), snap):
            t.copy_(saved)
