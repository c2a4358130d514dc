"""GELU with the tanh approximation on CPU by the C kernel library (``gelu_tanh_*`` in ``hyla_cpu.c``): the
paper configs' feed-forward activation (flax's ``nn.gelu``), forward and backward, one pass each.

Why: on one thread of the 2-core Zen 3, torch's tanh GELU costs about 4 ns a float32 value each way (its erf GELU
1-1.5, ``exp`` 0.3), so ``F.gelu(h, approximate="tanh")`` and its backward were 15% of the paper configs' SRAVEN
HYLA step and 18% of the fuzzy-logic one.
The kernel computes the same function as ``x * sigmoid(2u)``, ``u = sqrt(2/pi) (x + 0.044715 x^3)`` (equal to
``0.5 x (1 + tanh u)``), with the library's vector ``exp``, so it rounds otherwise than torch in the last
bits (and more accurately where ``1 + tanh u`` cancels); ``tests/attention/test_gelu_cpu.py`` holds it to a float64
reference. ``SETTING_ENV`` (``HYLA_FAST_GELU``) ``off`` keeps torch's.

``gelu`` is what the models call: the kernel for a tanh GELU of a float32 or float64 CPU tensor where the
library loads, ``F.gelu`` otherwise. The custom ops ``hyla::gelu_tanh_cpu`` (+ ``_backward``) carry it
through autograd, ``torch.compile`` and ``torch.vmap`` (elementwise: a stack's runs in one call).
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from hyla.attention.kernels.c.wrapper import DTYPES, _assume_constant_result, _library_problem, load_library
from hyla.runtime import env_setting

#: the environment variable that keeps torch's GELU (``off``); ``auto`` (default) uses the kernel where it can
SETTING_ENV = "HYLA_FAST_GELU"
SETTINGS = ("auto", "off")


def setting() -> str:
    """The value of ``SETTING_ENV`` (default ``auto``); a ValueError naming the allowed values if bad."""
    return env_setting(SETTING_ENV, SETTINGS)


def gelu_path() -> str:
    """What computes a tanh GELU on the CPU in this process: ``c_kernel`` or ``torch`` (``made_by.jsonl``)."""
    return "c_kernel" if setting() == "auto" and not _library_problem() else "torch"


@_assume_constant_result  # torch.compile asks once while tracing
def _use_kernel() -> bool:
    return gelu_path() == "c_kernel"


def _call(direction: str, out: Tensor, *inputs: Tensor) -> None:
    fn = getattr(load_library(), f"gelu_tanh_{direction}_{DTYPES[out.dtype]}")
    pointers = [ctypes.c_void_p(t.data_ptr()) for t in (*inputs, out)]
    fn(*pointers, ctypes.c_longlong(out.numel()), ctypes.c_int(torch.get_num_threads()))


@torch.library.custom_op("hyla::gelu_tanh_cpu", mutates_args=(), device_types="cpu")
def _gelu_tanh_cpu(x: Tensor) -> Tensor:
    x = x.contiguous()
    y = torch.empty_like(x)
    _call("forward", y, x)
    return y


@_gelu_tanh_cpu.register_fake
def _gelu_tanh_cpu_fake(x: Tensor) -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("hyla::gelu_tanh_cpu_backward", mutates_args=(), device_types="cpu")
def _gelu_tanh_cpu_backward(x: Tensor, dy: Tensor) -> Tensor:
    x, dy = x.contiguous(), dy.contiguous()
    dx = torch.empty_like(x)
    _call("backward", dx, x, dy)
    return dx


@_gelu_tanh_cpu_backward.register_fake
def _gelu_tanh_cpu_backward_fake(x: Tensor, dy: Tensor) -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _setup_context(ctx: Any, inputs: tuple[Tensor], output: Tensor) -> None:
    ctx.save_for_backward(inputs[0])


def _backward(ctx: Any, dy: Tensor) -> Tensor:
    (x,) = ctx.saved_tensors
    return _gelu_tanh_cpu_backward(x, dy)


_gelu_tanh_cpu.register_autograd(_backward, setup_context=_setup_context)


def _at_dim0(runs: int, args: tuple[Tensor, ...], in_dims: tuple[int | None, ...]) -> list[Tensor]:
    return [t.movedim(d, 0) if d is not None else t.expand(runs, *t.shape) for t, d in zip(args, in_dims)]


if hasattr(_gelu_tanh_cpu, "register_vmap"):  # custom-op vmap rules: recent torch

    @_gelu_tanh_cpu.register_vmap
    def _gelu_tanh_cpu_vmap(info: Any, in_dims: tuple[int | None], x: Tensor) -> tuple[Tensor, int | None]:
        return _gelu_tanh_cpu(x), in_dims[0]  # elementwise: the runs' values in one call

    @_gelu_tanh_cpu_backward.register_vmap
    def _gelu_tanh_cpu_backward_vmap(
        info: Any, in_dims: tuple[int | None, int | None], x: Tensor, dy: Tensor
    ) -> tuple[Tensor, int]:
        x, dy = _at_dim0(info.batch_size, (x, dy), in_dims)
        return _gelu_tanh_cpu_backward(x, dy), 0


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """``F.gelu(x, approximate=approximate)``; a tanh GELU of a float32/float64 CPU tensor by the C kernel
    (``gelu_path``). Any shape."""
    if approximate == "tanh" and x.device.type == "cpu" and x.dtype in DTYPES and _use_kernel():
        return _gelu_tanh_cpu(x)
    return F.gelu(x, approximate=approximate)
