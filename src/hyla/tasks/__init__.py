"""Task generators: SRAVEN and fuzzy-logic regression (and text for language modeling)."""

from __future__ import annotations

from typing import Any

from hyla.tasks.base import Batch, Task
from hyla.tasks.fuzzy_logic import FuzzyLogic
from hyla.tasks.sraven import RULE_NAMES, SRaven

#: names accepted by :func:`make_task`
TASKS: tuple[str, ...] = ("sraven", "fuzzy_logic")


def make_task(name: str, **kwargs: Any) -> Task:
    """Build a task by name (``sraven`` | ``fuzzy_logic``; ``fuzzy-logic`` also accepted) with its
    constructor arguments."""
    key = name.replace("-", "_")
    if key == "sraven":
        return SRaven(**kwargs)
    if key == "fuzzy_logic":
        return FuzzyLogic(**kwargs)
    raise ValueError(f"task {name!r} is unknown; allowed values: {', '.join(TASKS)}")


__all__ = ["RULE_NAMES", "TASKS", "Batch", "FuzzyLogic", "SRaven", "Task", "make_task"]
