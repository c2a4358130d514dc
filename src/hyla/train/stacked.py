"""Several independent runs in one process: R models stacked along a leading run dimension.

Runs may differ in ``seed``, ``name``, ``train.data_seed``, ``train.lr`` and ``train.weight_decay``
(everything else, the architecture above all, must agree). Each run ``r``:

* is initialized exactly as a lone run with its seed (the R models are built one by one, then
  their parameters stacked with ``torch.func.stack_module_state``);
* draws its data from its own generator, seeded as a lone run's, so it sees the same problems;
* is updated by AdamW with its own learning rate and weight decay (the arithmetic of
  ``torch.optim.AdamW``, applied to the stacked tensors);
* writes an ordinary run directory (``config.yaml``, ``metrics.jsonl``, ``tb/``, checkpoints with
  the optimizer state in ``torch.optim.AdamW``'s format), which ``hyla report`` reads, and which
  ``hyla train --resume`` can even continue alone.

The forward is ``torch.func.vmap`` over ``functional_call``: one call runs all R models, which
amortizes the per-operator overhead that dominates these tiny models. Numerically a stacked run
equals its lone run up to floating-point reordering (tested: same losses within 1e-4).
"""

from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.func import functional_call, stack_module_state, vmap

from hyla.train.checkpoint import CheckpointError, TrainingState, latest_checkpoint, load_checkpoint, save_checkpoint
from hyla.train.config import ExperimentConfig, dump_config
from hyla.train.loop import build_model, build_optimizer, build_task, lr_at

STACKABLE_KEYS = ("seed", "name", "train.data_seed", "train.lr", "train.weight_decay")
BETAS, EPS = (0.9, 0.999), 1e-8  # torch.optim.AdamW defaults, as the lone trainer uses


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def check_stackable(cfgs: list[ExperimentConfig]) -> None:
    base = _flat(cfgs[0].to_dict())
    for cfg in cfgs[1:]:
        other = _flat(cfg.to_dict())
        bad = sorted(k for k in base if base[k] != other[k] and k not in STACKABLE_KEYS)
        if bad:
            raise ValueError(
                f"runs can be stacked only if they differ in {', '.join(STACKABLE_KEYS)}; these differ too: "
                f"{', '.join(bad)} (train them as separate runs)"
            )
    if cfgs[0].model.moe_experts:
        raise ValueError("stacked runs do not support model.moe_experts > 0 yet; train MoE runs one by one")


@dataclass
class _Run:
    cfg: ExperimentConfig
    out: Path
    gen: torch.Generator
    acc: dict[str, float]
    writer: Any = None


