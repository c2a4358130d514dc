"""The lone engine: one run (one model, ``torch.optim.AdamW``), optionally over DDP processes.

It owns what only a lone run has: DDP (``torchrun``), ``torch.compile`` of the model, the MoE
auxiliary loss, and ``train.graph_step`` (:class:`WholeStepGraph`). The shell
(:mod:`hyla.train.loop`) drives it as an engine of one run.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from hyla.models import num_parameters
from hyla.train.build import build_model, build_task, sized_config
from hyla.train.checkpoint import CheckpointError, TrainingState
from hyla.train.config import ExperimentConfig
from hyla.train.engine import StepSums, autocast, check_device, eval_mode, generator_states, init_distributed, set_tf32
from hyla.train.fast import StepGraph, compile_mode, graph_step_unsupported_reason, uses_cudagraphs
from hyla.train.optim import build_optimizer, lr_at


class LoneEngine:
    """One run of ``cfg``; ``run_dir`` is where a text task finds its saved tokenizer."""

    num_runs = 1

    def __init__(self, cfg: ExperimentConfig, run_dir: Path, device: str = "cpu") -> None:
        check_device(device)
        self.dist = init_distributed(device)
        self.world_size = self.dist.world
        self.device = torch.device(
            f"cuda:{self.dist.local_rank}" if device == "cuda" and self.dist.world > 1 else device
        )
        if cfg.train.batch_size % self.dist.world:
            raise ValueError(
                f"train.batch_size={cfg.train.batch_size} must be divisible by the number of processes "
                f"({self.dist.world}): the global batch is split over them"
            )
        cfg.validate()
        self.task = build_task(cfg, run_dir)
        self.cfg = cfg = sized_config(cfg, self.task)
        self.cfgs = [cfg]
        self.model = build_model(cfg, self.task).to(self.device)
        if cfg.train.graph_step:
            reason = graph_step_unsupported_reason(self.device, self.dist.world)
            if reason is not None:
                raise ValueError(f"train.graph_step=true {reason}; allowed values here: false")
        self.optimizer = build_optimizer(self.model, cfg, self.device, capturable=cfg.train.graph_step)
        self.forward_model: nn.Module = self.model
        if self.dist.world > 1:
            self.forward_model = nn.parallel.DistributedDataParallel(
                self.model, device_ids=[self.dist.local_rank] if self.device.type == "cuda" else None
            )
        mode = compile_mode(cfg.train, self.device, distributed=self.dist.world > 1)  # train.compile / train.fast
        if cfg.train.graph_step and uses_cudagraphs(mode, self.device):
            mode = "default" if mode == "reduce-overhead" else "max-autotune-no-cudagraphs"  # the whole step is one
        self._cudagraphs = uses_cudagraphs(mode, self.device)
        if mode is not None:
            self._verify_kernels_eagerly()
            self.forward_model = torch.compile(self.forward_model, mode=mode)  # type: ignore[assignment]
        set_tf32(cfg, self.device)
        self.data_gen = torch.Generator(self.device).manual_seed(cfg.data_seed * 1009 + self.dist.rank)
        self.sums = StepSums(1, ("loss", self.task.primary_metric), self.device)
        self.graph = WholeStepGraph(self) if cfg.train.graph_step else None

    def describe(self, names: list[str], steps: int) -> str:
        line = f"{names[0]}: {num_parameters(self.model):,} parameters, {steps} steps, device {self.device}"
        return line + (f"\n{self.task.describe()}" if self.task.describe() else "")

    def _verify_kernels_eagerly(self) -> None:
        """One eager forward on two problems before compiling: ``backend="auto"`` self-tests the fused
        kernel for this model's signatures only outside ``torch.compile`` tracing. Uses its own
        generator and eval mode, so the run's data and random streams are untouched."""
        if self.device.type != "cuda":
            return
        batch = self.task.sample(2, "train", torch.Generator(self.device).manual_seed(0))
        with self.evaluation(), torch.no_grad(), autocast(self.cfg, self.device):
            self.model(batch.inputs, last_positions=self.task.num_output_positions)

    # ----------------------------------------------------------------- steps
    def train_step(self, step: int) -> None:
        lr = lr_at(step, self.cfg)
        if self.graph is not None:
            self.graph.replay(step, lr)
            return
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        self.step_body(step + 1)

    def step_body(self, next_step: int | Tensor) -> None:
        """Sampling, forward, backward, AdamW and the step sums of 1-based step ``next_step`` (a device
        tensor inside a captured step)."""
        t = self.cfg.train
        accum = t.grad_accum_steps
        ddp = isinstance(self.forward_model, nn.parallel.DistributedDataParallel)
        for micro in range(accum):
            if self._cudagraphs:  # the previous forward's CUDA-graph outputs are no longer needed
                torch.compiler.cudagraph_mark_step_begin()
            batch = self.task.sample(t.batch_size // self.dist.world // accum, "train", self.data_gen)
            last = micro == accum - 1
            with self.forward_model.no_sync() if ddp and not last else nullcontext():  # all-reduce once
                with autocast(self.cfg, self.device):
                    out = self.forward_model(batch.inputs, last_positions=self.task.num_output_positions)
                    loss = self.task.loss(out.float(), batch)
                    if self.cfg.model.moe_experts:
                        loss = loss + t.moe_aux_weight * self.model.aux_loss
                (loss / accum).backward()
            with torch.no_grad():
                m = self.task.metrics(out.detach().float(), batch)
                means = {k: (m[k].double().mean() / accum).view(1) for k in self.sums.keys}
                self.sums.add(means, loss.detach().view(1), next_step)
        self.optimizer.step()

    def evaluation(self) -> AbstractContextManager[None]:
        return eval_mode(self.model)

    def eval_forward(self, x: Tensor) -> Tensor:
        return self.model(x, last_positions=self.task.num_output_positions).unsqueeze(0)

    # ----------------------------------------------------------------- checkpoints
    def export_run(self, r: int, step: int) -> tuple[dict[str, Tensor], dict[str, Any], dict[str, Tensor]]:
        rng = {"torch_cpu": torch.get_rng_state()}
        if self.device.type == "cuda":  # attention dropout draws from it
            rng["torch_cuda"] = torch.cuda.get_rng_state(self.device)
        rng.update(generator_states(self.data_gen, self.dist))
        return self.model.state_dict(), self.optimizer.state_dict(), rng

    def load_run(self, r: int, state: TrainingState) -> None:
        try:
            self.model.load_state_dict(state.model)
            self.optimizer.load_state_dict(state.optimizer)
        except (RuntimeError, ValueError, KeyError) as err:
            raise CheckpointError(f"checkpoint does not fit this model/optimizer: {err}") from err
        self.data_gen.set_state(state.rng[f"data_rank{self.dist.rank}"].to(torch.uint8))
        torch.set_rng_state(state.rng["torch_cpu"].to(torch.uint8))
        if self.device.type == "cuda" and "torch_cuda" in state.rng:
            torch.cuda.set_rng_state(state.rng["torch_cuda"].to(torch.uint8), self.device)

    def close(self) -> None:
        pass


class WholeStepGraph(StepGraph):
    """``train.graph_step``: a lone run's whole training step as one CUDA graph, replayed every step.

    Sampling, forward, loss, backward, fused AdamW (``capturable``, the learning rate a device tensor
    written before each replay), the step sums and the non-finite flag are captured once: a step is
    then one graph launch plus one scalar write, instead of hundreds of kernel launches with Python
    between them (the same losses within floating-point reordering; tests/test_stacked.py checks it on
    CUDA).
    """

    def __init__(self, engine: LoneEngine) -> None:
        super().__init__(engine.device)
        self.engine = engine
        self.lr = torch.zeros((), dtype=torch.float32, device=engine.device)

    def replay(self, step: int, lr: float) -> None:
        """Run step ``step`` (0-based) with learning rate ``lr``; captures the graph on first use."""
        self.lr.fill_(lr)  # a kernel argument, no host synchronization
        self._replay(step)

    def _body(self) -> None:
        self.engine.step_body(self.step_count + 1)
        self.step_count.add_(1)

    def _generators(self) -> list[torch.Generator]:
        return [self.engine.data_gen]

    def _before_capture(self) -> None:
        for group in self.engine.optimizer.param_groups:  # also after a resume replaced them with the saved floats
            group["lr"] = self.lr
        self.engine.sums.fix_buffers()

    def _clear_grads(self) -> None:
        self.engine.optimizer.zero_grad(set_to_none=True)

    @torch.no_grad()
    def _snapshot(self) -> dict[str, Any]:
        e = self.engine
        opt_state = {
            id(p): {k: v.clone() if isinstance(v, Tensor) else v for k, v in e.optimizer.state[p].items()}
            for p in e.model.parameters()
            if p in e.optimizer.state
        }
        return {
            "params": [p.detach().clone() for p in e.model.parameters()],
            "opt": opt_state,
            "data_gen": e.data_gen.get_state(),
            "cuda_rng": torch.cuda.get_rng_state(e.device),
            "cpu_rng": torch.get_rng_state(),
            "sums": e.sums.snapshot(),
        }

    @torch.no_grad()
    def _restore(self, snap: dict[str, Any]) -> None:
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
        e.data_gen.set_state(snap["data_gen"])
        torch.cuda.set_rng_state(snap["cuda_rng"], e.device)
        torch.set_rng_state(snap["cpu_rng"])
        e.sums.restore(snap["sums"])
