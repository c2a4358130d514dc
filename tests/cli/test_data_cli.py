"""`hyla data` exports, `hyla bench data`, and the SRAVEN ambiguity checker against a brute-force one."""

from __future__ import annotations

import functools
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from hyla.cli import main
from hyla.tasks.fuzzy_logic import FuzzyLogic
from hyla.tasks.sraven import RULE_NAMES, SRaven
from hyla.tasks.sraven_ambiguity import is_ambiguous


def follows(rule: str, rows: list[list[int]], v: int) -> bool:
    """Whether complete rows (one feature, all G rows) are in the support of ``rule``."""
    g = len(rows[0])
    if rule == "distribute_three":
        return all(len(set(r)) == g for r in rows) and len({tuple(sorted(r)) for r in rows}) == 1
    for row in rows:
        if rule == "constant":
            ok = len(set(row)) == 1
        elif rule.startswith("progression"):
            ok = all((row[c] - row[0] - int(rule[11:]) * c) % v == 0 for c in range(g))
        elif rule == "addition":
            ok = row[-1] == sum(row[:-1]) % v
        else:  # subtraction
            ok = row[-1] == (row[0] - sum(row[1:-1])) % v
        if not ok:
            return False
    return True


def canonical_np(grid: np.ndarray, perm: np.ndarray) -> np.ndarray:
    """Undo the export's feature permutation: canonical[n, r, c, perm[n, c, i]] = grid[n, r, c, i]."""
    canonical = np.zeros_like(grid)
    n, g = grid.shape[:2]
    for c in range(g):
        idx = np.broadcast_to(perm[:, None, c], (n, g, grid.shape[-1]))
        np.put_along_axis(canonical[:, :, c], idx, grid[:, :, c], axis=2)
    return canonical


# ---------------------------------------------------------------------------------------- exports
def test_sraven_export_follows_the_documented_format(tmp_path: Path) -> None:
    out = tmp_path / "ood.npz"
    assert main(["data", "sraven", "--split", "ood", "--num", "300", "--seed", "3", "--out", str(out)]) == 0
    d = np.load(out)
    assert set(d.files) == {"grid", "rules", "perm", "task_id", "rule_names"}
    assert d["grid"].shape == (300, 3, 3, 4) and d["rules"].shape == (300, 4) and d["perm"].shape == (300, 3, 4)
    assert d["grid"].dtype == np.int64 and list(d["rule_names"]) == list(RULE_NAMES)
    task = SRaven()
    ood = {tuple(t) for t in task.tasks[task.task_ids["ood"]].tolist()}
    assert {tuple(r) for r in d["rules"].tolist()} <= ood
    assert np.array_equal(task.tasks[d["task_id"]].numpy(), d["rules"])
    # grid[n, r, c, i] == canonical[n, r, c, perm[n, c, i]]: undo it, then every feature follows its rule
    canonical = canonical_np(d["grid"], d["perm"])
    for n, f in itertools.product(range(300), range(4)):
        rule = str(d["rule_names"][d["rules"][n, f]])
        assert follows(rule, canonical[n, :, :, f].tolist(), 8), (n, f, rule)
    # ... and the same as the task's own sample with that seed
    p = task.sample_problems(300, "ood", torch.Generator().manual_seed(3))
    assert np.array_equal(p["grid"].numpy(), d["grid"]) and np.array_equal(p["canonical"].numpy(), canonical)
    again = tmp_path / "again.npz"
    assert main(["data", "sraven", "--split", "ood", "--num", "300", "--seed", "3", "--out", str(again)]) == 0
    assert np.array_equal(np.load(again)["grid"], d["grid"])
    other = tmp_path / "other.npz"
    assert main(["data", "sraven", "--split", "ood", "--num", "300", "--seed", "4", "--out", str(other)]) == 0
    assert not np.array_equal(np.load(other)["grid"], d["grid"])


def test_sraven_export_options(tmp_path: Path) -> None:
    out = tmp_path / "sub.npz"
    args = ["--split", "train", "--num", "200", "--rules", "constant,addition", "--num-features", "3"]
    assert main(["data", "sraven", *args, "--holdout", "0.3", "--split-seed", "2", "--out", str(out)]) == 0
    d = np.load(out)
    assert d["grid"].shape == (200, 3, 3, 3) and set(np.unique(d["rules"]).tolist()) <= {0, 5}
    train = SRaven(rules=["constant", "addition"], num_features=3, holdout=0.3, split_seed=2).task_ids["train"]
    assert set(d["task_id"].tolist()) <= set(train.tolist())
    clean = tmp_path / "clean.npz"
    assert main(["data", "sraven", "--split", "test", "--num", "150", "--unambiguous-only", "--out", str(clean)]) == 0
    grid = torch.from_numpy(np.load(clean)["grid"])
    assert not is_ambiguous(SRaven(), grid).any()


