"""Run attention through the backend ``choose`` picks: what tests of the policy and the backends share."""

from __future__ import annotations

from torch import Tensor

from hyla.attention.backend import AttentionCall
from hyla.attention.config import AttentionConfig
from hyla.attention.dispatch import choose


def run_chosen(
    requested: str, q: Tensor, k: Tensor, v: Tensor, config: AttentionConfig, **call: object
) -> tuple[str, Tensor]:
    """The name of the backend chosen for ``requested`` and the heads it computes."""
    attention_call = AttentionCall(q, k, v, config, **call)  # type: ignore[arg-type]
    backend = choose(requested, attention_call)
    return backend.name, backend(attention_call)
