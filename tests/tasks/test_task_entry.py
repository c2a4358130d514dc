"""A task only samples, scores and states its sizes; what the rest of the code asks about it is its registry
entry's, given to ``register_task``. Tasks written when those facts were class attributes still register, with a
warning that names each attribute."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from hyla.tasks import REGISTRY, PaperColumn, Task, TaskEntry, register_task, task_entry
from hyla.train.config import config_from_dict
from hyla.train.engines.stacked import not_stackable_reason
from toy_task import ToyTask

#: the facts that moved from ``Task`` to its entry, and the stackability that left the task altogether
ENTRY_FACTS = tuple(f.name for f in dataclasses.fields(TaskEntry) if f.name != "task")
MOVED = (*ENTRY_FACTS, "not_stackable_because")
COLUMN = PaperColumn(5, "acc", "OOD toy accuracy (%)")


@dataclass
class ToyExportOptions:
    toy_length: int = 4


class NewStyleToy(ToyTask):
    name = "new_style_toy"


class OldStyleToy(ToyTask):
    """Written against the old interface: the facts are class attributes and class methods."""

    name = "old_style_toy"
    paper_column = COLUMN
    latent_probe = "rule"
    metric_title = "toy accuracy"
    export_help = "old-style toy problems"
    ambiguity_criteria = ("strict",)
    not_stackable_because = "a reason no longer read"

    @classmethod
    def export_options(cls) -> type:
        return ToyExportOptions

    @classmethod
    def matches_paper_setting(cls, config: dict[str, Any]) -> bool:
        return config["data"]["toy_length"] == 6


@pytest.fixture
def cleanup() -> Iterator[None]:
    yield
    for task in (NewStyleToy, OldStyleToy):
        REGISTRY.pop(task.name, None)  # the other tests see the library's tasks only


def test_the_task_interface_carries_none_of_the_entry_facts() -> None:
    for name in MOVED:
        assert not hasattr(Task, name), name
        for entry in REGISTRY.values():
            assert not hasattr(entry.task, name), f"{entry.task.__name__}.{name}"


def test_the_library_registers_its_facts_in_the_entries() -> None:
    sraven, fuzzy, text = task_entry("sraven"), task_entry("fuzzy_logic"), task_entry("text")
    assert (sraven.latent_probe, fuzzy.latent_probe, text.latent_probe) == ("rule", "term", None)
    assert (sraven.metric_title, fuzzy.metric_title, text.metric_title) == ("accuracy", "R^2", "perplexity")
    assert sraven.paper_column is not None and sraven.paper_column.past_plateau == 0.40
    assert fuzzy.paper_column == PaperColumn(0, "r2", "OOD R^2 (%)") and text.paper_column is None
    assert sraven.ambiguity_criteria == ("any_panel", "paper") and fuzzy.ambiguity_criteria == ()
    assert (text.standalone, text.generates_text) == (False, True)
    assert (sraven.standalone, sraven.generates_text) == (True, False)
    assert "rules" in {f.name for f in dataclasses.fields(sraven.flag_options())}
    task = sraven.task_from_flags({**dataclasses.asdict(sraven.options()), "rules": "constant, addition"}, 1)
    assert task.rule_names == ("constant", "addition")  # type: ignore[attr-defined]


def test_a_new_style_task_states_its_facts_to_register_task(cleanup: None) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert register_task(NewStyleToy, paper_column=COLUMN, latent_probe="term") is NewStyleToy
    entry = task_entry("new_style_toy")
    assert (entry.paper_column, entry.latent_probe) == (COLUMN, "term")
    assert (entry.export_help, entry.metric_title) == (None, "accuracy")  # the defaults
    assert entry.flag_options() is ToyTask.options and not entry.in_paper_setting({})
    assert entry.task_from_flags({"toy_length": 3, "toy_dim": 2, "toy_ood_shift": 0.0}, 0).seq_len == 3
    with pytest.raises(TypeError, match="paper_colum"):
        register_task(NewStyleToy, paper_colum=COLUMN)


def test_an_old_style_task_still_registers_with_a_warning_per_attribute(cleanup: None) -> None:
    with pytest.warns(DeprecationWarning) as caught:
        register_task(OldStyleToy, export_help="given to register_task")
    messages = [str(w.message) for w in caught]
    given = {"paper_column", "latent_probe", "metric_title", "ambiguity_criteria", "export_options"}
    for name in given | {"matches_paper_setting"}:
        assert any(f"OldStyleToy.{name}" in m and f"pass {name}=... to register_task" in m for m in messages), name
    assert any("OldStyleToy.not_stackable_because" in m and "no longer read" in m for m in messages)
    assert not any("OldStyleToy.export_help" in m for m in messages)  # the keyword wins, silently
    entry = task_entry("old_style_toy")
    assert (entry.paper_column, entry.latent_probe, entry.metric_title) == (COLUMN, "rule", "toy accuracy")
    assert entry.export_help == "given to register_task" and entry.ambiguity_criteria == ("strict",)
    assert entry.flag_options() is ToyExportOptions  # the class method's result
    assert entry.in_paper_setting({"data": {"toy_length": 6}})
    assert not entry.in_paper_setting({"data": {"toy_length": 5}})
    # which runs stack is the trainer's rule: the old attribute is not read
    cfg = config_from_dict({"data": {"task": "old_style_toy"}})
    assert not_stackable_reason(cfg) is None


def test_language_model_runs_stay_unstackable() -> None:
    reason = not_stackable_reason(config_from_dict({"data": {"task": "text"}}))
    assert reason == "data.task=text (language-model runs are trained one by one)"
