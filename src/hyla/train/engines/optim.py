"""The optimizer room: which parameters are weight-decayed, AdamW (one run, or R runs stacked), the schedule."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.optim.adamw import adamw as functional_adamw

from hyla.train.config import WEIGHT_DECAY_MASKS, ExperimentConfig

_QKV_BIASES = ("q_proj.bias", "k_proj.bias", "v_proj.bias")
#: where ``build_optimizer``'s AdamW is torch's fused kernel (torch >= 2.4 has it for both)
FUSED_ADAMW_DEVICES = ("cuda", "cpu")


def decayed_parameter_names(model: nn.Module, mask: str = "ndim") -> set[str]:
    """Names of the parameters that weight decay applies to.

    ``ndim``: every parameter with >= 2 dims. ``authors``: the paper's code's ``ndim != 1`` on its flax
    shapes, i.e. every matrix plus the query/key/value biases (flax keeps them ``heads x head_dim``),
    and never a bias that is 2-D only because it has one row per expert (the paper decays no bias).
    """
    if mask not in WEIGHT_DECAY_MASKS:
        allowed = ", ".join(WEIGHT_DECAY_MASKS)
        raise ValueError(f"train.weight_decay_mask={mask!r} is not valid; allowed values: {allowed}")
    if mask == "ndim":
        return {n for n, p in model.named_parameters() if p.ndim >= 2}
    expert_biases = {
        f"{prefix}.{b}" if prefix else b
        for prefix, m in model.named_modules()
        for b in getattr(type(m), "bias_parameters", ())
    }
    return {
        n for n, p in model.named_parameters() if n not in expert_biases and (p.ndim >= 2 or n.endswith(_QKV_BIASES))
    }


def build_optimizer(
    model: nn.Module, cfg: ExperimentConfig, device: torch.device, *, capturable: bool = False
) -> torch.optim.AdamW:
    """AdamW (decay per ``decayed_parameter_names``), fused on CUDA and CPU; ``capturable`` (CUDA) for a
    step captured as a CUDA graph.

    Fused on the CPU too: one kernel over every parameter instead of about ten small ops per tensor (the
    fuzzy-logic model's 40 tensors: 1.9-3.3 -> 0.4-0.7 ms an update, SRAVEN's 74: 3.6-6.1 -> 0.9-1.3 ms, one
    thread). Its rounding differs from the single-tensor loop's in the last
    bit."""
    decayed = decayed_parameter_names(model, cfg.train.weight_decay_mask)
    named = list(model.named_parameters())
    groups = [
        {"params": [p for n, p in named if n in decayed], "weight_decay": cfg.train.weight_decay},
        {"params": [p for n, p in named if n not in decayed], "weight_decay": 0.0},
    ]
    extra = {"capturable": True} if capturable else {}
    return torch.optim.AdamW(groups, lr=cfg.train.lr, fused=device.type in FUSED_ADAMW_DEVICES, **extra)


#: AdamW's group options that say how this process steps, not what the run is: a checkpoint's groups keep
#: every other option, and take these from the optimizer they are loaded into
STEP_MODE_OPTIONS = ("capturable", "fused", "foreach", "differentiable")


def load_optimizer_state(optimizer: torch.optim.Optimizer, saved: dict) -> None:
    """``saved`` (an optimizer's ``state_dict()``) into ``optimizer``, which keeps its step mode
    (``STEP_MODE_OPTIONS``). torch's ``load_state_dict`` takes every group option from the checkpoint, so a
    checkpoint saved on a CPU would turn a CUDA run's fused, capturable AdamW (``train.graph_step``) into a
    plain one, and the step's graph capture would fail; here the step counts also move to the device when the
    mode asks for it."""
    mode = [{k: g[k] for k in STEP_MODE_OPTIONS if k in g} for g in optimizer.param_groups]
    groups = saved["param_groups"]
    if len(groups) != len(mode):  # before zip below could drop a group
        raise ValueError(f"the checkpoint has {len(groups)} parameter groups, this optimizer {len(mode)}")
    optimizer.load_state_dict({**saved, "param_groups": [{**g, **m} for g, m in zip(groups, mode)]})


def lr_at(step: int, cfg: ExperimentConfig) -> float:
    """Linear warmup from 0 over ``warmup_steps``, then cosine decay to ``final_lr_fraction * lr``, reached
    at ``train.steps`` (``cosine_end=steps``) or at ``steps - warmup_steps`` (``steps_minus_warmup``: the
    paper's code passes ``steps - warmup`` as optax's ``decay_steps``, which counts the warmup)."""
    t = cfg.train
    if step < t.warmup_steps:
        return t.lr * step / t.warmup_steps
    end = t.steps if t.cosine_end == "steps" else t.steps - t.warmup_steps
    progress = min(1.0, (step - t.warmup_steps) / max(1, end - t.warmup_steps))
    return t.lr * (t.final_lr_fraction + (1 - t.final_lr_fraction) * 0.5 * (1 + math.cos(math.pi * progress)))


# ------------------------------------------------------------------------------ R runs at once
BETA1, BETA2, EPS = 0.9, 0.999, 1e-8  # torch.optim.AdamW's defaults, which build_optimizer uses
#: ``StackedAdamW.update``'s call of the fused kernel: a lone run's AdamW (torch's defaults)
_FUSED_ADAMW = {"fused": True, "amsgrad": False, "beta1": BETA1, "beta2": BETA2, "eps": EPS, "maximize": False}
SCHEDULE_CHUNK = 4096  # steps of per-run learning rates computed at once and copied to the device


class StackedAdamW:
    """``torch.optim.AdamW``'s update of R runs' parameters, the rows of ``flat_RxN``: each parameter at its
    columns, ``decayed`` (weight decay) or ``undecayed``, the decayed ones first; other columns stay 0.

    ``update`` on the CPU: run by run, parameter by parameter, with the fused kernel a lone run's AdamW uses
    there (``build_optimizer``), so that each run's arithmetic is its lone run's: that kernel rounds a
    tensor's vectorized body and its scalar tail differently, so a parameter must be its own tensor, as it is
    in the lone run, not a stretch of a longer one. On CUDA, ``step``: the
    single-tensor arithmetic for all runs at once in ~8 elementwise kernels, with per-run learning rates and
    weight decays as ``R x 1`` columns of a schedule table on the device (no host-to-device copy and no host
    synchronization per step, so a CUDA graph captures it).
    """

    def __init__(
        self, flat_RxN: Tensor, decayed: list[slice], undecayed: list[slice], cfgs: list[ExperimentConfig]
    ) -> None:
        self.flat_RxN, self.decayed, self.undecayed, self.cfgs = flat_RxN, decayed, undecayed, cfgs
        self.num_decayed = max((c.stop for c in decayed), default=0)
        self.exp_avg_RxN = torch.zeros_like(flat_RxN)
        self.exp_avg_sq_RxN = torch.zeros_like(flat_RxN)
        self._schedule_chunk = -1
        self.schedule_SxRx3 = torch.empty(0)

    def schedule_row(self, step: int | Tensor) -> Tensor:
        """Per-run ``1 - lr * wd``, ``-lr / (1 - beta1^t)`` and ``sqrt(1 - beta2^t)`` of update ``t = step + 1``
        (``lr = lr_at(step)``; R x 3).

        Computed in float64 on the host as ``torch.optim.AdamW`` does, rounded to float32 as its
        kernels do, ``SCHEDULE_CHUNK`` steps at a time into one device table; a step reads a row.
        ``step`` as a device tensor (a captured step) reads the row on the device; the host then loads
        the chunk before each replay (``load_schedule``).
        """
        if isinstance(step, Tensor):
            return self.schedule_SxRx3.index_select(0, step.remainder(SCHEDULE_CHUNK).view(1))[0]
        self.load_schedule(step)
        return self.schedule_SxRx3[step % SCHEDULE_CHUNK]

    def load_schedule(self, step: int) -> None:
        chunk = step // SCHEDULE_CHUNK
        if chunk == self._schedule_chunk:
            return
        rows = []
        for s in range(chunk * SCHEDULE_CHUNK, (chunk + 1) * SCHEDULE_CHUNK):
            bias_correction1, bias_correction2_sqrt = 1 - BETA1 ** (s + 1), (1 - BETA2 ** (s + 1)) ** 0.5
            row = []
            for cfg in self.cfgs:
                lr = lr_at(s, cfg)
                row.append([1 - lr * cfg.train.weight_decay, -(lr / bias_correction1), bias_correction2_sqrt])
            rows.append(row)
        table = torch.tensor(rows, dtype=torch.float32)
        device = self.flat_RxN.device
        if device.type == "cuda":
            table = table.pin_memory()
        if self.schedule_SxRx3.shape == table.shape:  # in place: a captured step reads this buffer
            self.schedule_SxRx3.copy_(table, non_blocking=True)
        else:
            self.schedule_SxRx3 = table.to(device, non_blocking=True)
        self._schedule_chunk = chunk

    @torch.no_grad()
    def update(self, step: int | Tensor, grad_RxN: Tensor) -> None:
        """Update ``t = step + 1`` with the summed gradients ``grad_RxN``: see the class docstring."""
        if self.flat_RxN.device.type != "cpu" or isinstance(step, Tensor):
            self.step(grad_RxN, self.schedule_row(step))
            return
        for r, cfg in enumerate(self.cfgs):
            lr = lr_at(step, cfg)
            for columns, wd in ((self.decayed, cfg.train.weight_decay), (self.undecayed, 0.0)):
                if not columns:
                    continue
                tensors = (self.flat_RxN, grad_RxN, self.exp_avg_RxN, self.exp_avg_sq_RxN)
                p, g, m, v = ([t[r, c] for c in columns] for t in tensors)  # views: the kernel writes in place
                steps = [torch.tensor(float(step)) for _ in columns]  # one each: the kernel counts each up to t
                functional_adamw(p, g, m, v, [], steps, lr=lr, weight_decay=wd, **_FUSED_ADAMW)

    @torch.no_grad()
    def step(self, grad_RxN: Tensor, schedule_Rx3: Tensor) -> None:
        decay_Rx1, neg_step_size_Rx1, bias_correction2_sqrt_Rx1 = schedule_Rx3.split(1, dim=1)
        p, m, v = self.flat_RxN, self.exp_avg_RxN, self.exp_avg_sq_RxN
        p[:, : self.num_decayed].mul_(decay_Rx1)
        m.lerp_(grad_RxN, 1 - BETA1)
        v.mul_(BETA2).addcmul_(grad_RxN, grad_RxN, value=1 - BETA2)
        denom = (v.sqrt() / bias_correction2_sqrt_Rx1).add_(EPS)
        p.addcdiv_(m * neg_step_size_Rx1, denom)

    def to_adamw(self, r: int, model: nn.Module, columns: dict[str, slice], step: int) -> torch.optim.AdamW:
        """Run ``r``'s moments as the ``torch.optim.AdamW`` a lone run of ``model`` has after ``step`` updates
        (``columns``: parameter name -> its columns of ``flat_RxN``); its learning rate is the last update's."""
        opt = build_optimizer(model, self.cfgs[r], self.flat_RxN.device)
        names = {id(p): n for n, p in model.named_parameters()}
        for group in opt.param_groups:
            group["lr"] = lr_at(max(step - 1, 0), self.cfgs[r])
            for p in group["params"]:
                cols = columns[names[id(p)]]
                opt.state[p] = {
                    "step": torch.tensor(float(step)),
                    "exp_avg": self.exp_avg_RxN[r, cols].reshape(p.shape).clone(),
                    "exp_avg_sq": self.exp_avg_sq_RxN[r, cols].reshape(p.shape).clone(),
                }
        return opt

    @torch.no_grad()
    def load_adamw(self, r: int, opt: torch.optim.AdamW, model: nn.Module, columns: dict[str, slice]) -> None:
        """The inverse of ``to_adamw``: ``opt``'s moments into run ``r``."""
        names = {id(p): n for n, p in model.named_parameters()}
        for p, st in opt.state.items():
            cols = columns[names[id(p)]]
            self.exp_avg_RxN[r, cols] = st["exp_avg"].reshape(-1).to(self.flat_RxN.device)
            self.exp_avg_sq_RxN[r, cols] = st["exp_avg_sq"].reshape(-1).to(self.flat_RxN.device)
