"""The run folder's modules moved into ``hyla.train.run``; their former paths still import, with a warning."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    ("old", "new", "name"), [("rundir", "folder", "load_trained"), ("checkpoint", "checkpoint", "load_checkpoint")]
)
def test_a_former_path_gives_the_same_objects_with_a_deprecation_warning(old: str, new: str, name: str) -> None:
    probe = (
        "import warnings, importlib\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        f"    former = importlib.import_module('hyla.train.{old}')\n"
        f"current = importlib.import_module('hyla.train.run.{new}')\n"
        "deprecations = [str(w.message) for w in caught if w.category is DeprecationWarning]\n"
        f"print(former.{name} is current.{name}, deprecations)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    same, _, messages = done.stdout.partition(" ")
    assert same == "True"
    assert f"hyla.train.{old} is deprecated; import hyla.train.run.{new} instead" in messages
