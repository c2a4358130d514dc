"""Which backend covers which attention variant: the one table that the backends' checks, ``auto`` and the
tests read.

A variant is covered by its ``normalization`` and ``value_network`` (every phi is covered by every backend);
``covered_presets`` turns that into the named presets. The table also holds the simple dtype, device
and ``torch.vmap`` limits; what depends on sizes or on the machine (the Triton kernel's head counts and
head dims, a C compiler, Triton being installed, the interpreter) stays with each backend's own
``*_unsupported_reason``, which consults this table first.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hyla.attention.config import NORMALIZATIONS, PRESETS, VALUE_NETWORKS, AttentionConfig


@dataclass(frozen=True)
class Coverage:
    """What one backend can run.

    ``dtypes`` / ``devices`` None: every floating dtype / every device type. ``vmap``: runs inside
    ``torch.vmap`` (stacked runs) without falling back. ``first_order_only``: double backward raises.
    ``dropout``: applies attention dropout itself (the others leave a training step with dropout to the
    direct form).
    """

    normalizations: tuple[str, ...]
    value_networks: tuple[str, ...]
    dtypes: tuple[torch.dtype, ...] | None = None
    devices: tuple[str, ...] | None = None
    vmap: bool = True
    first_order_only: bool = False
    dropout: bool = False


_KERNEL_NORMALIZATIONS = ("rms_head", "none")  # RMSHead and no normalization are local to each (q, k) pair

#: backend -> what it covers (``auto`` is a choice among these, see ``hyla.attention.dispatch``)
COVERAGE: dict[str, Coverage] = {
    "direct": Coverage(NORMALIZATIONS, VALUE_NETWORKS, dropout=True),
    "chunked": Coverage(NORMALIZATIONS, VALUE_NETWORKS),
    "manual_backward": Coverage(_KERNEL_NORMALIZATIONS, ("hyper",), vmap=False, first_order_only=True),
    # (the C kernel runs in torch.vmap where its batching rule is registered: hyla.train.engines.vmap_rules)
    # (each (batch, query) row computes all its heads and keys, so softmax over keys is local to it too)
    "fused_cpu": Coverage(
        NORMALIZATIONS,
        ("hyper", "linear"),
        (torch.float32, torch.float64),
        ("cpu",),
        first_order_only=True,
        dropout=True,
    ),
    # CPU tensors also run, under TRITON_INTERPRET=1 only (the interpreter: slow, for tests)
    "fused": Coverage(
        _KERNEL_NORMALIZATIONS,
        ("hyper",),
        (torch.float32, torch.bfloat16, torch.float16),
        ("cuda",),
        vmap=False,
        first_order_only=True,
    ),
}


def variant_unsupported_reason(backend: str, config: AttentionConfig) -> str | None:
    """None when ``backend`` covers ``config``'s normalization and value network, else why not."""
    cov = COVERAGE[backend]
    if config.value_network not in cov.value_networks:
        return f"value_network={config.value_network!r} (covered: {', '.join(cov.value_networks)})"
    if config.normalization not in cov.normalizations:
        return f"normalization={config.normalization!r} (covered: {', '.join(cov.normalizations)})"
    return None


def dropout_unsupported_reason(backend: str, dropout_keep: object | None) -> str | None:
    """Why ``backend`` cannot run a forward with attention dropout (a keep-mask given), or None."""
    if dropout_keep is None or COVERAGE[backend].dropout:
        return None
    droppers = ", ".join(name for name, cov in COVERAGE.items() if cov.dropout)
    return f"attention dropout (covered: {droppers})"


def dtype_names(backend: str) -> str:
    """The covered dtypes as text, e.g. ``"float32, float64"``."""
    dtypes = COVERAGE[backend].dtypes
    return "any floating dtype" if dtypes is None else ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def covers_dtype(backend: str, dtype: torch.dtype) -> bool:
    dtypes = COVERAGE[backend].dtypes
    return dtype.is_floating_point if dtypes is None else dtype in dtypes


def covered_presets(backend: str) -> tuple[str, ...]:
    """The named presets (``PRESETS``) whose variant ``backend`` covers."""
    return tuple(name for name, config in PRESETS.items() if variant_unsupported_reason(backend, config) is None)
