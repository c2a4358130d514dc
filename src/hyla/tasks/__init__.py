"""Task generators: SRAVEN and fuzzy-logic regression (and text for language modeling), and their registry.

A task is its module (the ``Task`` with its options dataclass, ``Task.options``,
holding its ``data.*`` config keys) plus one line in the registration below; the experiment config's
``data`` section is assembled from the registered options (``hyla.train.config.data_config_class``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hyla.tasks.base import Batch, PaperColumn, Task
from hyla.tasks.fuzzy_logic import FuzzyLogic, FuzzyLogicOptions
from hyla.tasks.sraven import RULE_NAMES, SRaven, SRavenOptions
from hyla.tasks.text import TextOptions, TextTask


@dataclass(frozen=True)
class TaskEntry:
    task: type[Task]

    @property
    def options(self) -> type:
        """The task's options dataclass: its ``data.*`` config keys and their defaults."""
        return self.task.options

    def build(self, options: Any, split_seed: int, run_dir: Path | None = None) -> Task:
        return self.task.from_options(options, split_seed, run_dir)


#: ``data.task`` -> its task class (and options); ``register_task`` adds to it
REGISTRY: dict[str, TaskEntry] = {}


def register_task(task: type[Task]) -> type[Task]:
    """Make ``task`` a ``data.task`` value under its ``name`` (usable as a class decorator)."""
    if task.name in REGISTRY and REGISTRY[task.name].task is not task:
        raise ValueError(f"a task named {task.name!r} is already registered ({REGISTRY[task.name].task.__name__})")
    REGISTRY[task.name] = TaskEntry(task)
    return task


# the registry: a new task is one more line here
register_task(SRaven)
register_task(FuzzyLogic)
register_task(TextTask)


def standalone_tasks() -> tuple[str, ...]:
    """The tasks ``make_task`` builds by name (text needs a corpus: ``data.task=text``)."""
    return tuple(name for name, entry in REGISTRY.items() if entry.task.standalone)


def task_entry(name: str) -> TaskEntry:
    if name not in REGISTRY:
        raise ValueError(f"data.task={name!r} is not valid; allowed values: {', '.join(REGISTRY)}")
    return REGISTRY[name]


def make_task(name: str, **kwargs: Any) -> Task:
    """Build a task by name (``sraven`` | ``fuzzy_logic``; ``fuzzy-logic`` also accepted) with its
    constructor arguments."""
    key = name.replace("-", "_")
    if key not in standalone_tasks():
        raise ValueError(f"task {name!r} is unknown; allowed values: {', '.join(standalone_tasks())}")
    return REGISTRY[key].task(**kwargs)


__all__ = [
    "REGISTRY",
    "RULE_NAMES",
    "Batch",
    "FuzzyLogic",
    "FuzzyLogicOptions",
    "PaperColumn",
    "SRaven",
    "SRavenOptions",
    "Task",
    "TaskEntry",
    "TextOptions",
    "TextTask",
    "make_task",
    "register_task",
    "standalone_tasks",
    "task_entry",
]
