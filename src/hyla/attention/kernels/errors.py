"""The error every kernel raises for a case it does not cover (its own module: the Triton wrapper and the
kernel module both raise it, and neither imports the other for it)."""

from __future__ import annotations


class FusedUnavailableError(NotImplementedError):
    """``backend="fused"`` was asked for a case (device, dtype, variant, size) the kernel does not cover."""
