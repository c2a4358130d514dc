"""The implementations behind ``Attention(backend=...)`` other than the direct form, one module (or package:
kernel beside wrapper) each: ``chunked``, ``manual_backward``, ``c`` (``fused_cpu``), ``triton`` (``fused``);
``coverage`` is the table of what each covers. Which one runs is decided in ``hyla.attention.dispatch``."""

from hyla.attention.kernels.c import fused_cpu_hypernetwork_attention, fused_cpu_unsupported_reason
from hyla.attention.kernels.chunked import chunked_hypernetwork_attention
from hyla.attention.kernels.coverage import COVERAGE, Coverage, covered_presets
from hyla.attention.kernels.errors import CpuKernelUnavailableError, FusedUnavailableError
from hyla.attention.kernels.manual_backward import (
    manual_backward_hypernetwork_attention,
    manual_backward_unsupported_reason,
)
from hyla.attention.kernels.triton import fused_hypernetwork_attention, fused_unsupported_reason

__all__ = [
    "COVERAGE",
    "Coverage",
    "CpuKernelUnavailableError",
    "FusedUnavailableError",
    "chunked_hypernetwork_attention",
    "covered_presets",
    "fused_cpu_hypernetwork_attention",
    "fused_cpu_unsupported_reason",
    "fused_hypernetwork_attention",
    "fused_unsupported_reason",
    "manual_backward_hypernetwork_attention",
    "manual_backward_unsupported_reason",
]
