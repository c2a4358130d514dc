"""lab/index.py: the index covers every entry of lab/ and lab/tables/, names no path that is gone, and
lab/README.md is the page it generates; on a made-up lab it reports the missing entry and the stale path."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

LAB = Path(__file__).resolve().parents[1]


def _load_index_module() -> ModuleType:
    """lab/ is not a package: load lab/index.py from its path."""
    spec = importlib.util.spec_from_file_location("lab_index", LAB / "index.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


index = _load_index_module()


def test_every_entry_of_lab_and_its_tables_is_indexed() -> None:
    assert index.missing_entries(LAB) == []


def test_no_index_path_is_gone() -> None:
    assert index.stale_paths(LAB) == []


def test_every_entry_is_complete() -> None:
    assert index.entry_problems(index.load_index(LAB)) == []


def test_readme_is_what_the_index_generates() -> None:
    expected = index.render_readme(index.load_index(LAB))
    assert (LAB / "README.md").read_text(encoding="utf-8") == expected, "run python lab/index.py"


def test_readme_names_no_issue_numbers() -> None:
    assert re.findall(r"#\d+", (LAB / "README.md").read_text(encoding="utf-8")) == []


def _lab(tmp_path: Path, index_yaml: str) -> Path:
    """A made-up lab: two tables (a file and a folder), a notebook, the index's own files."""
    lab = tmp_path / "lab"
    (lab / "tables" / "folder").mkdir(parents=True)
    (lab / "tables" / "folder" / "README.md").write_text("x")
    (lab / "tables" / "a.md").write_text("x")
    (lab / "tables" / "a.png").write_text("x")
    (lab / "notes.md").write_text("x")
    (lab / "index.py").write_text("")
    (lab / "README.md").write_text("")
    (lab / "index.yaml").write_text(index_yaml)
    return lab


def _yaml(*paths: list[str], section: str = "S", kind: str = "table") -> str:
    """An index with one complete entry per list of paths."""
    entries = "".join(
        f"  - paths: {list(p)}\n    section: {section}\n    kind: {kind}\n    claim: c\n"
        "    command: [cmd]\n    machine: m\n    date: '2026-11-22'\n"
        for p in paths
    )
    return f"sections: [S]\nentries:\n{entries}"


def test_a_missing_entry_and_a_stale_path_are_reported(tmp_path: Path) -> None:
    lab = _lab(tmp_path, _yaml(["tables/a.md", "tables/a.png"], ["gone.md"]))
    assert index.missing_entries(lab) == ["notes.md", "tables/folder"]
    assert index.stale_paths(lab) == ["gone.md"]


def test_a_fully_indexed_lab_has_nothing_missing(tmp_path: Path) -> None:
    lab = _lab(tmp_path, _yaml(["tables/a.md", "tables/a.png"], ["tables/folder/"], ["notes.md"]))
    assert index.missing_entries(lab) == []
    assert index.stale_paths(lab) == []


def test_a_group_entry_covers_only_the_files_it_lists(tmp_path: Path) -> None:
    lab = _lab(tmp_path, _yaml(["tables/a.md"], ["tables/folder/"], ["notes.md"]))
    assert index.missing_entries(lab) == ["tables/a.png"]


def test_a_name_that_only_shares_a_prefix_does_not_cover(tmp_path: Path) -> None:
    lab = _lab(tmp_path, _yaml(["tables/a.md", "tables/a.png", "tables/folder_b/"], ["notes.md"]))
    assert index.missing_entries(lab) == ["tables/folder"]


def test_a_file_listed_as_a_folder_is_stale(tmp_path: Path) -> None:
    lab = _lab(tmp_path, _yaml(["tables/a.md/", "tables/a.png", "tables/folder/", "notes.md"]))
    assert index.stale_paths(lab) == ["tables/a.md/"]


def test_incomplete_entries_are_reported(tmp_path: Path) -> None:
    text = _yaml(["notes.md"], kind="chart", section="Elsewhere") + "  - paths: [tables/a.md]\n"
    problems = index.entry_problems(index.load_index(_lab(tmp_path, text)))
    # the first: unknown kind and section; the second: no section, kind, claim, machine, date or command
    assert len(problems) == 2 + 6


@pytest.mark.parametrize("problem", ["missing", "stale", "stale_readme"])
def test_check_exits_1_on_each_problem(tmp_path: Path, problem: str) -> None:
    paths = [["tables/a.md", "tables/a.png"], ["tables/folder/"], ["notes.md"]]
    if problem == "stale":
        paths.append(["gone.md"])
    lab = _lab(tmp_path, _yaml(*paths))
    assert index.main(["--lab", str(lab)]) == (0 if problem != "stale" else 1)
    if problem == "missing":
        (lab / "tables" / "new.md").write_text("x")
    if problem == "stale_readme":
        (lab / "README.md").write_text("edited by hand\n")
    assert index.main(["--check", "--lab", str(lab)]) == 1


def test_check_passes_once_the_page_is_written(tmp_path: Path) -> None:
    lab = _lab(tmp_path, _yaml(["tables/a.md", "tables/a.png"], ["tables/folder/"], ["notes.md"]))
    assert index.main(["--check", "--lab", str(lab)]) == 1
    assert index.main(["--lab", str(lab)]) == 0
    assert index.main(["--check", "--lab", str(lab)]) == 0
    assert index.check(lab) == []
