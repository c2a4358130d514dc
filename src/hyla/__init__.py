"""hyla: Attention as a Hypernetwork (Schug et al., ICLR 2025) in PyTorch."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from hyla.attention import PRESETS, Attention, AttentionConfig, attention_preset

if TYPE_CHECKING:
    from hyla.train.rundir import TrainedRun

__version__ = "0.1.0"
__all__ = ["PRESETS", "Attention", "AttentionConfig", "__version__", "attention_preset", "load"]


def load(run_dir: str | os.PathLike[str]) -> TrainedRun:
    """The trained model of a run directory, with its task and config, in eval mode.

    A finished run's final weights (``model.safetensors``), else its latest checkpoint; what
    :func:`hyla.train.rundir.load_trained` returns: ``.model``, ``.task``, ``.config``, ``.path``,
    ``.step`` (the updates its weights had) and ``.weights`` (``"final"`` or ``"checkpoint at step N"``).

    ``run = hyla.load("results/sweeps/table_a1_sraven/hyla-lr0.001-weight_decay0.1-seed0")``
    """
    from hyla.train.rundir import load_trained  # lazy: `import hyla` stays as light as the attention module

    return load_trained(run_dir)
