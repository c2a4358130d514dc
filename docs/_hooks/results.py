"""MkDocs hook: the site's Results pages are the lab's own generated pages, never copies that could fall behind.

``results.md`` is the lab's index (``lab/README.md``, made by ``python lab/index.py``): every table and figure
the reproduction measured, with its claim, command, machine and date. ``paper.md`` is ``lab/paper.md`` (made by
``python lab/paper.py`` from the run records) with its figures (``lab/paper/``), and ``findings.md`` the lab's
findings it links. The index links files of the
lab tree that are not pages of the site: on the site those links become the paths they name.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

LAB = Path(__file__).resolve().parents[2] / "lab"
#: the site paths of the index page, the paper page and the findings it links; the figures keep paper.md's links
PAGE, PAPER, FINDINGS = "results.md", "paper.md", "findings.md"
#: a Markdown link ``[text](target)`` whose target is not a site page of ours
LINK = re.compile(r"\[([^\]]+)\]\((?!https?://)([^)#]+)\)")


def results_sources() -> dict[str, Path]:
    """Site path -> file in ``lab/``: the index, the paper page and every figure the paper page may link to."""
    figures = sorted((LAB / "paper").glob("*.png"))
    pages = {PAGE: LAB / "README.md", PAPER: LAB / "paper.md", FINDINGS: LAB / "findings.md"}
    return {**pages, **{f"paper/{p.name}": p for p in figures}}


def lab_links_as_paths(markdown: str) -> str:
    """The index with each link into the lab tree shown as its path (``lab/...``), except the paper page."""

    def shown(match: re.Match[str]) -> str:
        text, target = match.groups()
        return f"[{text}]({target})" if target in (PAPER, FINDINGS) else f"{text} (`lab/{target}`)"

    return LINK.sub(shown, markdown)


def on_files(files: Files, config: Any) -> Files:
    for uri, path in results_sources().items():
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    return lab_links_as_paths(markdown) if page.file.src_uri in (PAGE, FINDINGS) else markdown
