"""The training loop: fresh problems every step, periodic evaluation, exact resume, DDP.

Determinism contract: with the same config, a run interrupted by ``--stop-at-step`` (or a signal)
and resumed writes the same ``metrics.jsonl`` as an uninterrupted run, bit for bit on CPU. Everything
random is drawn from generators whose states are checkpointed, and every metric written is a
function of the step alone (timing goes only to the progress bar and TensorBoard).
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor, nn

from hyla.models import num_parameters
from hyla.train.build import build_model, build_task
from hyla.train.checkpoint import (
    CheckpointError,
    TrainingState,
    config_differences,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from hyla.train.config import ExperimentConfig, _merge
from hyla.train.fast import WholeStepGraph, compile_mode, graph_step_unsupported_reason, uses_cudagraphs
from hyla.train.optim import build_optimizer, lr_at
from hyla.train.rundir import append_metrics, check_new_or_resumable, truncate_metrics_after, write_config

#: config keys that may change between an interrupted run and its resumption
RESUMABLE_CHANGES = (
    "train.steps",
    "train.eval_every",
    "train.log_every",
    "train.checkpoint_every",
    "train.stack_forward",
    "train.graph_step",
)


def resume_differences(saved: dict[str, Any], cfg: ExperimentConfig) -> list[str]:
    """What differs between a checkpoint's config and ``cfg``, beyond :data:`RESUMABLE_CHANGES`. A key the
    checkpoint lacks (written before the option existed) counts as that option's default."""
    saved = _merge(ExperimentConfig().to_dict(), saved)
    return [d for d in config_differences(saved, cfg.to_dict()) if not d.startswith(RESUMABLE_CHANGES)]


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # a run saves a checkpoint and exits on these
T = TypeVar("T")


class NonFiniteLossError(RuntimeError):
    pass


class Interrupted(Exception):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class DrivenTrainer(Protocol):
    """What :func:`drive` needs of a trainer (the lone :class:`Trainer` and the stacked one)."""

    cfg: ExperimentConfig
    step: int
    stop_at_step: int | None
    deadline: float | None  # time.monotonic() by which the run stops with a checkpoint (a time budget)

    def train_step(self) -> None: ...
    def save(self) -> None: ...
    def _check_finite(self) -> None: ...


def drive(
    trainer: DrivenTrainer,
    *,
    log: Callable[[int, float], None],
    evaluate: Callable[[int], T],
    say: Callable[[str], None],
    after_step: Callable[[], None] | None = None,
) -> T | None:
    """Train ``trainer`` to ``train.steps``: ``log(step, steps_per_s)`` every ``log_every`` steps,
    ``evaluate(step)`` every ``eval_every`` and a checkpoint every ``checkpoint_every`` (all three at
    the last step), stopping with a checkpoint at ``trainer.stop_at_step``, once ``time.monotonic()``
    passes ``trainer.deadline``, or on SIGINT / SIGTERM (then :class:`Interrupted` is raised). Every
    stop checks for a non-finite loss first, so no checkpoint holds a diverged model. Returns the last
    evaluation (None if there was none)."""
    t = trainer.cfg.train
    caught: list[int] = []
    old_handlers = {s: signal.signal(s, lambda signum, frame: caught.append(signum)) for s in STOP_SIGNALS}
    last: T | None = None
    t_last, step_last = time.perf_counter(), trainer.step
    try:
        while trainer.step < t.steps:
            trainer.train_step()
            s = trainer.step
            if s % t.log_every == 0 or s == t.steps:
                trainer._check_finite()  # reads the device: the time below includes the queued work
                now = time.perf_counter()
                steps_per_s = (s - step_last) / max(now - t_last, 1e-9)
                t_last, step_last = now, s
                log(s, steps_per_s)
            if s % t.eval_every == 0 or s == t.steps:
                trainer._check_finite()
                last = evaluate(s)
            if s % t.checkpoint_every == 0 or s == t.steps:
                trainer._check_finite()
                trainer.save()
            if after_step is not None:
                after_step()
            if trainer.stop_at_step is not None and trainer.stop_at_step <= s < t.steps:
                trainer._check_finite()
                trainer.save()
                say(f"stopped at step {s} (--stop-at-step); resume with --resume")
                break
            if trainer.deadline is not None and time.monotonic() >= trainer.deadline and s < t.steps:
                trainer._check_finite()
                trainer.save()
                say(f"stopped at step {s} (time budget); resume with --resume")
                break
            if caught:
                trainer._check_finite()
                trainer.save()
                raise Interrupted(caught[0])
    finally:
        for s_, h in old_handlers.items():
            signal.signal(s_, h)
    return last


