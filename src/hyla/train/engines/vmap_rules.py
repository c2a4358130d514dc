"""The ``torch.vmap`` batching rules of hyla's C custom ops, registered here, where stacking lives: a stack of R
runs calls its model under ``torch.vmap`` (``hyla.train.engines.stacked``), and these rules fold the runs into one call
of the CPU attention kernel and of the tanh GELU instead of R. Without them (this module not imported, or a
torch without custom-op vmap rules) the ops step aside inside ``torch.vmap``: the direct form and torch's GELU
run there instead. ``BATCHED_OPS`` (``hyla.ops.clib``) names the ops that have their rule."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from hyla.attention.kernels.c import wrapper as attention_op
from hyla.ops import gelu as gelu_op
from hyla.ops.clib import BATCHED_OPS

#: torch releases with custom-op vmap rules (recent ones); older ones keep the ops out of ``torch.vmap``
HAS_VMAP_RULES = hasattr(attention_op.fused_cpu_attention_op, "register_vmap")


def _at_dim0(runs: int, args: tuple[Tensor, ...], in_dims: tuple[int | None, ...]) -> list[Tensor]:
    return [t.movedim(d, 0) if d is not None else t.expand(runs, *t.shape) for t, d in zip(args, in_dims)]


def _slice_by_slice(op: Any, in_dims: tuple[int | None, ...], args: tuple[Any, ...]) -> tuple[Any, Any]:
    """``op`` once per index of the vmapped dimension (always correct, no folding)."""
    size = next(a.shape[d] for a, d in zip(args, in_dims) if d is not None)
    outs = [op(*(a.select(d, i) if d is not None else a for a, d in zip(args, in_dims))) for i in range(size)]
    if isinstance(outs[0], tuple):
        return tuple(torch.stack(parts) for parts in zip(*outs)), tuple(0 for _ in outs[0])
    return torch.stack(outs), 0


def _attention_vmap(info: Any, in_dims: tuple[int | None, ...], *args: Any) -> tuple[Tensor, int]:
    """The runs folded into the batch, one call; a per-run bias, mask or dropout (the kernel takes one) run by
    run."""
    q, k, v, bias, keep, drop, keep_prob, phi, norm, linear, eps = args
    if any(d is not None for d in in_dims[3:6]):
        return _slice_by_slice(attention_op.fused_cpu_attention_op, in_dims, args)
    runs = info.batch_size
    q, k, v = _at_dim0(runs, (q, k, v), in_dims[:3])
    q, k, v = (t.reshape(-1, *t.shape[-3:]) for t in (q, k, v))
    if keep is not None and keep.shape[0] > 1:  # one mask per example: repeat it for every run
        keep = keep.repeat(runs, 1, 1)
    y = attention_op.fused_cpu_attention_op(q, k, v, bias, keep, drop, keep_prob, phi, norm, linear, eps)
    return y.reshape(runs, -1, *y.shape[1:]), 0


def _attention_backward_vmap(
    info: Any, in_dims: tuple[int | None, ...], *args: Any
) -> tuple[tuple[Tensor, ...], tuple[int, ...]]:
    return _slice_by_slice(attention_op.fused_cpu_attention_backward_op, in_dims, args)


def _gelu_vmap(info: Any, in_dims: tuple[int | None], x: Tensor) -> tuple[Tensor, int | None]:
    return gelu_op.gelu_tanh_cpu_op(x), in_dims[0]  # elementwise: the runs' values in one call


def _gelu_backward_vmap(info: Any, in_dims: tuple[int | None, int | None], x: Tensor, dy: Tensor) -> tuple[Tensor, int]:
    x, dy = _at_dim0(info.batch_size, (x, dy), in_dims)
    return gelu_op.gelu_tanh_cpu_backward_op(x, dy), 0


if HAS_VMAP_RULES and attention_op.ATTENTION_OP not in BATCHED_OPS:
    attention_op.fused_cpu_attention_op.register_vmap(_attention_vmap)
    attention_op.fused_cpu_attention_backward_op.register_vmap(_attention_backward_vmap)
    gelu_op.gelu_tanh_cpu_op.register_vmap(_gelu_vmap)
    gelu_op.gelu_tanh_cpu_backward_op.register_vmap(_gelu_backward_vmap)
    BATCHED_OPS.update((attention_op.ATTENTION_OP, gelu_op.GELU_OP))
