"""The training shell: one loop over R runs (R = 1 for a lone run), driving an engine.

``Trainer`` owns, once for both run shapes: the loop, evaluation, metric flushing, logging, the
non-finite check, checkpoints (save, resume) and signals. The engine (``hyla.train.engines.lone`` or
``hyla.train.engines.stacked``, both a ``Engine``) owns the models, the step
and the optimizer. ``self.step`` follows the engine's convention: the number of updates made.

Determinism contract: with the same config, a run interrupted by ``--stop-at-step`` (or a signal)
and resumed writes the same metrics file as an uninterrupted run, bit for bit on CPU. Everything
random is drawn from generators whose states are checkpointed, and every metric written is a
function of the step alone (timing goes only to the progress bar and TensorBoard).
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from hyla.runtime import tensorboard_installed
from hyla.train.config import RESUMABLE_CHANGES, ExperimentConfig, _merge
from hyla.train.engines.base import Engine, autocast
from hyla.train.engines.optim import lr_at
from hyla.train.run.checkpoint import (
    CheckpointError,
    TrainingState,
    config_differences,
    latest_checkpoint,
    load_checkpoint,
    load_weights,
    remove_interrupted_writes,
    save_checkpoint,
    save_weights,
)
from hyla.train.run.folder import (
    CONFIG,
    FINAL_WEIGHTS,
    append_metrics,
    check_new_or_resumable,
    record_config_changes,
    truncate_metrics_after,
    write_config,
)
from hyla.train.seeds import eval_split_seed
from hyla.train.sweeps import engine_for

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # a run saves a checkpoint and exits on these
ENGINES = ("auto", "lone", "stacked")


def resume_differences(saved: dict[str, Any], cfg: ExperimentConfig) -> list[str]:
    """What differs between a checkpoint's config and ``cfg``, beyond ``RESUMABLE_CHANGES``. A key the
    checkpoint lacks (written before the option existed) counts as that option's default."""
    saved = _merge(ExperimentConfig().to_dict(), saved)
    return [d for d in config_differences(saved, cfg.to_dict()) if not d.startswith(RESUMABLE_CHANGES)]


class NonFiniteLossError(RuntimeError):
    """A loss became NaN/inf. ``bad``: (run index, step) of each run it did so in; ``bf16``: whether one of them
    trained in bf16 (what the commands' advice names)."""

    def __init__(self, message: str, bad: list[tuple[int, int]] | None = None, bf16: bool = False) -> None:
        super().__init__(message)
        self.bad, self.bf16 = bad or [], bf16


class Interrupted(Exception):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    def __reduce__(self) -> tuple[type, tuple[int]]:  # rebuilt from the signal number (e.g. from a worker)
        return (Interrupted, (self.signum,))


@dataclass
class Run:
    cfg: ExperimentConfig
    out: Path
    writer: Any = None  # TensorBoard, on the main process


def make_engine(cfgs: list[ExperimentConfig], outs: list[Path], engine: str, device: str) -> Engine:
    """``lone`` (one run), ``stacked`` (R >= 1 runs in one process) or ``auto`` (``engine_for``)."""
    if engine not in ENGINES:
        raise ValueError(f"engine={engine!r} is not valid; allowed values: {', '.join(ENGINES)}")
    if engine == "auto":
        engine = engine_for(cfgs)
    if engine == "lone":
        if len(cfgs) != 1:
            raise ValueError(f"the lone engine trains one run, got {len(cfgs)}; use engine='stacked'")
        from hyla.train.engines.lone import LoneEngine

        return LoneEngine(cfgs[0], outs[0], device)
    from hyla.train.engines.stacked import StackedEngine

    return StackedEngine(cfgs, device)


