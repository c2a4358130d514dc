"""The C ops' ``torch.vmap`` rules live with stacking: without them the ops step aside inside ``torch.vmap`` (the
direct form, torch's GELU) and give the same numbers; with them (``hyla.train.engines.vmap_rules``) the C kernels
run."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

PROBE = """
import sys, torch
from hyla.attention.backend import AttentionCall
from hyla.attention.config import attention_preset
from hyla.attention.dispatch import choose
from hyla.ops import gelu
if sys.argv[1] == "rules":
    import hyla.train.engines.vmap_rules
config = attention_preset("hyla")
q = torch.randn(2, 1, 3, 4, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
names = []
def heads(q, k, v):
    call = AttentionCall(q, k, v, config)
    backend = choose("auto", call)
    names.append(backend.name)
    return gelu.gelu(backend(call), approximate="tanh")
y = torch.vmap(heads)(q, q, q)
print(names[0], float(y.sum()))
"""


def _probe(mode: str) -> tuple[str, float]:
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    name, total = done.stdout.split()
    return name, float(total)


def test_the_c_ops_run_inside_vmap_only_with_the_rules_of_the_training_layer() -> None:
    from hyla.train.engines.vmap_rules import HAS_VMAP_RULES

    if not HAS_VMAP_RULES:
        pytest.skip(f"torch {torch.__version__} has no custom-op vmap rules")
    bare, bare_total = _probe("bare")
    ruled, ruled_total = _probe("rules")
    assert bare != "fused_cpu"  # stepped aside: no batching rule registered
    if ruled != "fused_cpu":
        pytest.skip("the C kernel is unavailable here (no C compiler)")
    assert ruled_total == pytest.approx(bare_total, rel=1e-12)


def test_stacking_registers_the_rules() -> None:
    import hyla.train.engines.stacked  # noqa: F401
    from hyla.attention.kernels.c.wrapper import ATTENTION_OP
    from hyla.ops.clib import BATCHED_OPS
    from hyla.ops.gelu import GELU_OP
    from hyla.train.engines.vmap_rules import HAS_VMAP_RULES

    assert (ATTENTION_OP in BATCHED_OPS and GELU_OP in BATCHED_OPS) == HAS_VMAP_RULES
