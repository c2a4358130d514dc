"""MkDocs hook: the site's results page is ``results/paper.md`` itself, with its figures (``results/paper/``).

``hyla report --paper --out results`` writes both from the sweep records (``make test`` checks its tables
against them), so the page is never a copy that could fall behind; the home page shows one of its figures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

RESULTS = Path(__file__).resolve().parents[2] / "results"
#: the site path of the results page; its figures keep paper.md's relative links (``paper/NAME.png``)
PAGE = "results.md"


def results_sources() -> dict[str, Path]:
    """Site path -> file in ``results/``: the page and every figure it may link to."""
    figures = sorted((RESULTS / "paper").glob("*.png"))
    return {PAGE: RESULTS / "paper.md", **{f"paper/{p.name}": p for p in figures}}


def on_files(files: Files, config: Any) -> Files:
    for uri, path in results_sources().items():
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files