class Trainer:
    """Train ``cfgs`` (one config or a list) into ``run_dirs`` (one directory per run) with ``engine``.

    ``stop_at_step`` stops with a checkpoint at that step; so does passing ``deadline`` (a
    ``time.monotonic()`` value, set after construction) or ``stop_requested`` (a callable asked after
    every step, e.g. a sweep worker's stop event); SIGINT / SIGTERM save and raise ``Interrupted``.
    """

    def __init__(
        self,
        cfgs: ExperimentConfig | list[ExperimentConfig],
        run_dirs: Path | str | list[Path],
        *,
        engine: str = "auto",
        device: str = "cpu",
        resume: bool = False,
        stop_at_step: int | None = None,
        quiet: bool = False,
        progress: bool = True,
    ) -> None:
        cfgs = cfgs if isinstance(cfgs, list) else [cfgs]
        outs = [Path(p) for p in run_dirs] if isinstance(run_dirs, list) else [Path(run_dirs)]
        if len(cfgs) != len(outs):
            raise ValueError(f"run_dirs must hold one directory per run: {len(cfgs)} runs, {len(outs)} dirs")
        if len({p.resolve() for p in outs}) != len(outs):
            raise ValueError(f"run_dirs must be distinct, got {[str(p) for p in outs]}")
        self.engine = make_engine(cfgs, outs, engine, device)
        self.runs = [Run(cfg, out) for cfg, out in zip(self.engine.cfgs, outs)]  # model sized by the task
        self.cfg, self.task = self.runs[0].cfg, self.engine.task
        self.device, self.dist = self.engine.device, self.engine.dist
        self.stop_at_step, self.quiet = stop_at_step, quiet
        self.deadline: float | None = None
        self.stop_requested: Callable[[], bool] | None = None
        self.step = 0
        self.steps_since_log = 0
        self.progress = progress and not quiet and self.dist.is_main
        #: per resumed run folder, the settings this piece changed (``config_changes.jsonl``; ``{}``: none)
        self.config_changes: dict[Path, dict[str, Any]] = {}
        self._prepare_run_dirs(resume)
        if self.dist.is_main and tensorboard_installed(quiet):
            from torch.utils.tensorboard import SummaryWriter

            for run in self.runs:
                run.writer = SummaryWriter(str(run.out / "tb"))

    @property
    def num_runs(self) -> int:
        return len(self.runs)

    # ----------------------------------------------------------------- run directories and checkpoints
    def _prepare_run_dirs(self, resume: bool) -> None:
        for run in self.runs if self.dist.is_main else ():  # what a killed write left (its writer holds no lock now)
            remove_interrupted_writes(run.out)
        ckpts = [check_new_or_resumable(run.out, resume) for run in self.runs]
        if resume:
            self._restore([load_checkpoint(c) for c in ckpts if c is not None])
        if self.step == 0:
            self._load_initial_weights()
        if self.dist.is_main:
            for run, ckpt in zip(self.runs, ckpts):
                if ckpt is None or not (run.out / CONFIG).is_file():
                    write_config(run.out, run.cfg)
                else:  # config.yaml stays as created; what this piece runs otherwise is recorded beside it
                    self.config_changes[run.out] = record_config_changes(run.out, self.step, run.cfg)
                if hasattr(self.task, "save_tokenizer"):
                    self.task.save_tokenizer(run.out / "tokenizer.json")
                truncate_metrics_after(run.out, self.step)

    def _load_initial_weights(self) -> None:
        """``train.init_weights``: a fresh run's model takes these weights; its optimizer and random streams stay
        as built (the weights are copied into the built model, so nothing else draws differently)."""
        for r, run in enumerate(self.runs):
            path = run.cfg.train.init_weights
            if path is None:
                continue
            if not Path(path).is_file():
                raise ValueError(f"train.init_weights={path!r}: no such file (a safetensors of the model's weights)")
            _, optimizer, rng = self.engine.export_run(r, 0)
            try:
                self.engine.load_run(
                    r, TrainingState(0, run.cfg.to_dict(), load_weights(Path(path)), optimizer, rng, {})
                )
            except CheckpointError as err:  # load_state_dict's message names the missing and mis-shaped keys
                raise ValueError(f"train.init_weights={path!r} does not fit the model: {err}") from err

    def _restore(self, states: list[TrainingState]) -> None:
        for r, (run, state) in enumerate(zip(self.runs, states)):
            diffs = resume_differences(state.config, run.cfg)
            if diffs:
                raise CheckpointError(
                    f"{run.out}: the checkpoint was written by a different configuration; refusing to resume:\n  "
                    + "\n  ".join(diffs)
                )
            written_by = state.extra.get("world_size", 1)
            if written_by != self.engine.world_size:
                raise CheckpointError(
                    f"{run.out}: the checkpoint was written by {written_by} processes, now "
                    f"{self.engine.world_size}; resume with the same number of processes"
                )
            self.engine.load_run(r, state)
        steps = sorted({s.step for s in states})
        counts = sorted({s.metric_steps for s in states})
        if len(steps) != 1 or len(counts) != 1:
            raise CheckpointError(
                f"the stacked runs' checkpoints are at different steps {steps}; resume them one by one"
            )
        self.step, self.steps_since_log = steps[0], counts[0]
        if self.steps_since_log:
            try:
                self.engine.sums.load([s.metric_sums for s in states])
            except ValueError as err:
                raise CheckpointError(str(err)) from err

    def save(self) -> None:
        """One checkpoint per run, in the lone format; at the last step also the run's final weights
        (``FINAL_WEIGHTS``), which stay when its checkpoints are deleted."""
        for r, run in enumerate(self.runs):
            model, optimizer, rng = self.engine.export_run(r, self.step)
            if self.dist.is_main:
                extra = {"world_size": self.engine.world_size}
                state = TrainingState(self.step, run.cfg.to_dict(), model, optimizer, rng, extra)
                if self.steps_since_log:
                    state.metric_sums, state.metric_steps = self.engine.sums.run_sums(r), self.steps_since_log
                save_checkpoint(run.out, state)
                if self.step >= self.cfg.train.steps:
                    save_weights(run.out / FINAL_WEIGHTS, model)
        if self.dist.world > 1:
            dist.barrier()

    # ----------------------------------------------------------------- metrics
    def _log(self, run: Run, step: int, split: str, values: dict[str, float]) -> None:
        if not self.dist.is_main:
            return
        append_metrics(run.out, step, split, values)
        for k, v in values.items() if run.writer is not None else ():
            run.writer.add_scalar(f"{split}/{k}", v, step)

    def check_finite(self) -> None:
        """Raise ``NonFiniteLossError`` if a run's loss was NaN/inf (reads the device)."""
        bad = self.engine.sums.bad_runs()
        if not bad:
            return
        kept = latest_checkpoint(self.runs[bad[0][0]].out) or "none yet"
        bf16 = any(self.runs[r].cfg.train.bf16 for r, _ in bad)  # the advice (the commands') follows what applies
        if self.num_runs == 1:
            message = f"loss became NaN/inf at step {bad[0][1]}; stopped. The last good checkpoint ({kept}) is kept"
            raise NonFiniteLossError(message, bad, bf16)
        where = ", ".join(f"{self.runs[r].cfg.name} (step {s})" for r, s in bad)
        raise NonFiniteLossError(
            f"loss became NaN/inf in {where}; stopped all {self.num_runs} stacked runs. The last good "
            f"checkpoints ({kept}, ...) are kept",
            bad,
            bf16,
        )

    def _flush_train_metrics(self) -> list[dict[str, float]]:
        """Each run's mean step metrics since the last log (one host read for all runs)."""
        taken, n = self.engine.sums.take(), self.steps_since_log
        self.steps_since_log = 0
        if taken is None or n == 0:
            return [{} for _ in self.runs]
        keys, sums_RxK = taken
        if self.dist.world > 1:
            dist.all_reduce(sums_RxK)
            n *= self.dist.world
        return [self.task.summarize(dict(zip(keys, row))) for row in (sums_RxK / float(n)).tolist()]

    @torch.no_grad()
    def evaluate(self) -> list[dict[str, dict[str, float]]]:
        """Per run: mean per-problem metrics over ``eval_size`` problems of every split of its own task (the
        same problems each time: split ``i`` of each task draws from a generator seeded
        ``eval_split_seed(eval_seed, i)``, so a stacked run sees its lone run's problems)."""
        t, tasks = self.cfg.train, self.engine.tasks
        results: list[dict[str, dict[str, float]]] = [{} for _ in self.runs]
        with self.engine.evaluation():
            for i, split in enumerate(self.task.splits):
                gens = [torch.Generator(self.device).manual_seed(eval_split_seed(t.eval_seed, i)) for _ in tasks]
                sums: dict[str, Tensor] = {}
                count = 0
                for b in range(math.ceil(t.eval_size / t.eval_batch_size)):
                    n = min(t.eval_batch_size, t.eval_size - b * t.eval_batch_size)
                    drawn = [task.sample(n, split, gen) for task, gen in zip(tasks, gens)]  # every rank draws all
                    if b % self.dist.world != self.dist.rank:
                        continue
                    batches = [drawn[k] for k in self.engine.task_of]
                    with autocast(self.cfg, self.device):
                        out_RxBxPxO = self.engine.eval_forward(torch.stack([batch.inputs for batch in batches]))
                    per_run = [self.task.metrics(out_RxBxPxO[r].float(), batch) for r, batch in enumerate(batches)]
                    for k in per_run[0]:
                        s_R = torch.stack([m[k].double().sum() for m in per_run])
                        sums[k] = sums[k] + s_R if k in sums else s_R
                    count += n
                keys = sorted(sums)
                table = torch.stack([sums[k] for k in keys] + [torch.full_like(sums[keys[0]], count)], dim=1)
                if self.dist.world > 1:
                    dist.all_reduce(table)
                for r, row in enumerate((table[:, :-1] / table[:, -1:]).tolist()):
                    results[r][split] = self.task.summarize(dict(zip(keys, row)))
        return results

    # ----------------------------------------------------------------- the loop
    def train_step(self) -> None:
        self.engine.train_step(self.step)
        self.step += 1
        self.steps_since_log += 1

    def run(self) -> list[dict[str, dict[str, float]]]:
        """Train to ``train.steps``: log every ``log_every`` steps, evaluate every ``eval_every`` and save
        every ``checkpoint_every`` (all three at the last step); stop with a checkpoint at
        ``stop_at_step``, past ``deadline`` or on a signal. Every stop checks for a non-finite loss
        first, so no checkpoint holds a diverged model. Returns each run's last evaluation."""
        t = self.cfg.train
        bar = None
        if self.progress:
            from tqdm import tqdm

            bar = tqdm(total=self.target_step, initial=self.step, dynamic_ncols=True, desc=self.cfg.name)
        if self.step == 0:
            self._say(self.engine.describe([run.cfg.name for run in self.runs], self.target_step))
        caught: list[int] = []
        old_handlers = {s: signal.signal(s, lambda signum, frame: caught.append(signum)) for s in STOP_SIGNALS}
        last: list[dict[str, dict[str, float]]] = [{} for _ in self.runs]
        t_last, step_last = time.perf_counter(), self.step
        try:
            while self.step < t.steps:
                self.train_step()
                s = self.step
                if s % t.log_every == 0 or s == t.steps:
                    self.check_finite()  # reads the device: the time below includes the queued work
                    now = time.perf_counter()
                    steps_per_s = (s - step_last) / max(now - t_last, 1e-9)
                    t_last, step_last = now, s
                    self._log_train(s, steps_per_s, bar)
                if s % t.eval_every == 0 or s == t.steps:
                    self.check_finite()
                    last = self._log_evaluation(s, bar)
                if s % t.checkpoint_every == 0 or s == t.steps:
                    self.check_finite()
                    self.save()
                if bar is not None:
                    bar.update()
                stop = self.stop_at_step is not None and self.stop_at_step <= s < t.steps
                out_of_time = self.deadline is not None and time.monotonic() >= self.deadline and s < t.steps
                asked = self.stop_requested is not None and s < t.steps and self.stop_requested()
                if stop or out_of_time or asked or caught:
                    self.check_finite()
                    self.save()
                    if caught:
                        raise Interrupted(caught[0])
                    why = "--stop-at-step" if stop else "time budget" if out_of_time else "stop requested"
                    self._say(f"stopped at step {s} ({why}); resume with --resume")
                    break
        finally:
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)
            if bar is not None:
                bar.close()
            for run in self.runs:
                if run.writer is not None:
                    run.writer.flush()
        return last

    @property
    def target_step(self) -> int:
        """The step this call trains to: ``stop_at_step`` when it comes before the schedule's end."""
        steps = self.cfg.train.steps
        return steps if self.stop_at_step is None else min(self.stop_at_step, steps)

    def _log_train(self, s: int, steps_per_s: float, bar: Any) -> None:
        t, metric = self.cfg.train, self.task.primary_metric
        flushed = self._flush_train_metrics()
        # update s's gradient and the parameters after it: single-step values, as the authors' code logs them
        norms_Rx2 = torch.stack([self.engine.grad_norm_R, self.engine.param_norm_R()], dim=1).tolist()
        for run, values, (grad_norm, param_norm) in zip(self.runs, flushed, norms_Rx2):
            extra = {"lr": lr_at(s - 1, run.cfg), "grad_norm": grad_norm, "param_norm": param_norm}  # update s's
            self._log(run, s, "train_batch", {**values, **extra})
            if run.writer is not None:
                run.writer.add_scalar("perf/steps_per_s", steps_per_s, s)
                run.writer.add_scalar("perf/problems_per_s", steps_per_s * t.batch_size, s)
                run.writer.add_scalar("perf/tokens_per_s", steps_per_s * t.batch_size * self.task.seq_len, s)
        if self.num_runs == 1:
            summary = {k: f"{v:.4g}" for k, v in flushed[0].items()} | {"it/s": f"{steps_per_s:.1f}"}
            if bar is not None:
                bar.set_postfix(summary)
                return
            line = f"{self.runs[0].cfg.name} " + " ".join(f"{k}={v}" for k, v in summary.items())
        else:
            speed = f"({steps_per_s:.1f} steps/s x {self.num_runs} runs) "
            line = speed + " ".join(
                f"{r.cfg.name}:{metric}={v.get(metric, math.nan):.4g}" for r, v in zip(self.runs, flushed)
            )
            if bar is not None:
                bar.set_postfix_str(line)
                return
        self._say(f"step {s}/{self.target_step} {line}")

    def _log_evaluation(self, s: int, bar: Any) -> list[dict[str, dict[str, float]]]:
        if not self.quiet and self.dist.is_main:  # a large evaluation takes minutes on a CPU: said, not a stall
            (bar.write if bar is not None else print)(
                f"step {s}: evaluating {self.cfg.train.eval_size:,} problems a split"
            )
        results = self.evaluate()
        for run, res in zip(self.runs, results):
            for split, values in res.items():
                self._log(run, s, split, values)
        if bar is None:
            metric = self.task.primary_metric
            self._say(
                f"eval step {s}: "
                + "; ".join(
                    (f"{run.cfg.name} " if self.num_runs > 1 else "")
                    + ", ".join(f"{sp} {metric}={v[metric]:.4f}" for sp, v in res.items())
                    for run, res in zip(self.runs, results)
                )
            )
        return results

    def _say(self, text: str) -> None:
        if self.dist.is_main:
            print(text, flush=True)

    def close(self) -> None:
        self.engine.close()
        for run in self.runs:
            if run.writer is not None:
                run.writer.close()
        if self.dist.world > 1 and dist.is_initialized():
            # tearing gloo down while the other rank is still in a collective aborts the process
            dist.barrier()
            dist.destroy_process_group()
