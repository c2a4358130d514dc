"""``backend="fused_cpu"``: the C kernel (``hyla_cpu.c``, built on first use) beside its wrapper
(``.wrapper``, the custom op ``hyla::fused_cpu_attention``)."""

from hyla.attention.kernels.c.wrapper import fused_cpu_hypernetwork_attention, fused_cpu_unsupported_reason
from hyla.attention.kernels.errors import CpuKernelUnavailableError

__all__ = ["CpuKernelUnavailableError", "fused_cpu_hypernetwork_attention", "fused_cpu_unsupported_reason"]
