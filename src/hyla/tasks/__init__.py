"""Task generators: SRAVEN and fuzzy-logic regression (and text for language modeling), and their registry.

A task is its module (the ``Task`` with its options dataclass, ``Task.options``,
holding its ``data.*`` config keys) plus one ``register_task`` call below, which also states what the rest of
the code asks about it (``TaskEntry``: its paper column, export, latent-code probe...); the experiment config's
``data`` section is assembled from the registered options (``hyla.train.config.data_config_class``).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, TypeVar

from hyla.tasks import fuzzy_logic, sraven, sraven_ambiguity
from hyla.tasks.base import Batch, Task
from hyla.tasks.entry import PaperColumn, TaskEntry
from hyla.tasks.fuzzy_logic import FuzzyLogic, FuzzyLogicOptions
from hyla.tasks.sraven import RULE_NAMES, SRaven, SRavenOptions
from hyla.tasks.text import TextOptions, TextTask

#: ``data.task`` -> its task class and the facts about it; ``register_task`` adds to it
REGISTRY: dict[str, TaskEntry] = {}

TaskClass = TypeVar("TaskClass", bound=type[Task])

#: old-style class methods whose result is the fact (``from_export_options`` and ``matches_paper_setting`` are
#: the fact themselves: a bound class method is the callable the entry holds)
_CALLED_FACTS = frozenset({"export_options"})


def _class_facts(task: type[Task], given: dict[str, Any]) -> dict[str, Any]:
    """The facts that a task written before they moved to its entry sets on its class, each with a warning."""
    own = {name for klass in task.__mro__[: task.__mro__.index(Task)] for name in vars(klass)}
    found: dict[str, Any] = {}
    for name in (f.name for f in dataclasses.fields(TaskEntry) if f.name != "task"):
        if name in given or name not in own:
            continue
        value = getattr(task, name)
        found[name] = value() if name in _CALLED_FACTS else value
        warnings.warn(
            f"{task.__name__}.{name} is deprecated: pass {name}=... to register_task instead",
            DeprecationWarning,
            stacklevel=3,
        )
    if "not_stackable_because" in own:  # the training layer decides which runs stack
        warnings.warn(
            f"{task.__name__}.not_stackable_because is deprecated and no longer read: which runs can be stacked "
            "is the trainer's rule (hyla.train.engines.stacked)",
            DeprecationWarning,
            stacklevel=3,
        )
    return found


def register_task(task: TaskClass, **facts: Any) -> TaskClass:
    """Make ``task`` a ``data.task`` value under its ``name``, with the facts of its entry (``TaskEntry``'s
    fields, e.g. ``paper_column=...``, ``latent_probe="rule"``); usable as a class decorator without facts."""
    if task.name in REGISTRY and REGISTRY[task.name].task is not task:
        raise ValueError(f"a task named {task.name!r} is already registered ({REGISTRY[task.name].task.__name__})")
    REGISTRY[task.name] = TaskEntry(task, **_class_facts(task, facts), **facts)
    return task


# the registry: a new task is one more call here
register_task(
    SRaven,
    # the plateaus seen in both codes: 12-20% OOD at lr 1e-3 and 29-31% at lr 3e-4; runs past them went on past
    # 43%
    paper_column=PaperColumn(1, "acc", "OOD accuracy (%)", past_plateau=0.40),
    paper_config="sraven",
    matches_paper_setting=sraven.matches_paper_setting,
    export_help="symbolic Raven problems: grid, rules, perm, task_id, rule_names",
    export_options=sraven.SRavenExportOptions,
    from_export_options=sraven.from_export_options,
    latent_probe="rule",
    ambiguity_criteria=sraven_ambiguity.CRITERIA,  # strictest first
)
register_task(
    FuzzyLogic,
    paper_column=PaperColumn(0, "r2", "OOD R^2 (%)"),
    paper_config="fuzzy_logic",
    matches_paper_setting=fuzzy_logic.matches_paper_setting,
    export_help="fuzzy-logic regression sequences: x, y, terms, task_id",
    latent_probe="term",
    metric_title="R^2",
)
register_task(TextTask, metric_title="perplexity", standalone=False, generates_text=True)


def standalone_tasks() -> tuple[str, ...]:
    """The tasks ``make_task`` builds by name (text needs a corpus: ``data.task=text``)."""
    return tuple(name for name, entry in REGISTRY.items() if entry.standalone)


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
