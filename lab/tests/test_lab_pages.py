"""The lab's pages say what its records give: the README's paper table, the docs' results page, the demo's
packaged records; every committed record is what its sweep plans today, and each finished run loads."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from hyla.train.config import RESUMABLE_CHANGES, load_config
from hyla.train.sweeps import load_sweep

ROOT = Path(__file__).resolve().parents[2]
#: the committed sweep records the README table and the results page are made from
RECORDS = ROOT / "lab" / "runs"
#: the lab's own sweep files (the packaged ones go by name)
LAB_SWEEPS = ROOT / "lab" / "lm"


def sweep_file(name: str) -> str:
    """The sweep file a record folder of ``lab/runs`` was trained from: the lab's, else the packaged one."""
    lab = LAB_SWEEPS / f"{name}.yaml"
    return str(lab) if lab.is_file() else name


def test_readme_table_is_what_the_records_give() -> None:
    from hyla.analysis.paper_report import readme_table, replace_readme_table

    text = (ROOT / "README.md").read_text()
    expected = replace_readme_table(text, readme_table(RECORDS))
    assert text == expected, "README.md's table is stale: run `hyla report --readme-table --out README.md`"


def test_docs_results_page_is_paper_md_with_the_records_tables() -> None:
    """The site's results page is ``lab/paper.md`` with its figures (the docs hook adds them); each
    paper sweep's table in it is what the records give, and every figure a page shows is in the site."""

    from hyla.analysis.paper_report import PAPER_SWEEPS, chosen_table
    from hyla.analysis.selection import sweep_results
    from hyla.train.sweeps import load_sweep

    spec = importlib.util.spec_from_file_location("results_hook", ROOT / "docs" / "_hooks" / "results.py")
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    sources = hook.results_sources()
    paper = ROOT / "lab" / "paper.md"
    assert sources[hook.PAPER] == paper and sources[hook.PAGE] == ROOT / "lab" / "README.md"
    text = paper.read_text()
    for name in PAPER_SWEEPS:
        table = "\n".join(chosen_table(sweep_results(load_sweep(name), RECORDS)))
        assert f"## {name}\n" in text and table in text, (
            f"lab/paper.md's {name} table is stale: run `python lab/paper.py`"
        )
    for page in (text, (ROOT / "docs" / "index.md").read_text()):
        shown = set(re.findall(r"\]\((paper/[^)]+\.png)\)", page))
        assert shown and shown <= set(sources), f"figures not in the site: {sorted(shown - set(sources))}"


def test_the_package_carries_the_demos_records_and_falls_back_to_them(tmp_path: Path) -> None:
    """An installed wheel has no ``lab/tables/``: ``hyla demo`` then starts from the package's copies, which must
    be the committed records byte for byte (refresh: copy each run's config.yaml and metrics.jsonl over)."""
    from hyla.demo import DEMO_VARIANTS, PACKAGED_RECORDS, paper_records

    committed = RECORDS
    in_clone = paper_records("table_a1_fuzzy", committed, list(DEMO_VARIANTS))
    packaged = paper_records("table_a1_fuzzy", tmp_path / "elsewhere", list(DEMO_VARIANTS))
    assert sorted(p.name for p in packaged.values()) == sorted(p.name for p in in_clone.values())
    for variant, record in packaged.items():
        assert record.is_relative_to(PACKAGED_RECORDS) and in_clone[variant].is_relative_to(committed)
        assert sorted(f.name for f in record.iterdir()) == ["config.yaml", "metrics.jsonl"]
        for name in ("config.yaml", "metrics.jsonl"):
            assert (record / name).read_bytes() == (in_clone[variant] / name).read_bytes(), f"{variant}/{name}"


def test_every_committed_record_is_what_its_sweep_plans_today() -> None:
    """A sweep's runs must share one setup: a config change that a record predates (e.g. the authors'
    128 relative-position buckets for fuzzy logic) is pinned in the sweep file until every run is redone,
    so the records and the runs still to train compare."""
    from hyla.train.build import build_task, sized_config

    root = RECORDS
    checked = 0
    tasks: dict[str, object] = {}  # one task per data setup: a text task trains its tokenizer when built
    for sweep_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for spec in load_sweep(sweep_file(sweep_dir.name)).runs():
            recorded = sweep_dir / spec.name / "config.yaml"
            if not recorded.is_file():
                continue
            planned = load_config(spec.config, list(spec.overrides))
            data = repr((planned.to_dict()["data"], planned.seed))
            task = tasks[data] = tasks[data] if data in tasks else build_task(planned)
            planned = sized_config(planned, task).to_dict()
            # read as a resume reads it: an option added after the record was made takes its default, which is
            # what the record ran; every value the record names must be the planned one
            ran = load_config(str(recorded), []).to_dict()
            for key in RESUMABLE_CHANGES:  # how often a run evaluates or logs, how a step runs: not what it trains
                section, name = key.split(".")
                planned[section].pop(name), ran[section].pop(name)
            assert planned == ran, f"{recorded} is not what {sweep_dir.name} plans"
            checked += 1
    assert checked >= 12  # the Table A1 fuzzy and SRAVEN records, the init follow-up


FINISHED = sorted(p.parent for p in RECORDS.glob("*/*/model.safetensors"))


def test_the_lab_has_finished_runs_with_weights() -> None:
    assert len(FINISHED) >= 20 and {p.parent.name for p in FINISHED} >= {"table_a1_fuzzy", "table_a1_sraven"}


@pytest.mark.parametrize("run_dir", FINISHED, ids=[f"{p.parent.name}/{p.name}" for p in FINISHED])
def test_hyla_load_opens_every_finished_run(run_dir: Path) -> None:
    import hyla

    run = hyla.load(run_dir)
    assert run.weights == "final" and run.step == run.config.train.steps and not run.model.training


def test_the_site_shows_lab_links_as_paths() -> None:
    spec = importlib.util.spec_from_file_location("results_hook", ROOT / "docs" / "_hooks" / "results.py")
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    text = "see [the table](tables/fast_blas.md) and [the paper](paper.md), or [a site](https://x.org)"
    assert hook.lab_links_as_paths(text) == (
        "see the table (`lab/tables/fast_blas.md`) and [the paper](paper.md), or [a site](https://x.org)"
    )


def test_a_runs_record_files_are_not_ignored_by_git() -> None:
    """What a finished run keeps (config, metrics, pieces, weights) must be addable: a pattern for scratch
    folders (``runs/``) once matched ``lab/runs`` itself."""
    import shutil
    import subprocess

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    names = [f"lab/runs/sweep/run/{n}" for n in ("config.yaml", "metrics.jsonl", "made_by.jsonl", "model.safetensors")]
    done = subprocess.run(["git", "check-ignore", *names], cwd=ROOT, capture_output=True, text=True)
    assert done.stdout.split() == []  # exit 1: none ignored
    kept_local = subprocess.run(["git", "check-ignore", "lab/runs/sweep/run/checkpoints/latest"], cwd=ROOT)
    assert kept_local.returncode == 0  # checkpoints stay local unless added on purpose
