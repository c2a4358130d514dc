"""The API reference renders: Google-style ``Args:`` as parameter tables, no raw Sphinx roles, one entry per
object. Builds the site (a few seconds) into a scratch folder."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tiny import HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def reference_html(tmp_path_factory: pytest.TempPathFactory) -> str:
    pytest.importorskip("mkdocs")
    site = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stderr
    return (site / "reference" / "index.html").read_text()


def test_the_attention_module_has_a_parameter_table(reference_html: str) -> None:
    section = reference_html.split('id="hyla.attention.Attention"', 1)[1].split('id="hyla.attention.', 1)[0]
    assert "doc-section-title" in section and "<code>num_heads</code>" in section


def test_no_raw_sphinx_role_is_shown(reference_html: str) -> None:
    assert not re.findall(r":(?:class|mod|func|meth|data|attr|exc):(?:`|<code>)", reference_html)


def test_each_object_has_one_entry(reference_html: str) -> None:
    ids = re.findall(r'id="(hyla\.[\w.]+)"', reference_html)
    assert ids.count("hyla.attention.Attention") == 1 and len(ids) == len(set(ids))
