"""``backend="fused"``: the Triton kernel (``.kernel``, needs Triton) beside its wrapper (``.wrapper``,
the custom op ``hyla::fused_attention``; importing it needs neither Triton nor a GPU)."""

from hyla.attention.kernels.errors import FusedUnavailableError
from hyla.attention.kernels.triton.wrapper import (
    fused_hypernetwork_attention,
    fused_unsupported_reason,
    interpreter_enabled,
    launch_fused,
    triton_available,
)

__all__ = [
    "FusedUnavailableError",
    "fused_hypernetwork_attention",
    "fused_unsupported_reason",
    "interpreter_enabled",
    "launch_fused",
    "triton_available",
]