class StackedTrainer:
    """Train ``len(cfgs)`` runs at once; ``out_dirs[r]`` receives run ``r``."""

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
        if len(cfgs) != len(out_dirs) or not cfgs:
            raise ValueError("give one output directory per run")
        check_stackable(cfgs)
        self.device = torch.device(device)
        self.quiet, self.stop_at_step = quiet, stop_at_step
        self.task = build_task(cfgs[0])
        models = [build_model(cfg, self.task).to(self.device) for cfg in cfgs]
        for cfg in cfgs:
            cfg.validate()
        self.template = copy.deepcopy(models[0])
        params, buffers = stack_module_state(models)
        self.params = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
        self.buffers = buffers
        self.decay = {k: v.ndim >= 3 for k, v in self.params.items()}  # >= 2-D in the lone model
        self.exp_avg = {k: torch.zeros_like(v) for k, v in self.params.items()}
        self.exp_avg_sq = {k: torch.zeros_like(v) for k, v in self.params.items()}
        self.step = 0
        self.runs = [
            _Run(cfg, Path(out), torch.Generator(self.device).manual_seed(cfg.data_seed * 1009), {})
            for cfg, out in zip(cfgs, out_dirs)
        ]
        self.cfg = cfgs[0]
        positions = self.task.num_output_positions

        def forward(p: dict[str, Tensor], b: dict[str, Tensor], x: Tensor) -> Tensor:
            return functional_call(self.template, (p, b), (x,), {"last_positions": positions})

        self._forward = vmap(forward, in_dims=(0, 0, 0))
        self._forward_shared = vmap(forward, in_dims=(0, 0, None))
        if self.cfg.train.compile:
            self._forward = torch.compile(self._forward, mode=self.cfg.train.compile_mode)
        if resume:
            self._restore()
        else:
            for run in self.runs:
                if latest_checkpoint(run.out) is not None or (run.out / "metrics.jsonl").exists():
                    raise CheckpointError(f"{run.out} already holds a run; pass --resume or choose another --out")
        for run in self.runs:
            run.out.mkdir(parents=True, exist_ok=True)
            (run.out / "config.yaml").write_text(dump_config(run.cfg))
            from torch.utils.tensorboard import SummaryWriter

            run.writer = SummaryWriter(str(run.out / "tb"))

    # --------------------------------------------------------------------------- optimizer
    def _hyper(self, name: str) -> tuple[Tensor, Tensor]:
        """Per-run learning rate and weight decay, shaped to broadcast against parameter ``name``."""
        shape = (len(self.runs),) + (1,) * (self.params[name].ndim - 1)
        lr = torch.tensor([lr_at(self.step, r.cfg) for r in self.runs], device=self.device).view(shape)
        wd = torch.tensor(
            [r.cfg.train.weight_decay if self.decay[name] else 0.0 for r in self.runs], device=self.device
        ).view(shape)
        return lr, wd

    @torch.no_grad()
    def _adamw_step(self) -> None:
        """The update of ``torch.optim.AdamW`` (single-tensor form), per run."""
        t = self.step + 1
        bc1, bc2_sqrt = 1 - BETAS[0] ** t, math.sqrt(1 - BETAS[1] ** t)
        for name, p in self.params.items():
            g = p.grad
            lr, wd = self._hyper(name)
            p.mul_(1 - lr * wd)
            self.exp_avg[name].lerp_(g, 1 - BETAS[0])
            self.exp_avg_sq[name].mul_(BETAS[1]).addcmul_(g, g, value=1 - BETAS[1])
            denom = (self.exp_avg_sq[name].sqrt() / bc2_sqrt).add_(EPS)
            p.sub_(lr / bc1 * self.exp_avg[name] / denom)
            p.grad = None

    # --------------------------------------------------------------------------- steps
    def train_step(self) -> None:
        batches = [self.task.sample(r.cfg.train.batch_size, "train", r.gen) for r in self.runs]
        out = self._forward(self.params, self.buffers, torch.stack([b.inputs for b in batches]))
        losses = torch.stack([self.task.loss(out[i], b) for i, b in enumerate(batches)])
        losses.sum().backward()  # runs share no parameters: each gets its own gradient
        self._adamw_step()
        with torch.no_grad():
            for i, (run, batch) in enumerate(zip(self.runs, batches)):
                m = self.task.metrics(out[i].detach(), batch)
                for k in ("loss", self.task.primary_metric):
                    run.acc[k] = run.acc.get(k, torch.zeros((), dtype=torch.float64)) + m[k].double().mean()
                run.acc["_n"] = run.acc.get("_n", 0) + 1
        self.step += 1
        if not torch.isfinite(losses).all():
            bad = [r.cfg.name for r, ok in zip(self.runs, torch.isfinite(losses).tolist()) if not ok]
            raise RuntimeError(f"loss became NaN/inf at step {self.step} in run(s) {', '.join(bad)}; stopped")

    @torch.no_grad()
    def evaluate(self) -> list[dict[str, dict[str, float]]]:
        t = self.cfg.train
        results: list[dict[str, dict[str, float]]] = [{} for _ in self.runs]
        for i, split in enumerate(self.task.splits):
            gen = torch.Generator(self.device).manual_seed(t.eval_seed * 101 + i)
            sums: list[dict[str, Tensor]] = [{} for _ in self.runs]
            count = 0
            for b in range(math.ceil(t.eval_size / t.eval_batch_size)):
                batch = self.task.sample(min(t.eval_batch_size, t.eval_size - b * t.eval_batch_size), split, gen)
                out = self._forward_shared(self.params, self.buffers, batch.inputs)
                for r in range(len(self.runs)):
                    for k, v in self.task.metrics(out[r], batch).items():
                        sums[r][k] = sums[r].get(k, 0) + v.double().sum()
                count += len(batch.inputs)
            for r in range(len(self.runs)):
                results[r][split] = {k: (v / count).item() for k, v in sorted(sums[r].items())}
        return results

    def _log(self, run: _Run, split: str, values: dict[str, float]) -> None:
        with open(run.out / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"step": self.step, "split": split, **values}) + "\n")
        for k, v in values.items():
            run.writer.add_scalar(f"{split}/{k}", v, self.step)

    def run(self) -> list[dict[str, dict[str, float]]]:
        t = self.cfg.train
        results: list[dict[str, dict[str, float]]] = []
        t0, s0 = time.perf_counter(), self.step
        while self.step < t.steps:
            self.train_step()
            s = self.step
            if s % t.log_every == 0 or s == t.steps:
                for run in self.runs:
                    n = run.acc.pop("_n")
                    values = {k: (v / n).item() for k, v in sorted(run.acc.items())}
                    run.acc = {}
                    self._log(run, "train_batch", {**values, "lr": lr_at(s - 1, run.cfg)})
                if not self.quiet:
                    rate = (s - s0) / max(time.perf_counter() - t0, 1e-9)
                    print(f"step {s}/{t.steps} ({len(self.runs)} runs, {rate:.1f} steps/s)", flush=True)
            if s % t.eval_every == 0 or s == t.steps:
                results = self.evaluate()
                for run, res in zip(self.runs, results):
                    for split, values in res.items():
                        self._log(run, split, values)
            if s % t.checkpoint_every == 0 or s == t.steps:
                self.save()
            if self.stop_at_step is not None and self.stop_at_step <= s < t.steps:
                self.save()
                print(f"stopped at step {s} (--stop-at-step); resume with --resume", flush=True)
                break
        for run in self.runs:
            run.writer.close()
        return results

    # --------------------------------------------------------------------------- checkpoints
    def _lone(self, r: int) -> tuple[torch.nn.Module, torch.optim.AdamW]:
        """Run ``r`` as an ordinary model and torch.optim.AdamW (for checkpoints in the lone format)."""
        model = copy.deepcopy(self.template)
        model.load_state_dict(
            {**{k: v[r] for k, v in self.params.items()}, **{k: v[r] for k, v in self.buffers.items()}}
        )
        opt = build_optimizer(model, self.runs[r].cfg, self.device)
        names = {id(p): n for n, p in model.named_parameters()}
        for group in opt.param_groups:
            group["lr"] = lr_at(max(self.step - 1, 0), self.runs[r].cfg)
            for p in group["params"]:
                n = names[id(p)]
                opt.state[p] = {
                    "step": torch.tensor(float(self.step)),
                    "exp_avg": self.exp_avg[n][r].clone(),
                    "exp_avg_sq": self.exp_avg_sq[n][r].clone(),
                }
        return model, opt

    def save(self) -> None:
        for r, run in enumerate(self.runs):
            model, opt = self._lone(r)
            acc = {f"acc_{k}": torch.as_tensor(v, dtype=torch.float64) for k, v in run.acc.items()}
            rng = {"torch_cpu": torch.get_rng_state(), "data_rank0": run.gen.get_state(), **acc}
            save_checkpoint(
                run.out,
                TrainingState(
                    self.step, run.cfg.to_dict(), model.state_dict(), opt.state_dict(), rng, {"world_size": 1}
                ),
            )

    def _restore(self) -> None:
        steps = set()
        for r, run in enumerate(self.runs):
            ckpt = latest_checkpoint(run.out)
            if ckpt is None:
                raise CheckpointError(f"--resume: no checkpoint in {run.out}")
            state = load_checkpoint(ckpt)
            model, opt = self._lone(r)
            model.load_state_dict(state.model)
            opt.load_state_dict(state.optimizer)
            names = {id(p): n for n, p in model.named_parameters()}
            with torch.no_grad():
                for n, p in model.named_parameters():
                    self.params[n][r] = p
                for p, st in opt.state.items():
                    self.exp_avg[names[id(p)]][r] = st["exp_avg"]
                    self.exp_avg_sq[names[id(p)]][r] = st["exp_avg_sq"]
            run.gen.set_state(state.rng["data_rank0"])
            run.acc = {k.removeprefix("acc_"): v for k, v in state.rng.items() if k.startswith("acc_")}
            if "_n" in run.acc:
                run.acc["_n"] = int(run.acc["_n"])
            steps.add(state.step)
            self._truncate(run, state.step)
        if len(steps) != 1:
            raise CheckpointError(f"the stacked runs' checkpoints are at different steps {sorted(steps)}")
        self.step = steps.pop()

    @staticmethod
    def _truncate(run: _Run, step: int) -> None:
        path = run.out / "metrics.jsonl"
        if path.exists():
            keep = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] <= step]
            path.write_text("".join(ln + "\n" for ln in keep))
