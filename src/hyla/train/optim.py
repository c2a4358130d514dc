"""The optimizer room: which parameters are weight-decayed, AdamW, and the learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn

from hyla.train.config import WEIGHT_DECAY_MASKS, ExperimentConfig

_QKV_BIASES = ("q_proj.bias", "k_proj.bias", "v_proj.bias")


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
    """AdamW (decay per :func:`decayed_parameter_names`), fused on CUDA; ``capturable`` (CUDA) for a step
    captured as a CUDA graph."""
    decayed = decayed_parameter_names(model, cfg.train.weight_decay_mask)
    named = list(model.named_parameters())
    groups = [
        {"params": [p for n, p in named if n in decayed], "weight_decay": cfg.train.weight_decay},
        {"params": [p for n, p in named if n not in decayed], "weight_decay": 0.0},
    ]
    extra = {"capturable": True} if capturable else {}
    return torch.optim.AdamW(groups, lr=cfg.train.lr, fused=device.type == "cuda", **extra)


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
