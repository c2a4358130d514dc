"""The README's quickstart runs as written."""

from __future__ import annotations

import re
from pathlib import Path


def test_readme_quickstart_runs() -> None:
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "make demo" in "\n".join(text.splitlines()[:5]) and "make test" in "\n".join(text.splitlines()[:5])
    code = re.search(r"```python\n(.*?)```", text, re.S)
    assert code is not None
    namespace: dict = {}
    exec(code.group(1), namespace)
    assert tuple(namespace["latent"].shape) == (8, 16, 36, 36)
