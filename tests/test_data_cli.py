"""`hyla data` exports and the SRAVEN ambiguity checker."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hyla.cli import main
from hyla.tasks.sraven import RULE_NAMES, SRaven
from hyla.tasks.sraven_ambiguity import is_ambiguous


def test_sraven_export_follows_the_documented_format(tmp_path: Path) -> None:
    out = tmp_path / "ood.npz"
    assert main(["data", "sraven", "--split", "ood", "--num", "300", "--seed", "3", "--out", str(out)]) == 0
    d = np.load(out)
    assert d["grid"].shape == (300, 3, 3, 4) and d["rules"].shape == (300, 4) and d["perm"].shape == (300, 3, 4)
    assert list(d["rule_names"]) == list(RULE_NAMES)
    task = SRaven()
    ood = {tuple(t) for t in task.tasks[task.task_ids["ood"]].tolist()}
    assert {tuple(r) for r in d["rules"].tolist()} <= ood
    # grid[n, r, c, i] == canonical[n, r, c, perm[n, c, i]]: rebuild canonical, check rule 'constant' rows
    canonical = np.zeros_like(d["grid"])
    for c in range(3):
        np.put_along_axis(
            canonical[:, :, c],
            np.broadcast_to(d["perm"][:, None, c], (300, 3, 4)),
            d["grid"][:, :, c],
            axis=2,
        )
    const = d["rules"] == 0
    rows = canonical.transpose(0, 3, 1, 2)[const]  # (num constant features, 3 rows, 3 cols)
    assert len(rows) and np.all(rows == rows[:, :, :1])
    again = tmp_path / "again.npz"
    assert main(["data", "sraven", "--split", "ood", "--num", "300", "--seed", "3", "--out", str(again)]) == 0
    assert np.array_equal(np.load(again)["grid"], d["grid"])


def test_fuzzy_export(tmp_path: Path) -> None:
    out = tmp_path / "f.npz"
    assert main(["data", "fuzzy-logic", "--split", "test", "--num", "50", "--seed", "1", "--out", str(out)]) == 0
    d = np.load(out)
    assert d["x"].shape == (50, 32, 4) and d["y"].shape == (50, 32) and d["terms"].shape == (50, 2, 4)
    assert d["terms"].dtype == bool
    lit = np.where(d["terms"][:, None], d["x"][:, :, None], 1 - d["x"][:, :, None])  # (N, T, K, L)
    assert np.allclose(d["y"], lit.min(-1).max(-1))


def test_export_errors(tmp_path: Path, capsys) -> None:
    assert main(["data", "sraven", "--split", "unseen_terms", "--num", "5", "--out", str(tmp_path / "x.npz")]) == 2
    assert "--split 'unseen_terms' is not valid; allowed values: train, test, ood" in capsys.readouterr().err
    assert (
        main(
            [
                "data",
                "fuzzy-logic",
                "--split",
                "ood",
                "--num",
                "5",
                "--holdout",
                "0.999",
                "--out",
                str(tmp_path / "y.npz"),
            ]
        )
        == 2
    )
    assert "holdout=0.999" in capsys.readouterr().err
    assert not (tmp_path / "x.npz").exists() and not (tmp_path / "y.npz").exists()


def _grid(rows_by_slot: list[list[list[int]]]) -> torch.Tensor:
    """Build a (1, 3, 3, F) grid from per-slot 3x3 rows."""
    return torch.tensor(rows_by_slot).permute(1, 2, 0)[None]


def test_ambiguity_checker_on_hand_built_problems() -> None:
    task = SRaven(num_features=2)
    # slot 0 progression +1, slot 1 constant, with no coincidences: a single consistent answer
    clear = _grid([[[0, 1, 2], [3, 4, 5], [5, 6, 7]], [[2, 2, 2], [6, 6, 6], [1, 1, 1]]])
    # a feature whose visible rows are all zeros fits constant, addition and subtraction alike, and its
    # last row (3, 3, ?) then admits 3 (constant), 6 (addition) or 0 (subtraction)
    vague = _grid([[[0, 0, 0], [0, 0, 0], [3, 3, 3]], [[1, 2, 3], [4, 5, 6], [2, 3, 4]]])
    flags = is_ambiguous(task, torch.cat([clear, vague]))
    assert flags.tolist() == [False, True]
    assert is_ambiguous(task, vague, criterion="paper").tolist() == [False]  # the other feature is unambiguous
    with pytest.raises(ValueError, match="criterion='strict' is not valid"):
        is_ambiguous(task, clear, criterion="strict")


def test_true_reading_never_flags_itself_and_unambiguous_only_resamples() -> None:
    task = SRaven()
    p = task.sample_problems(2000, "train", torch.Generator().manual_seed(0))
    flags = is_ambiguous(task, p["grid"])
    assert 0.05 < flags.float().mean() < 0.6  # strict ambiguity is common: see results/data_generation.md
    paper = is_ambiguous(task, p["grid"], criterion="paper")
    assert paper.float().mean() < 0.02 and not (paper & ~flags).any()
    clean = SRaven(unambiguous_only=True).sample(300, "train", torch.Generator().manual_seed(1))
    assert not is_ambiguous(task, clean.info["grid"]).any()
