"""Deprecated: ``hyla.train.checkpoint`` moved to ``hyla.train.run.checkpoint`` (the run folder with its
checkpoints)."""

from __future__ import annotations

import warnings

from hyla.train.run.checkpoint import *  # noqa: F403

warnings.warn(
    "hyla.train.checkpoint is deprecated; import hyla.train.run.checkpoint instead", DeprecationWarning, stacklevel=2
)
