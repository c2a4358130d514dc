"""The README and the guides say what is true: every example marked runnable runs, the README's table
markers work, and ``hyla.load`` loads a trained run (the table's numbers against the records: lab/tests)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tiny import HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: a fenced block right after this line is an example that must run
MARKER = "<!-- runnable -->"
FENCE = re.compile(r"^<!-- runnable -->\n```(\w+)\n(.*?)\n```$", re.S | re.M)
#: what an example sees of the repository from its scratch folder (read-only use: examples write under runs/)
SHARED = ("lab", "src", "benchmarks")


def runnable_examples() -> list[tuple[str, str, str]]:
    """``(id, language, code)`` of every runnable example in the README and ``docs/*.md``."""
    found = []
    for path in DOCS:
        text = path.read_text()
        blocks = FENCE.findall(text)
        markers = sum(line == MARKER for line in text.splitlines())
        assert len(blocks) == markers, f"{path.name}: a {MARKER} line not followed by a fenced block"
        for i, (language, code) in enumerate(blocks):
            found.append((f"{path.relative_to(ROOT)}#{i}", language, code))
    return found


EXAMPLES = runnable_examples()


def test_every_guide_has_runnable_examples() -> None:
    pages = {example_id.split("#")[0] for example_id, _, _ in EXAMPLES}
    guides = {f"docs/{p.name}" for p in DOCS[1:]} - {"docs/index.md", "docs/reference.md", "docs/code_layout.md"}
    assert "README.md" in pages and guides <= pages, f"no runnable example in {sorted(guides - pages)}"


@pytest.mark.parametrize(("example_id", "language", "code"), EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_example_runs(example_id: str, language: str, code: str, tmp_path: Path) -> None:
    """Run it as a reader would from the repository root, but in a scratch folder that links the parts of
    the repository the examples read, so that what they write (``runs/``, ``*.npz``) lands there."""
    for name in SHARED:
        (tmp_path / name).symlink_to(ROOT / name)
    bin_dir = str(Path(sys.executable).parent)  # `hyla` and `python` of this environment
    # one thread: the examples are tiny, and the suite runs them beside other tests (xdist)
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ["PATH"], "OMP_NUM_THREADS": "1"}
    if language == "python":
        command = [sys.executable, "-c", code]
    elif language in ("bash", "sh", "shell"):
        command = ["bash", "-euo", "pipefail", "-c", code]
    else:
        raise AssertionError(f"{example_id}: runnable examples are python or bash, not {language!r}")
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, f"{example_id} failed:\n{code}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"


def test_readme_starts_with_demo_and_test_and_stays_short() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    head = "\n".join(lines[:5])
    assert "make demo" in head and "make test" in head
    assert len(lines) <= 160, f"README.md has {len(lines)} lines: move detail into docs/"


def test_readme_table_markers_are_required() -> None:
    from hyla.analysis.paper_report import README_BEGIN, README_END, replace_readme_table

    with pytest.raises(ValueError, match="paper-table"):
        replace_readme_table("no markers here", "| table |")
    assert replace_readme_table(f"a\n{README_BEGIN}\nold\n{README_END}\nb", "new") == (
        f"a\n{README_BEGIN}\nnew\n{README_END}\nb"
    )


def test_readme_table_command_rewrites_only_between_the_markers(tmp_path: Path, capsys) -> None:
    from hyla.analysis.paper_report import README_BEGIN, README_END
    from hyla.cli import main

    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n{README_BEGIN}\nold table\n{README_END}\nrest\n")
    assert main(["report", "--readme-table", "--sweep-root", str(tmp_path / "none"), "--out", str(readme)]) == 0
    text = readme.read_text()
    assert "old table" not in text and text.startswith("# title\n") and text.endswith(f"{README_END}\nrest\n")
    assert "Not run yet: 12 of 12 fuzzy logic rows, 12 of 12 SRAVEN rows" in text
    assert "Not run yet" in capsys.readouterr().out
    readme.write_text("no markers")
    assert main(["report", "--readme-table", "--sweep-root", str(tmp_path / "none"), "--out", str(readme)]) == 2


def test_hyla_load_gives_back_a_trained_run(tmp_path: Path) -> None:
    import torch

    import hyla
    from hyla.train.config import load_config
    from hyla.train.loop import Trainer
    from tiny import tiny_overrides

    cfg = load_config("fuzzy_logic", tiny_overrides(steps=4, every=2))
    Trainer(cfg, tmp_path / "run", quiet=True, progress=False).run()
    run = hyla.load(tmp_path / "run")
    assert run.weights == "final" and run.step == 4 and run.path == tmp_path / "run"
    assert run.config.train == cfg.train and run.config.data == cfg.data and not run.model.training
    batch = run.task.sample(4, "ood", torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert run.model(batch.inputs).shape[:2] == batch.inputs.shape[:2]


def test_import_hyla_stays_light() -> None:
    code = "import sys, hyla; assert 'hyla.train' not in sys.modules and callable(hyla.load)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=HANG_GUARD_S)
