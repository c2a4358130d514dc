"""``hyla --help`` answers without importing torch or matplotlib; each command's own help imports only its module."""

from __future__ import annotations

import subprocess
import sys

from tiny import HANG_GUARD_S

CHECK = """
import sys
from hyla.cli import SUBCOMMANDS, build_parser
text = build_parser().format_help()
assert all(name in text for name in SUBCOMMANDS), text
heavy = sorted(m for m in ("torch", "matplotlib", "sklearn", "tensorboard") if m in sys.modules)
print(",".join(heavy))
"""


def test_the_top_level_help_imports_no_heavy_library() -> None:
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


def test_a_commands_help_registers_that_command_only() -> None:
    from hyla.cli import build_parser

    parser = build_parser(only="data")
    sub = next(a for a in parser._actions if a.dest == "command")
    assert sub.choices["data"].format_usage().startswith("usage: hyla data")
    assert "--out" not in sub.choices["train"].format_help()  # a line of help only, its module not imported


def test_a_task_is_spelled_as_the_configs_spell_it_or_with_hyphens(tmp_path) -> None:
    import numpy as np

    from hyla.cli import main

    written = {}
    for spelling in ("fuzzy_logic", "fuzzy-logic"):
        out = tmp_path / f"{spelling}.npz"
        assert main(["data", spelling, "--split", "train", "--num", "3", "--seed", "2", "--out", str(out)]) == 0
        written[spelling] = dict(np.load(out))
    assert written["fuzzy_logic"].keys() == written["fuzzy-logic"].keys()
    assert all(np.array_equal(written["fuzzy_logic"][k], written["fuzzy-logic"][k]) for k in written["fuzzy_logic"])