@dataclass
class Dist:
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


# ------------------------------------------------------------------------------ the trainer
class Trainer:
    def __init__(
        self,
        cfg: ExperimentConfig,
        run_dir: Path,
        *,
        device: str = "cpu",
        resume: bool = False,
        stop_at_step: int | None = None,
        quiet: bool = False,
        progress: bool = True,
    ) -> None:
        self.cfg, self.run_dir, self.quiet = cfg, Path(run_dir), quiet
        self.stop_at_step = stop_at_step
        self.deadline: float | None = None
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError("--device cuda asked for, but no CUDA device is available (allowed here: cpu)")
        self.dist = init_distributed(device)
        self.device = torch.device(
            f"cuda:{self.dist.local_rank}" if device == "cuda" and self.dist.world > 1 else device
        )
        if cfg.train.batch_size % self.dist.world:
            raise ValueError(
                f"train.batch_size={cfg.train.batch_size} must be divisible by the number of processes "
                f"({self.dist.world}): the global batch is split over them"
            )
        self.task = build_task(cfg, self.run_dir)
        self.model = build_model(cfg, self.task).to(self.device)
        cfg.validate()
        self._graph: WholeStepGraph | None = None
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
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = cfg.train.tf32
            torch.backends.cudnn.allow_tf32 = cfg.train.tf32
        self.data_gen = torch.Generator(self.device).manual_seed(cfg.data_seed * 1009 + self.dist.rank)
        self.step = 0
        self._acc: dict[str, Tensor] = {}
        self._nonfinite_step = torch.full((), -1, dtype=torch.long, device=self.device)
        self.progress = progress and not quiet and self.dist.is_main
        self._prepare_run_dir(resume)
        if cfg.train.graph_step:
            self._graph = WholeStepGraph(self, ("loss", self.task.primary_metric))
        self.writer = None
        if self.dist.is_main:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.run_dir / "tb"))

    # ----------------------------------------------------------------- run directory and resume
    def _prepare_run_dir(self, resume: bool) -> None:
        ckpt = check_new_or_resumable(self.run_dir, resume)
        if ckpt is not None:
            self._restore(load_checkpoint(ckpt))
        if self.dist.is_main:
            write_config(self.run_dir, self.cfg)
            if hasattr(self.task, "save_tokenizer"):
                self.task.save_tokenizer(self.run_dir / "tokenizer.json")
            truncate_metrics_after(self.run_dir, self.step)

    def _restore(self, state: TrainingState) -> None:
        diffs = resume_differences(state.config, self.cfg)
        if diffs:
            raise CheckpointError(
                "the checkpoint was written by a different configuration; refusing to resume:\n  " + "\n  ".join(diffs)
            )
        if state.extra.get("world_size", 1) != self.dist.world:
            raise CheckpointError(
                f"the checkpoint was written by {state.extra.get('world_size')} processes, now {self.dist.world}; "
                "resume with the same number of processes"
            )
        try:
            self.model.load_state_dict(state.model)
            self.optimizer.load_state_dict(state.optimizer)
        except (RuntimeError, ValueError, KeyError) as err:
            raise CheckpointError(f"checkpoint does not fit this model/optimizer: {err}") from err
        self.step = state.step
        self.data_gen.set_state(state.rng[f"data_rank{self.dist.rank}"].to(torch.uint8))
        torch.set_rng_state(state.rng["torch_cpu"].to(torch.uint8))
        if self.device.type == "cuda" and "torch_cuda" in state.rng:  # attention dropout draws from it
            torch.cuda.set_rng_state(state.rng["torch_cuda"].to(torch.uint8), self.device)
        self._acc = {k.removeprefix("acc_"): v.to(self.device) for k, v in state.rng.items() if k.startswith("acc_")}

    def save(self) -> None:
        rng = {"torch_cpu": torch.get_rng_state()}
        if self.device.type == "cuda":
            rng["torch_cuda"] = torch.cuda.get_rng_state(self.device)
        gen_state = self.data_gen.get_state()
        if self.dist.world > 1:
            states: list[Any] = [None] * self.dist.world
            dist.all_gather_object(states, gen_state.cpu())
            rng.update({f"data_rank{r}": s for r, s in enumerate(states)})
        else:
            rng["data_rank0"] = gen_state
        rng.update({f"acc_{k}": v.detach() for k, v in self._acc.items()})
        if self.dist.is_main:
            save_checkpoint(
                self.run_dir,
                TrainingState(
                    self.step,
                    self.cfg.to_dict(),
                    self.model.state_dict(),
                    self.optimizer.state_dict(),
                    rng,
                    {"world_size": self.dist.world},
                ),
            )
        if self.dist.world > 1:
            dist.barrier()

    # ----------------------------------------------------------------- metrics
    def _log(self, step: int, split: str, values: dict[str, float]) -> None:
        if not self.dist.is_main:
            return
        append_metrics(self.run_dir, step, split, values)
        if self.writer is not None:
            for k, v in values.items():
                self.writer.add_scalar(f"{split}/{k}", v, step)

    def _verify_kernels_eagerly(self) -> None:
        """One eager forward on two problems before compiling: ``backend="auto"`` self-tests the fused
        kernel for this model's signatures only outside ``torch.compile`` tracing. Uses its own
        generator and eval mode, so the run's data and random streams are untouched."""
        if self.device.type != "cuda":
            return
        batch = self.task.sample(2, "train", torch.Generator(self.device).manual_seed(0))
        was_training = self.model.training
        self.model.eval()
        with torch.no_grad(), self._autocast():
            self.model(batch.inputs, last_positions=self.task.num_output_positions)
        self.model.train(was_training)

    def _autocast(self) -> Any:
        if not self.cfg.train.bf16:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    @torch.no_grad()
    def evaluate(self) -> dict[str, dict[str, float]]:
        """Mean per-problem metrics over ``eval_size`` problems of every split (same problems each time)."""
        t = self.cfg.train
        self.model.eval()
        results = {}
        for i, split in enumerate(self.task.splits):
            gen = torch.Generator(self.device).manual_seed(t.eval_seed * 101 + i)
            sums: dict[str, Tensor] = {}
            count = 0
            batches = math.ceil(t.eval_size / t.eval_batch_size)
            for b in range(batches):
                n = min(t.eval_batch_size, t.eval_size - b * t.eval_batch_size)
                batch = self.task.sample(n, split, gen)  # every rank draws all batches: identical streams
                if b % self.dist.world != self.dist.rank:
                    continue
                with self._autocast():
                    out = self.model(batch.inputs, last_positions=self.task.num_output_positions)
                for k, v in self.task.metrics(out.float(), batch).items():
                    sums[k] = sums.get(k, 0) + v.double().sum()
                count += n
            keys = sorted(sums)
            vec = torch.stack(
                [sums[k] for k in keys] + [torch.tensor(float(count), dtype=torch.float64, device=self.device)]
            )
            if self.dist.world > 1:
                dist.all_reduce(vec)
            results[split] = self.task.summarize({k: (vec[j] / vec[-1]).item() for j, k in enumerate(keys)})
        self.model.train()
        return results

    # ----------------------------------------------------------------- the loop
    def train_step(self) -> None:
        if self._graph is not None:
            self._graph.replay(self.step, lr_at(self.step, self.cfg))
        else:
            for group in self.optimizer.param_groups:
                group["lr"] = lr_at(self.step, self.cfg)
            self.optimizer.zero_grad(set_to_none=True)
            self._step_body(self.step + 1, in_place=False)
        self.step += 1

    def _step_body(self, next_step: int | Tensor, *, in_place: bool) -> None:
        """Sampling, forward, backward, AdamW and the metric sums of one step. ``in_place`` (a step captured
        by ``train.graph_step``) updates the sums and the non-finite flag in their buffers."""
        t = self.cfg.train
        accum = t.grad_accum_steps
        zero = torch.zeros((), dtype=torch.float64, device=self.device)
        for micro in range(accum):
            if self._cudagraphs:  # the previous forward's CUDA-graph outputs are no longer needed
                torch.compiler.cudagraph_mark_step_begin()
            batch = self.task.sample(t.batch_size // self.dist.world // accum, "train", self.data_gen)
            last = micro == accum - 1
            ddp = isinstance(self.forward_model, nn.parallel.DistributedDataParallel)
            with self.forward_model.no_sync() if ddp and not last else nullcontext():  # all-reduce once
                with self._autocast():
                    out = self.forward_model(batch.inputs, last_positions=self.task.num_output_positions)
                    loss = self.task.loss(out.float(), batch)
                    if self.cfg.model.moe_experts:
                        loss = loss + t.moe_aux_weight * self.model.aux_loss
                bad = ~torch.isfinite(loss.detach())
                flag = torch.where(bad & (self._nonfinite_step < 0), next_step, self._nonfinite_step)
                if in_place:
                    self._nonfinite_step.copy_(flag)
                else:
                    self._nonfinite_step = flag
                (loss / accum).backward()
            with torch.no_grad():
                m = self.task.metrics(out.detach().float(), batch)
                for k in ("loss", self.task.primary_metric):
                    if in_place:
                        self._acc[k].add_(m[k].double().mean() / accum)
                    else:
                        self._acc[k] = self._acc.get(k, zero) + m[k].double().mean() / accum
        self.optimizer.step()
        if in_place:
            self._acc["_n"].add_(1)
        else:
            self._acc["_n"] = self._acc.get("_n", zero) + 1

    def _check_finite(self) -> None:
        bad_step = int(self._nonfinite_step.item())
        if bad_step >= 0:
            raise NonFiniteLossError(
                f"loss became NaN/inf at step {bad_step}; stopped. The last good checkpoint "
                f"({latest_checkpoint(self.run_dir) or 'none yet'}) is kept; lower train.lr or try train.bf16=false"
            )

    def _flush_train_metrics(self) -> dict[str, float]:
        n = self._acc.get("_n")
        if n is None:
            return {}
        keys = sorted(k for k in self._acc if k != "_n")
        vec = torch.stack([self._acc[k] for k in keys] + [n])
        if self.dist.world > 1:
            dist.all_reduce(vec)
            vec = vec / self.dist.world
        vec = vec.tolist()
        if self._graph is not None:  # the captured step adds into these buffers: keep them, zeroed
            for v in self._acc.values():
                v.zero_()
        else:
            self._acc = {}
        if vec[-1] == 0:
            return {}
        return self.task.summarize({k: vec[j] / vec[-1] for j, k in enumerate(keys)})

    def run(self) -> dict[str, dict[str, float]]:
        t = self.cfg.train
        bar = None
        if self.progress:
            from tqdm import tqdm

            bar = tqdm(total=t.steps, initial=self.step, dynamic_ncols=True, desc=self.cfg.name)
        if self.step == 0 and self.dist.is_main:
            self._say(
                f"{self.cfg.name}: {num_parameters(self.model):,} parameters, {t.steps} steps, device {self.device}"
            )
            if self.task.describe():
                self._say(self.task.describe())

        def log(s: int, steps_per_s: float) -> None:
            train_metrics = self._flush_train_metrics()
            self._log(s, "train_batch", {**train_metrics, "lr": lr_at(s - 1, self.cfg)})
            if self.writer is not None:
                self.writer.add_scalar("perf/steps_per_s", steps_per_s, s)
                self.writer.add_scalar("perf/problems_per_s", steps_per_s * t.batch_size, s)
                if self.cfg.data.task == "text":
                    self.writer.add_scalar("perf/tokens_per_s", steps_per_s * t.batch_size * self.task.seq_len, s)
            summary = {k: f"{v:.4g}" for k, v in train_metrics.items()} | {"it/s": f"{steps_per_s:.1f}"}
            if bar is not None:
                bar.set_postfix(summary)
            elif self.quiet and self.dist.is_main:
                self._say(f"step {s}/{t.steps} " + " ".join(f"{k}={v}" for k, v in summary.items()))

        def evaluate(s: int) -> dict[str, dict[str, float]]:
            results = self.evaluate()
            for split, values in results.items():
                self._log(s, split, values)
            if self.quiet and self.dist.is_main:
                metric = self.task.primary_metric
                self._say(f"eval step {s}: " + ", ".join(f"{sp} {metric}={v[metric]:.4f}" for sp, v in results.items()))
            return results

        try:
            last = drive(self, log=log, evaluate=evaluate, say=self._say, after_step=bar.update if bar else None)
        finally:
            if bar is not None:
                bar.close()
            if self.writer is not None:
                self.writer.flush()
        return last or {}

    def _say(self, text: str) -> None:
        if self.dist.is_main:
            print(text, flush=True)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.dist.world > 1 and dist.is_initialized():
            # tearing gloo down while the other rank is still in a collective aborts the process
            dist.barrier()
            dist.destroy_process_group()
