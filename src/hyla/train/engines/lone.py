"""The lone engine: one run (one model, ``torch.optim.AdamW``), optionally over DDP processes.

It owns what only a lone run has: DDP (``torchrun``), ``torch.compile`` of the model module,
``torch.optim.AdamW`` and its ``train.graph_step`` (``WholeStepGraph``). The setup, the micro-batch loop and
the checkpoint format are ``Engine``'s; the shell (``hyla.train.loop``)
drives it as an engine of one run.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from hyla.models import num_parameters
from hyla.tasks.base import Batch
from hyla.train.build import build_model
from hyla.train.config import ExperimentConfig
from hyla.train.engines.base import Engine, EngineGraph, autocast, eval_mode, global_norms_R
from hyla.train.engines.optim import build_optimizer, lr_at
from hyla.train.seeds import KERNEL_CHECK_SEED


class LoneEngine(Engine):
    """One run of ``cfg``; ``run_dir`` is where a text task finds its saved tokenizer."""

    def __init__(self, cfg: ExperimentConfig, run_dir: Path, device: str = "cpu") -> None:
        super().__init__([cfg], device, run_dir)

    def _build(self) -> None:
        self.model = build_model(self.cfg, self.task).to(self.device)
        self.optimizer = build_optimizer(self.model, self.cfg, self.device, capturable=self.cfg.train.graph_step)
        self.forward_model: nn.Module = self.model
        if self.dist.world > 1:
            self.forward_model = nn.parallel.DistributedDataParallel(
                self.model, device_ids=[self.dist.local_rank] if self.device.type == "cuda" else None
            )
        if self.compile_mode is not None:
            self._verify_kernels_eagerly()
            self.forward_model = torch.compile(self.forward_model, mode=self.compile_mode)  # type: ignore[assignment]

    def describe(self, names: list[str], steps: int) -> str:
        line = f"{names[0]}: {num_parameters(self.model):,} parameters, {steps} steps, device {self.device}"
        return line + (f"\n{self.task.describe()}" if self.task.describe() else "")

    def _verify_kernels_eagerly(self) -> None:
        """One eager forward on two problems before compiling: ``backend="auto"`` self-tests the fused
        kernel for this model's signatures only outside ``torch.compile`` tracing. Uses its own
        generator and eval mode, so the run's data and random streams are untouched."""
        if self.device.type != "cuda":
            return
        batch = self.task.sample(2, "train", torch.Generator(self.device).manual_seed(KERNEL_CHECK_SEED))
        with self.evaluation(), torch.no_grad(), autocast(self.cfg, self.device):
            self.model(batch.inputs, last_positions=self.task.num_output_positions)

    # ----------------------------------------------------------------- steps
    def train_step(self, step: int) -> None:
        if self.graph is None:  # a captured step reads its learning rate from a device tensor
            lr = lr_at(step, self.cfg)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.optimizer.zero_grad(set_to_none=True)
        super().train_step(step)

    def _sync(self, last: bool) -> AbstractContextManager[Any]:
        if isinstance(self.forward_model, nn.parallel.DistributedDataParallel) and not last:
            return self.forward_model.no_sync()  # all-reduce once, after the last micro-batch
        return nullcontext()

    def _forward_loss(self, batches: list[Batch]) -> tuple[Tensor, Batch, Tensor]:
        (batch,) = batches
        out = self.forward_model(batch.inputs, last_positions=self.task.num_output_positions).float()
        loss = self.task.loss(out, batch)
        if self.cfg.model.moe_experts:
            loss = loss + self.cfg.train.moe_aux_weight * self.model.aux_loss
        return out, batch, loss

    def _backward(self, loss: Tensor, grads: Tensor | None) -> None:
        loss.backward()  # into the parameters' .grad

    def _flagged_losses(self, loss: Tensor, means_R: dict[str, Tensor]) -> Tensor:
        return loss.detach().view(1)  # the loss optimized, the MoE term included

    def _grad_norm_R(self, grads: Tensor | None) -> Tensor:
        return global_norms_R([p.grad.unsqueeze(0) for p in self.model.parameters() if p.grad is not None])

    def param_norm_R(self) -> Tensor:
        return global_norms_R([p.unsqueeze(0) for p in self.model.parameters()])

    def _update(self, step: int | Tensor, grads: Tensor | None) -> None:
        self.optimizer.step()

    def _step_graph(self) -> WholeStepGraph:
        return WholeStepGraph(self)

    def evaluation(self) -> AbstractContextManager[None]:
        return eval_mode(self.model)

    def eval_forward(self, x_RxBx: Tensor) -> Tensor:
        return self.model(x_RxBx[0], last_positions=self.task.num_output_positions).unsqueeze(0)

    def _lone_run(self, r: int, step: int) -> tuple[nn.Module, torch.optim.AdamW]:
        return self.model, self.optimizer


class WholeStepGraph(EngineGraph):
    """``train.graph_step`` for a lone run: fused AdamW is ``capturable``, its learning rate a device
    tensor written before each replay. A step is then one graph launch plus one scalar write, instead of
    hundreds of kernel launches with Python between them (the same losses within floating-point
    reordering; tests/train/test_stacked.py checks it on CUDA)."""

    engine: LoneEngine

    def __init__(self, engine: LoneEngine) -> None:
        super().__init__(engine)
        self.lr = torch.zeros((), dtype=torch.float32, device=engine.device)

    def _load_step(self, step: int) -> None:
        self.lr.fill_(lr_at(step, self.engine.cfg))  # a kernel argument, no host synchronization

    def _before_capture(self) -> None:
        for group in self.engine.optimizer.param_groups:  # also after a resume replaced them with the saved floats
            group["lr"] = self.lr
        super()._before_capture()

    def _clear_grads(self) -> None:
        self.engine.optimizer.zero_grad(set_to_none=True)

    def _snapshot_state(self) -> dict[str, Any]:
        e = self.engine
        opt_state = {
            id(p): {k: v.clone() if isinstance(v, Tensor) else v for k, v in e.optimizer.state[p].items()}
            for p in e.model.parameters()
            if p in e.optimizer.state
        }
        return {"params": [p.detach().clone() for p in e.model.parameters()], "opt": opt_state}

    def _restore_state(self, snap: dict[str, Any]) -> None:
        e = self.engine
        for p, saved in zip(e.model.parameters(), snap["params"]):
            p.copy_(saved)
        for p in e.model.parameters():
            saved_state = snap["opt"].get(id(p))
            for k, v in e.optimizer.state[p].items():
                if not isinstance(v, Tensor):
                    continue
                if saved_state is None:  # created by the warm-up of a fresh run: AdamW starts from zeros
                    v.zero_()
                else:
                    v.copy_(saved_state[k])
