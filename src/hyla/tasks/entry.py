"""A task's registry entry: what the rest of the code asks about a task, kept apart from the ``Task`` itself.

A ``Task`` only samples, scores and states its sizes; which paper column it fills, how ``hyla data`` exports it
and which latent-code probe the analysis runs are facts about where it stands in the library, so they live
here and a new task states them once, in its ``register_task`` call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hyla.tasks.base import Task


@dataclass(frozen=True)
class PaperColumn:
    """Where a task's runs stand in the paper's Table A1 (``hyla.analysis.paper_numbers``)."""

    index: int  # the column of Table A1, also the order of the tasks in reports
    metric: str  # the metric it reports (on ``ood``)
    title: str  # the column's title, e.g. ``"OOD accuracy (%)"``
    #: an OOD level of ``metric`` above every plateau the task's runs were seen to sit on before they climbed
    #: (None: no plateau seen); ``hyla report --paper`` lists when each run first reached it
    past_plateau: float | None = None


@dataclass(frozen=True)
class TaskEntry:
    """A registered task and the facts about it that code outside ``hyla.tasks`` asks for."""

    task: type[Task]
    #: its column in the paper's Table A1 (None: not in the paper)
    paper_column: PaperColumn | None = None
    #: the config in ``hyla/configs/`` with the paper's model for this task (``hyla bench step``)
    paper_config: str | None = None
    #: whether a run's config (a dict) is the data and model setting of the paper's column (None: never)
    matches_paper_setting: Callable[[dict[str, Any]], bool] | None = None
    #: help of its ``hyla data`` subcommand (None: not exported)
    export_help: str | None = None
    #: the dataclass whose fields are the ``hyla data`` flags, their ``metadata["help"]`` and defaults
    #: (None: the task's ``options``)
    export_options: type | None = None
    #: the task of ``hyla data`` flags (every field of the export options) and a split seed (None: the
    #: task's constructor, the flags as its arguments)
    from_export_options: Callable[[dict[str, Any], int], Task] | None = None
    #: the latent-code probe its analysis runs (``hyla.analysis.latent_summary``): "rule" (labels
    #: ``query_rule``, fit on ``test``, scored on ``ood``; also topographic similarity and pictures),
    #: "term" (labels ``terms``, ridge on ``test``) or None (no latent-code analysis)
    latent_probe: str | None = None
    #: what ``primary_metric`` is, in words for report columns ("accuracy": "test accuracy (%)")
    metric_title: str = "accuracy"
    #: built from its options' defaults alone (``make_task``, ``hyla bench data``); text needs a corpus
    standalone: bool = True
    #: a trained run can continue text (``hyla generate``): the task has ``encode`` and ``decode``
    generates_text: bool = False
    #: criteria of ``Task.ambiguous_fraction`` (``hyla bench data --ambiguity``; empty: none)
    ambiguity_criteria: tuple[str, ...] = ()

    @property
    def options(self) -> type:
        """The task's options dataclass: its ``data.*`` config keys and their defaults."""
        return self.task.options

    def build(self, options: Any, split_seed: int, run_dir: Path | None = None) -> Task:
        return self.task.from_options(options, split_seed, run_dir)

    def flag_options(self) -> type:
        """The dataclass of the ``hyla data`` flags."""
        return self.export_options or self.task.options

    def task_from_flags(self, values: dict[str, Any], split_seed: int) -> Task:
        """The task of ``hyla data`` flags (``values``: every field of ``flag_options``)."""
        if self.from_export_options is not None:
            return self.from_export_options(values, split_seed)
        return self.task(**values, split_seed=split_seed)

    def in_paper_setting(self, config: dict[str, Any]) -> bool:
        """Whether a run's config is in the paper's column of this task."""
        return self.matches_paper_setting is not None and self.matches_paper_setting(config)
