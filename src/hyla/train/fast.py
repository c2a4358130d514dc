"""``train.fast``: remove the per-step launch overhead, with the plain path's numerics.

The paper's models are tiny (~0.5M parameters, 32-36 tokens, batch 128), so on a GPU a training step
is dominated by kernel launches and Python, not arithmetic. ``train.fast=true`` turns on what
removes that overhead without changing the results beyond floating-point reordering:

* ``torch.compile`` of the model (forward and backward fused into few kernels); on CUDA in mode
  ``reduce-overhead``, i.e. replayed as CUDA graphs (one launch per graph); elsewhere mode
  ``default`` (CPU: Inductor's C++ kernels). An explicit ``train.compile_mode`` other than
  ``default`` is respected. Under DDP no CUDA graphs (``default``).
* fused AdamW and TF32 matmuls on CUDA are already the defaults of every run (``train.tf32``).

Not part of it: ``train.bf16`` (it changes the losses beyond the 1e-4 contract, and at these sizes
the step is launch-bound, so it would not pay). The data stays on the device and the step issues no
host synchronization; metrics are read back only at log and evaluation time.
"""

from __future__ import annotations

import torch

from hyla.train.config import TrainConfig

CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")


def compile_mode(train: TrainConfig, device: torch.device | str, distributed: bool = False) -> str | None:
    """The ``torch.compile`` mode of a run on ``device``, or None for eager."""
    device = torch.device(device)
    if train.fast:
        if train.compile_mode != "default":
            mode = train.compile_mode
        else:
            mode = "reduce-overhead" if device.type == "cuda" else "default"
    elif train.compile:
        mode = train.compile_mode
    else:
        return None
    if mode in CUDAGRAPH_MODES and (device.type != "cuda" or distributed):
        mode = "default" if mode == "reduce-overhead" else "max-autotune-no-cudagraphs"
    return mode


def uses_cudagraphs(mode: str | None, device: torch.device | str) -> bool:
    """Whether a model compiled in ``mode`` on ``device`` replays CUDA graphs (then each step must call
    ``torch.compiler.cudagraph_mark_step_begin()``: the previous step's graph outputs are reused)."""
    return torch.device(device).type == "cuda" and mode in CUDAGRAPH_MODES
