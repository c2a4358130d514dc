"""SRAVEN: every problem obeys its rules, splits are exact, encoding is invertible, errors are clear."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hyla.tasks.sraven import RULE_NAMES, SRaven


def row_follows(rule: str, row: list[int], v: int) -> bool:
    """Independent slow checker of one row of one canonical feature."""
    g = len(row)
    if rule == "constant":
        return len(set(row)) == 1
    if rule.startswith("progression"):
        d = int(rule[len("progression") :])
        return all((row[c] - row[0]) % v == (d * c) % v for c in range(g))
    if rule == "addition":
        return row[-1] == sum(row[:-1]) % v
    if rule == "subtraction":
        return row[-1] == (row[0] - sum(row[1:-1])) % v
    if rule == "distribute_three":
        return len(set(row)) == g
    raise AssertionError(rule)


def check_problem(task: SRaven, grid, rules, perm) -> None:
    g, f, v = task.grid_size, task.num_features, task.num_values
    canonical = [[[None] * f for _ in range(g)] for _ in range(g)]
    for r in range(g):
        for c in range(g):
            for i in range(f):
                canonical[r][c][int(perm[c, i])] = int(grid[r, c, i])
    for feat in range(f):
        rule = RULE_NAMES[int(rules[feat])]
        rows = [[canonical[r][c][feat] for c in range(g)] for r in range(g)]
        assert all(row_follows(rule, row, v) for row in rows), (rule, rows)
        if rule == "distribute_three":
            assert len({tuple(sorted(row)) for row in rows}) == 1  # the same symbols in every row
    assert sorted(perm[0].tolist()) == list(range(f))


@settings(max_examples=12, deadline=None, derandomize=True)
@given(
    seed=st.integers(0, 2**31 - 1),
    split=st.sampled_from(["train", "test", "ood"]),
    features=st.integers(1, 5),
    values=st.integers(3, 9),
)
def test_every_problem_satisfies_its_rules(seed: int, split: str, features: int, values: int) -> None:
    task = SRaven(num_features=features, num_values=values, holdout=0.25 if features > 1 else 0.2)
    p = task.sample_problems(64, split, torch.Generator().manual_seed(seed))
    for n in range(64):
        check_problem(task, p["grid"][n], p["rules"][n], p["perm"][n])
        assert torch.equal(p["rules"][n], task.tasks[p["task_id"][n]])


def test_rules_are_all_exercised_and_permutations_vary_by_column() -> None:
    task = SRaven()
    p = task.sample_problems(4096, "train", torch.Generator().manual_seed(1))
    assert set(p["rules"].unique().tolist()) == set(range(8))
    assert (p["perm"][:, 0] != p["perm"][:, 1]).any(dim=1).float().mean() > 0.5
    # grid[n, r, c, i] == canonical[n, r, c, perm[n, c, i]] (the export convention)
    n, r, c, i = 7, 2, 1, 3
    assert p["grid"][n, r, c, i] == p["canonical"][n, r, c, p["perm"][n, c, i]]


def test_split_is_exact_disjoint_and_independent_of_training_seed() -> None:
    task = SRaven()
    assert len(task.tasks) == 330 and len(task.task_ids["ood"]) == 82 and len(task.task_ids["train"]) == 248
    train, ood = set(task.task_ids["train"].tolist()), set(task.task_ids["ood"].tolist())
    assert not train & ood and train | ood == set(range(330))
    assert {tuple(t) for t in task.tasks.tolist()} == {tuple(sorted(t)) for t in task.tasks.tolist()}
    assert len({tuple(t) for t in task.tasks.tolist()}) == 330
    for seed in (0, 5):  # training never yields a held-out combination, whatever the data seed
        p = task.sample_problems(2048, "train", torch.Generator().manual_seed(seed))
        assert set(p["task_id"].tolist()) <= train
        assert set(task.sample_problems(512, "ood", torch.Generator().manual_seed(seed))["task_id"].tolist()) <= ood
    assert torch.equal(SRaven(split_seed=0).task_ids["ood"], task.task_ids["ood"])
    assert not torch.equal(SRaven(split_seed=1).task_ids["ood"], task.task_ids["ood"])


def test_determinism_per_seed() -> None:
    task = SRaven()
    a = task.sample(32, "train", torch.Generator().manual_seed(3))
    b = task.sample(32, "train", torch.Generator().manual_seed(3))
    c = task.sample(32, "train", torch.Generator().manual_seed(4))
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    assert not torch.equal(a.inputs, c.inputs)


def test_encoding_shapes_and_answer_recoverable() -> None:
    task = SRaven()
    batch = task.sample(16, "ood", torch.Generator().manual_seed(0))
    assert batch.inputs.shape == (16, 36, 8) and task.seq_len == 36 and task.input_dim == 8
    assert batch.targets.shape == (16, 4) and task.num_output_positions == 4
    assert torch.all(batch.inputs[:, :32].sum(-1) == 1) and torch.all(batch.inputs[:, 32:] == 0)
    decoded = batch.inputs[:, :32].argmax(-1).reshape(16, 8, 4)  # panels row-major, slots in order
    grid = batch.info["grid"].reshape(16, 9, 4)
    assert torch.equal(decoded, grid[:, :8]) and torch.equal(batch.targets, grid[:, 8])
    for n in range(16):  # the answer follows from the context panels and the rules
        check_problem(task, batch.info["grid"][n], batch.info["rules"][n], batch.info["perm"][n])


def test_loss_and_metrics() -> None:
    task = SRaven()
    batch = task.sample(8, "test", torch.Generator().manual_seed(0))
    perfect = torch.full((8, 4, 8), -10.0).scatter(2, batch.targets[..., None], 10.0)
    m = task.metrics(perfect, batch)
    assert torch.all(m["acc"] == 1) and torch.all(m["feature_acc"] == 1) and task.loss(perfect, batch) < 1e-6
    one_wrong = perfect.clone()
    one_wrong[0, 2] = perfect[0, 2].roll(1)
    m = task.metrics(one_wrong, batch)
    assert m["acc"][0] == 0 and m["feature_acc"][0] == 0.75 and torch.all(m["acc"][1:] == 1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_values": 2}, "num_values=2 is too small for distribute_three"),
        ({"holdout": 1.0}, "holdout must be in"),
        ({"holdout": 0.001}, "holdout=0.001 holds out no task"),
        ({"rules": ["constant", "fibonacci"]}, "rules=.* must be distinct names from"),
        ({"num_features": 0}, "num_features must be >= 1"),
    ],
)
def test_impossible_configurations(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SRaven(**kwargs)


def test_unknown_split() -> None:
    with pytest.raises(ValueError, match="split='val' is not valid for sraven; allowed values: train, test, ood"):
        SRaven().sample(2, "val", torch.Generator())


def test_rule_subset() -> None:
    task = SRaven(rules=["constant", "addition"], num_features=2, holdout=0.34)
    assert len(task.tasks) == 3 and len(task.task_ids["ood"]) == 1
    p = task.sample_problems(64, "train", torch.Generator().manual_seed(0))
    assert set(p["rules"].unique().tolist()) <= {0, 5}
    for n in range(64):
        check_problem(task, p["grid"][n], p["rules"][n], p["perm"][n])
