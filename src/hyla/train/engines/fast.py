"""``train.fast``: remove the per-step launch overhead, with the plain path's numerics.

The paper's models are tiny (~0.5M parameters, 32-36 tokens, batch 128), so on a GPU a training step
is dominated by kernel launches and Python, not arithmetic. ``train.fast=true`` turns on what
removes that overhead without changing the results beyond floating-point reordering:

* ``torch.compile`` of the model (forward and backward fused into few kernels); on CUDA in mode
  ``reduce-overhead``, i.e. replayed as CUDA graphs (one launch per graph); elsewhere mode
  ``default`` (CPU: Inductor's C++ kernels). An explicit ``train.compile_mode`` other than
  ``default`` is respected. Under DDP no CUDA graphs (``default``).
* fused AdamW (CUDA and CPU) and TF32 matmuls on CUDA (``train.tf32``) are already the defaults of every run.

Not part of it: ``train.bf16`` (it changes the losses beyond the 1e-4 contract, and at these sizes
the step is launch-bound, so it would not pay). The data stays on the device and the step issues no
host synchronization; metrics are read back only at log and evaluation time.
"""

from __future__ import annotations

import getpass
import os
import tempfile
from typing import Any

import torch

from hyla.ops.clib import target_march
from hyla.train.config import TrainConfig

INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"

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


def cpu_dispatch_tag() -> str:
    """What decides the machine code a CPU process runs: PyTorch's CPU capability (``ATEN_CPU_CAPABILITY``)
    and the C kernel's ``-march`` (``HYLA_CPU_MARCH``), e.g. ``avx512-native``."""
    return f"{torch.backends.cpu.get_cpu_capability().lower()}-{target_march()}"


def shared_inductor_cache() -> str:
    """Inductor's default cache folder (``<tmp>/torchinductor_<user>``), shared by every process of the user."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}" if hasattr(os, "getuid") else "unknown_user"
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + user)


def keep_compiled_code_apart() -> str:
    """Point Inductor's cache at a folder of this process's CPU dispatch (``cpu_dispatch_tag``) unless the
    user chose one; returns the folder in use. Call before the first ``torch.compile`` of a process.

    Code compiled under one ATen CPU capability and loaded from the shared cache under another can crash
    (SIGSEGV in a compiled backward, seen after ``ATEN_CPU_CAPABILITY=avx2``, which the records' retraining
    sets). Inductor writes its default into the environment once it ran, and a child process inherits our
    choice, so both count as unset here: only a folder the user named is kept."""
    shared = shared_inductor_cache()
    current = os.environ.get(INDUCTOR_CACHE_ENV)
    ours = current is None or current == shared or os.path.basename(current).startswith(os.path.basename(shared) + "-")
    if ours:
        os.environ[INDUCTOR_CACHE_ENV] = f"{shared}-{cpu_dispatch_tag()}"
    return os.environ[INDUCTOR_CACHE_ENV]


def uses_cudagraphs(mode: str | None, device: torch.device | str) -> bool:
    """Whether a model compiled in ``mode`` on ``device`` replays CUDA graphs (then each step must call
    ``torch.compiler.cudagraph_mark_step_begin()``: the previous step's graph outputs are reused)."""
    return torch.device(device).type == "cuda" and mode in CUDAGRAPH_MODES


def graph_step_unsupported_reason(device: torch.device | str, world_size: int) -> str | None:
    """None when ``train.graph_step`` can capture a lone run's step on ``device``, else why not."""
    device = torch.device(device)
    if device.type != "cuda":
        return f"needs a CUDA device (this run is on {device.type})"
    if world_size > 1:
        return f"captures one process's step (this run has {world_size} processes; DDP's all-reduce is not captured)"
    return None


class StepGraph:
    """A training step captured once as a CUDA graph and replayed; subclasses say what a step touches.

    Capture: ``WARMUP_STEPS`` eager steps on a side stream first (lazy optimizer state, the fused
    kernels' self-tests, compilation), then the state the warm-up changed is put back (``_snapshot`` /
    ``_restore``), then one step is captured with the data generators registered, so that each replay
    draws fresh problems. The replayed steps are then the plain path's steps. ``step_count`` is the
    ``step`` of ``hyla.train.engines.base``'s convention (the updates made before the one a replay makes), a
    device tensor the captured step advances.
    """

    WARMUP_STEPS = 2

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.graph: torch.cuda.CUDAGraph | None = None
        self.step_count = torch.zeros((), dtype=torch.long, device=device)

    # what a subclass provides
    def _body(self) -> None:
        """One step, advancing ``step_count``; every tensor it writes that outlives it is a fixed buffer."""
        raise NotImplementedError

    def _generators(self) -> list[torch.Generator]:
        raise NotImplementedError

    def _snapshot(self) -> Any:
        raise NotImplementedError

    def _restore(self, snap: Any) -> None:
        raise NotImplementedError

    def _before_capture(self) -> None:
        """Turn the state the step updates into fixed buffers (called once, before the warm-up)."""

    def _clear_grads(self) -> None:
        """Drop gradients left by the previous step (before each warm-up step and the capture)."""

    # the mechanics
    def _replay(self, step: int) -> None:
        if self.graph is None:
            self._capture(step)
        assert self.graph is not None
        self.graph.replay()

    def _capture(self, step: int) -> None:
        self._before_capture()
        snap = self._snapshot()
        self.step_count.fill_(step)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(self.WARMUP_STEPS):
                self._clear_grads()
                self._body()
        torch.cuda.current_stream(self.device).wait_stream(side)
        self._restore(snap)
        self.step_count.fill_(step)
        graph = torch.cuda.CUDAGraph()
        for gen in self._generators():
            graph.register_generator_state(gen)
        self._clear_grads()
        try:
            with torch.cuda.graph(graph):
                self._body()
        except RuntimeError as err:
            raise RuntimeError(
                f"train.graph_step=true: the training step could not be captured as a CUDA graph ({err}); "
                "run with train.graph_step=false"
            ) from err
        self.graph = graph
