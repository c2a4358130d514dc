"""Task generators: SRAVEN and fuzzy-logic regression (and text for language modeling)."""

from __future__ import annotations

from typing import Any

from hyla.tasks.base import Batch, Task
from hyla.tasks.fuzzy_logic import FuzzyLogic

TASKS: tuple[str, ...] = ("sraven", "fuzzy_logic")


def make_task(name: str, **kwargs: Any) -> Task:
    """Build a task by name (``sraven`` | ``fuzzy_logic``) with its constructor arguments."""
    if name == "fuzzy_logic":
        return FuzzyLogic(**kwargs)
    if name == "sraven":
        from hyla.tasks.sraven import SRaven

        return SRaven(**kwargs)
    raise ValueError(f"task {name!r} is unknown; allowed values: {', '.join(TASKS)}")


__all__ = ["TASKS", "Batch", "FuzzyLogic", "Task", "make_task"]
