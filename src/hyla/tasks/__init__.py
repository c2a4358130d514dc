"""Task generators: SRAVEN and fuzzy-logic regression (and text for language modeling), and their registry.

A task is its module (the :class:`~hyla.tasks.base.Task`, an options dataclass holding its ``data.*``
config keys, and ``Task.from_options``) plus one line in :data:`REGISTRY`; the experiment config's
``data`` section is assembled from the registered options (``hyla.train.config.DataConfig``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hyla.tasks.base import Batch, Task
from hyla.tasks.fuzzy_logic import FuzzyLogic, FuzzyLogicOptions
from hyla.tasks.sraven import RULE_NAMES, SRaven, SRavenOptions
from hyla.tasks.text import TextOptions, TextTask


@dataclass(frozen=True)
class TaskEntry:
    task: type[Task]
    options: type  # the task's options dataclass: its data.* config keys and their defaults

    def build(self, options: Any, split_seed: int, run_dir: Path | None = None) -> Task:
        return self.task.from_options(options, split_seed, run_dir)


#: ``data.task`` -> its task class and options
REGISTRY: dict[str, TaskEntry] = {
    "sraven": TaskEntry(SRaven, SRavenOptions),
    "fuzzy_logic": TaskEntry(FuzzyLogic, FuzzyLogicOptions),
    "text": TaskEntry(TextTask, TextOptions),
}
#: the problem tasks :func:`make_task` builds by name (text needs a corpus: ``data.task=text``)
TASKS: tuple[str, ...] = ("sraven", "fuzzy_logic")


def task_entry(name: str) -> TaskEntry:
    if name not in REGISTRY:
        raise ValueError(f"data.task={name!r} is not valid; allowed values: {', '.join(REGISTRY)}")
    return REGISTRY[name]


def make_task(name: str, **kwargs: Any) -> Task:
    """Build a task by name (``sraven`` | ``fuzzy_logic``; ``fuzzy-logic`` also accepted) with its
    constructor arguments."""
    key = name.replace("-", "_")
    if key not in TASKS:
        raise ValueError(f"task {name!r} is unknown; allowed values: {', '.join(TASKS)}")
    return REGISTRY[key].task(**kwargs)


__all__ = ["REGISTRY", "RULE_NAMES", "TASKS", "Batch", "FuzzyLogic", "SRaven", "Task", "TaskEntry", "make_task"]
