"""The errors the kernels raise for a case they do not cover, in a module of their own: the Triton wrapper and
the Triton kernel both raise ``FusedUnavailableError``, and the kernel (imported lazily, it needs
Triton) must not import its wrapper, which imports it."""

from __future__ import annotations

from hyla.ops.clib import CpuKernelUnavailableError  # the C library raises it: defined below attention

__all__ = ["CpuKernelUnavailableError", "FusedUnavailableError"]


class FusedUnavailableError(NotImplementedError):
    """``backend="fused"`` was asked for a case (device, dtype, variant, size) the kernel does not cover."""
