"""GELU with the tanh approximation on CPU by the C kernel library (``gelu_tanh_*`` in ``hyla_cpu.c``): the
paper configs' feed-forward activation (flax's ``nn.gelu``), forward and backward, one pass each.

Why: on one thread of the 2-core Zen 3, torch's tanh GELU costs about 4 ns a float32 value each way (its erf GELU
1-1.5, ``exp`` 0.3), so ``F.gelu(h, approximate="tanh")`` and its backward were 15% of the paper configs' SRAVEN
HYLA step and 18% of the fuzzy-logic one.
The kernel computes the same function as ``x * sigmoid(2u)``, ``u = sqrt(2/pi) (x + 0.044715 x^3)`` (equal to
``0.5 x (1 + tanh u)``), with the library's vector ``exp``, so it rounds otherwise than torch in the last
bits (and more accurately where ``1 + tanh u`` cancels); ``tests/ops/test_gelu_cpu.py`` holds it to a float64
reference. ``SETTING_ENV`` (``HYLA_FAST_GELU``) ``off`` keeps torch's.

``gelu`` is what the models call: the kernel for a tanh GELU of a float32 or float64 CPU tensor where the
library loads, ``F.gelu`` otherwise. The custom ops ``hyla::gelu_tanh_cpu`` (+ ``_backward``) carry it
through autograd and ``torch.compile``; inside ``torch.vmap`` they run where their batching rule is registered
(``hyla.train.engines.vmap_rules``, where stacking lives), else torch's GELU does.
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from hyla.ops.clib import BATCHED_OPS, DTYPES, assume_constant_result, library_problem, load_library
from hyla.runtime import env_setting

#: the environment variable that keeps torch's GELU (``off``); ``auto`` (default) uses the kernel where it can
SETTING_ENV = "HYLA_FAST_GELU"
SETTINGS = ("auto", "off")
#: the custom op's name (``BATCHED_OPS`` holds it once its ``torch.vmap`` rule is registered)
GELU_OP = "hyla::gelu_tanh_cpu"


def setting() -> str:
    """The value of ``SETTING_ENV`` (default ``auto``); a ValueError naming the allowed values if bad."""
    return env_setting(SETTING_ENV, SETTINGS)


def gelu_path() -> str:
    """What computes a tanh GELU on the CPU in this process: ``c_kernel`` or ``torch`` (``made_by.jsonl``)."""
    return "c_kernel" if setting() == "auto" and not library_problem() else "torch"


@assume_constant_result  # torch.compile asks once while tracing
def _use_kernel() -> bool:
    return gelu_path() == "c_kernel"


def _call(direction: str, out: Tensor, *inputs: Tensor) -> None:
    fn = getattr(load_library(), f"gelu_tanh_{direction}_{DTYPES[out.dtype]}")
    pointers = [ctypes.c_void_p(t.data_ptr()) for t in (*inputs, out)]
    fn(*pointers, ctypes.c_longlong(out.numel()), ctypes.c_int(torch.get_num_threads()))


@torch.library.custom_op(GELU_OP, mutates_args=(), device_types="cpu")
def gelu_tanh_cpu_op(x: Tensor) -> Tensor:
    x = x.contiguous()
    y = torch.empty_like(x)
    _call("forward", y, x)
    return y


@gelu_tanh_cpu_op.register_fake
def _gelu_tanh_cpu_fake(x: Tensor) -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("hyla::gelu_tanh_cpu_backward", mutates_args=(), device_types="cpu")
def gelu_tanh_cpu_backward_op(x: Tensor, dy: Tensor) -> Tensor:
    x, dy = x.contiguous(), dy.contiguous()
    dx = torch.empty_like(x)
    _call("backward", dx, x, dy)
    return dx


@gelu_tanh_cpu_backward_op.register_fake
def _gelu_tanh_cpu_backward_fake(x: Tensor, dy: Tensor) -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _setup_context(ctx: Any, inputs: tuple[Tensor], output: Tensor) -> None:
    ctx.save_for_backward(inputs[0])


def _backward(ctx: Any, dy: Tensor) -> Tensor:
    (x,) = ctx.saved_tensors
    return gelu_tanh_cpu_backward_op(x, dy)


gelu_tanh_cpu_op.register_autograd(_backward, setup_context=_setup_context)


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """``F.gelu(x, approximate=approximate)``; a tanh GELU of a float32/float64 CPU tensor by the C kernel
    (``gelu_path``). Any shape."""
    kernel = approximate == "tanh" and x.device.type == "cpu" and x.dtype in DTYPES and _use_kernel()
    if kernel and (GELU_OP in BATCHED_OPS or torch.compiler.is_compiling() or not _is_batched(x)):
        return gelu_tanh_cpu_op(x)
    return F.gelu(x, approximate=approximate)


def _is_batched(x: Tensor) -> bool:
    """Inside ``torch.vmap``, where the op has no batching rule unless the training layer registered it."""
    return torch._C._functorch.is_batchedtensor(x)
