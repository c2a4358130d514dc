"""hyla: Attention as a Hypernetwork (Schug et al., ICLR 2025) in PyTorch."""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hyla import functional
    from hyla.attention import PRESETS, Attention, AttentionConfig, attention_preset
    from hyla.train.run.folder import TrainedRun

__version__ = "0.1.0"
__all__ = ["PRESETS", "Attention", "AttentionConfig", "__version__", "attention_preset", "functional", "load"]
#: what ``import hyla`` offers from ``hyla.attention``, imported on first use: ``import hyla`` does not import
#: torch, so the ``hyla`` command can preload MKL's override (``hyla.cpu``) before torch is first imported
_FROM_ATTENTION = ("PRESETS", "Attention", "AttentionConfig", "attention_preset")
#: submodules that ``hyla.<name>`` imports on first use, for the same reason (``hyla.functional.attention``)
_LAZY_SUBMODULES = ("functional",)


def __getattr__(name: str) -> Any:
    if name in _FROM_ATTENTION:
        return getattr(importlib.import_module("hyla.attention"), name)
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"hyla.{name}")
    raise AttributeError(f"module 'hyla' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def load(run_dir: str | os.PathLike[str]) -> TrainedRun:
    """The trained model of a run directory, with its task and config, in eval mode.

    A finished run's final weights (``model.safetensors``), else its latest checkpoint; what
    ``hyla.train.run.folder.load_trained`` returns: ``.model``, ``.task``, ``.config``, ``.path``,
    ``.step`` (the updates its weights had) and ``.weights`` (``"final"`` or ``"checkpoint at step N"``).

    ``run = hyla.load("results/sweeps/table_a1_fuzzy/hyla-lr0.001-weight_decay0.1-seed0")``
    """
    from hyla.train.run.folder import load_trained  # lazy, as the attention module above

    return load_trained(run_dir)
