"""Deprecated: ``hyla.train.rundir`` moved to ``hyla.train.run.folder`` (the run folder with its checkpoints)."""

from __future__ import annotations

import warnings

from hyla.train.run.folder import *  # noqa: F403

warnings.warn("hyla.train.rundir is deprecated; import hyla.train.run.folder instead", DeprecationWarning, stacklevel=2)
