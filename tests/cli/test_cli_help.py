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


def test_a_command_that_needs_a_missing_extra_names_it(monkeypatch, capsys) -> None:
    """The wheel requires torch, numpy, safetensors, PyYAML and tqdm only; the plots and probes of `hyla report`
    come with the `analysis` extra, and their absence is one line naming it."""
    import builtins

    from hyla.cli import main

    real_import = builtins.__import__

    def without_matplotlib(name: str, *args, **kwargs):
        if name.split(".")[0] == "matplotlib":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_import(name, *args, **kwargs)

    for module in [m for m in sys.modules if m.split(".")[0] in ("matplotlib", "hyla") and "analysis" in m]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.delitem(sys.modules, "matplotlib", raising=False)
    monkeypatch.setattr(builtins, "__import__", without_matplotlib)
    assert main(["report", "some/run", "--out", "x"]) == 2
    assert capsys.readouterr().err.strip() == (
        "hyla report: error: this command needs matplotlib, which this install lacks: pip install 'hyla[analysis]'"
    )


def test_the_wheel_requires_the_lean_set_only() -> None:
    from pathlib import Path

    import tomllib

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    required = {d.split(">")[0].split("=")[0].strip() for d in project["dependencies"]}
    assert required == {"torch", "numpy", "pyyaml", "safetensors", "tqdm"}
    assert {"analysis", "tensorboard", "kernels", "text", "docs"} <= set(project["optional-dependencies"])


def test_hyla_data_writes_with_the_process_umask(tmp_path) -> None:
    import os

    from hyla.cli import main

    old = os.umask(0o022)
    try:
        out = tmp_path / "p.npz"
        assert main(["data", "fuzzy_logic", "--split", "train", "--num", "2", "--out", str(out)]) == 0
    finally:
        os.umask(old)
    assert out.stat().st_mode & 0o777 == 0o644


def test_a_config_is_found_by_either_spelling() -> None:
    from hyla.train.config import load_config

    assert load_config("fuzzy-logic", []).to_dict() == load_config("fuzzy_logic", []).to_dict()


def test_an_evaluation_is_announced_before_it_runs(tmp_path, capsys) -> None:
    """A paper config's final evaluation takes minutes on a CPU: a line says so before it starts."""
    from hyla.cli import main
    from tiny import tiny_overrides

    args = [*tiny_overrides(steps=2, every=2), "train.eval_size=48"]
    assert main(["train", "fuzzy_logic", *args, "--out", str(tmp_path / "run")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("step 2:") and "48" in line for line in lines)  # eval_size, before the results
    assert '"split": "ood"' in (tmp_path / "run" / "metrics.jsonl").read_text()