def test_fuzzy_export(tmp_path: Path) -> None:
    out = tmp_path / "f.npz"
    assert main(["data", "fuzzy-logic", "--split", "test", "--num", "50", "--seed", "1", "--out", str(out)]) == 0
    d = np.load(out)
    assert set(d.files) == {"x", "y", "terms", "task_id"}
    assert d["x"].shape == (50, 32, 4) and d["y"].shape == (50, 32) and d["terms"].shape == (50, 2, 4)
    assert d["terms"].dtype == bool and d["x"].dtype == np.float32
    lit = np.where(d["terms"][:, None], d["x"][:, :, None], 1 - d["x"][:, :, None])  # (N, T, K, L)
    assert np.allclose(d["y"], lit.min(-1).max(-1)) and d["y"][:, -1].std() > 0  # the last y is the true one
    task = FuzzyLogic()
    assert np.array_equal(task.term_patterns[task.combinations[d["task_id"]]].numpy(), d["terms"])
    assert set(d["task_id"].tolist()) <= set(task.task_ids["train"].tolist())
    unseen = tmp_path / "u.npz"
    args = ["--split", "unseen_terms", "--num", "40", "--num-examples", "8", "--holdout", "0.5"]
    assert main(["data", "fuzzy-logic", *args, "--num-unseen-terms", "2", "--out", str(unseen)]) == 0
    u = np.load(unseen)
    reserved = FuzzyLogic(holdout=0.5, num_unseen_terms=2).unseen_terms.numpy()
    assert u["x"].shape == (40, 8, 4)
    assert all(np.isin(FuzzyLogic().combinations[t].numpy(), reserved).any() for t in u["task_id"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["sraven", "--split", "unseen_terms"],
            "--split 'unseen_terms' is not valid; allowed values: train, test, ood",
        ),
        (["sraven", "--split", "train", "--rules", "constant,zigzag"], "rules=['constant', 'zigzag'] must be"),
        (["sraven", "--split", "train", "--num-values", "2"], "num_values=2 is too small"),
        (["fuzzy-logic", "--split", "ood", "--holdout", "0.999"], "holdout=0.999"),
        (["fuzzy-logic", "--split", "unseen_terms"], "--split 'unseen_terms' is not"),
        (["fuzzy-logic", "--split", "train", "--num-terms", "17"], "num_terms=17 must be in"),
    ],
)
def test_export_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    out = tmp_path / "x.npz"
    assert main(["data", *argv, "--num", "5", "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists() and not list(tmp_path.iterdir())  # nothing written, no temporary left


def test_bench_data_writes_its_json(tmp_path: Path) -> None:
    out = tmp_path / "b.json"
    argv = ["bench", "data", "--task", "fuzzy-logic", "--num", "256", "--batch-sizes", "64,128", "--repeats", "1"]
    assert main([*argv, "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["task"] == "fuzzy_logic" and set(d["problems_per_s"]) == {"64", "128"} and d["num"] == 256
    assert all(v > 0 for v in d["problems_per_s"].values())


# ---------------------------------------------------------------------------------------- ambiguity
def _grid(rows_by_slot: list[list[list[int]]]) -> torch.Tensor:
    """A (1, 3, 3, F) grid from per-slot 3x3 blocks (rows x columns)."""
    return torch.tensor(rows_by_slot).permute(1, 2, 0)[None]


def test_ambiguity_checker_on_hand_built_problems() -> None:
    task = SRaven(num_features=2)
    # slot 0 progression +1, slot 1 constant, no coincidences: one consistent answer, (5, 1)
    clear = _grid([[[0, 1, 2], [3, 4, 5], [3, 4, 5]], [[2, 2, 2], [6, 6, 6], [1, 1, 1]]])
    # slot 0's visible rows are all zeros: constant, addition and subtraction fit, and its last row
    # (3, 3, ?) then admits 3 (constant), 6 (addition) or 0 (subtraction)
    vague = _grid([[[0, 0, 0], [0, 0, 0], [3, 3, 3]], [[1, 2, 3], [4, 5, 6], [2, 3, 4]]])
    # each slot alone has one answer (progression +1 -> 2, progression -1 -> 3), but column 2 holds the
    # same visible values (4, 2) in both slots, so reading slot 0 of column 2 as the second feature's
    # (and vice versa) fits as well: answer panel (3, 2) as good as (2, 3)
    swapped = _grid([[[2, 3, 4], [0, 1, 2], [0, 1, 2]], [[6, 5, 4], [4, 3, 2], [5, 4, 3]]])
    assert is_ambiguous(task, torch.cat([clear, vague, swapped])).tolist() == [False, True, True]
    assert brute_force(clear[0].tolist(), RULE_NAMES, 8) == (False, False)
    assert brute_force(vague[0].tolist(), RULE_NAMES, 8) == (True, False)
    assert brute_force(swapped[0].tolist(), RULE_NAMES, 8) == (True, True)
    assert is_ambiguous(task, vague, criterion="paper").tolist() == [False]  # the other feature is unambiguous
    assert is_ambiguous(task, swapped, criterion="paper").tolist() == [True]  # both answers differ
    with pytest.raises(ValueError, match="criterion='strict' is not valid"):
        is_ambiguous(task, clear, criterion="strict")


def brute_force(grid: list, rules: tuple[str, ...] | list[str], v: int) -> tuple[bool, bool]:
    """(any_panel, paper) by enumeration: every binding of features to slots (one permutation per
    column, column 0 included), every rule, every candidate answer value checked against the rule's
    support with the completed last row."""
    g, f = len(grid), len(grid[0][0])
    truth = grid[g - 1][g - 1]

    @functools.cache
    def answers(slots: tuple[int, ...]) -> frozenset[int]:  # slots[c]: the slot read in column c
        rows = [[grid[r][c][slots[c]] for c in range(g)] for r in range(g)]
        fits = set()
        for rule, a in itertools.product(rules, range(v)):
            if follows(rule, [*rows[:-1], [*rows[-1][:-1], a]], v):
                fits.add(a)
        return frozenset(fits)

    panels, paper = set(), False
    for sigma in itertools.product(itertools.permutations(range(f)), repeat=g):  # sigma[c][j]: slot of feature j
        per_feature = [answers(tuple(sigma[c][j] for c in range(g))) for j in range(f)]
        if all(per_feature):
            for values in itertools.product(*per_feature):
                panel = [0] * f
                for j, a in enumerate(values):
                    panel[sigma[g - 1][j]] = a
                panels.add(tuple(panel))
        paper |= all(any(a != truth[sigma[g - 1][j]] for a in per_feature[j]) for j in range(f))
    assert tuple(truth) in panels  # the true reading is always one
    return len(panels) > 1, paper


@pytest.mark.parametrize(
    ("features", "values", "grid_size", "rules", "num"),
    [
        (2, 5, 3, None, 300),
        (3, 8, 3, None, 150),
        (4, 8, 3, None, 16),
        (3, 4, 3, None, 100),
        (2, 6, 4, None, 100),
        (3, 8, 3, ("constant", "addition", "subtraction"), 100),
    ],
)
def test_ambiguity_checker_matches_brute_force(
    features: int, values: int, grid_size: int, rules: tuple[str, ...] | None, num: int
) -> None:
    task = SRaven(num_features=features, num_values=values, grid_size=grid_size, rules=rules, holdout=0.2)
    grid = task.sample_problems(num, "train", torch.Generator().manual_seed(values))["grid"]
    want = [brute_force(grid[n].tolist(), task.rule_names, values) for n in range(num)]
    assert is_ambiguous(task, grid).tolist() == [w[0] for w in want]
    assert is_ambiguous(task, grid, criterion="paper").tolist() == [w[1] for w in want]
    assert any(w[0] for w in want) and not all(w[0] for w in want)  # both kinds occur


def test_ambiguous_fraction_and_unambiguous_only_resamples() -> None:
    task = SRaven()
    p = task.sample_problems(2000, "train", torch.Generator().manual_seed(0))
    flags = is_ambiguous(task, p["grid"])
    assert 0.15 < flags.float().mean() < 0.35  # strict ambiguity is common: see lab/tables/data_generation.md
    paper = is_ambiguous(task, p["grid"], criterion="paper")
    assert paper.float().mean() < 0.01 and not (paper & ~flags).any()
    clean_task = SRaven(unambiguous_only=True)
    clean = clean_task.sample(300, "train", torch.Generator().manual_seed(1))
    assert not is_ambiguous(task, clean.info["grid"]).any()
    again = clean_task.sample(300, "train", torch.Generator().manual_seed(1))
    assert torch.equal(clean.inputs, again.inputs)
    for n in range(0, 300, 7):  # resampled problems still follow their rules
        canonical = canonical_np(clean.info["grid"][n : n + 1].numpy(), clean.info["perm"][n : n + 1].numpy())[0]
        for f in range(4):
            assert follows(RULE_NAMES[clean.info["rules"][n, f]], canonical[:, :, f].tolist(), 8)
