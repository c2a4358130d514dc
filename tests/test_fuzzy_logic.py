"""Fuzzy logic: targets follow the terms, splits are exact and cover every term, errors are clear."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hyla.tasks.fuzzy_logic import FuzzyLogic


@settings(max_examples=10, deadline=None, derandomize=True)
@given(
    seed=st.integers(0, 2**31 - 1),
    split=st.sampled_from(["train", "test", "ood", "unseen_terms"]),
    variables=st.integers(3, 4),
    terms=st.integers(2, 3),
)
def test_targets_follow_the_zadeh_formula(seed: int, split: str, variables: int, terms: int) -> None:
    task = FuzzyLogic(num_variables=variables, num_terms=terms, num_examples=6, holdout=0.5, num_unseen_terms=1)
    batch = task.sample(8, split, torch.Generator().manual_seed(seed))
    x = batch.inputs[..., :variables]
    expected = task.evaluate_terms(x, batch.info["terms"])
    assert torch.allclose(batch.targets, expected, atol=1e-6)
    assert torch.equal(batch.inputs[:, :-1, -1], batch.targets[:, :-1]) and torch.all(batch.inputs[:, -1, -1] == 0)
    combos = task.combinations[batch.info["task_id"]]
    assert torch.equal(task.term_patterns[combos], batch.info["terms"])


def test_splits_disjoint_cover_space_and_every_term_trains() -> None:
    task = FuzzyLogic(holdout=0.7, num_unseen_terms=2)
    ids = {k: set(v.tolist()) for k, v in task.task_ids.items()}
    assert ids["train"] == ids["test"]
    assert not ids["train"] & ids["ood"] and not (ids["train"] | ids["ood"]) & ids["unseen_terms"]
    assert ids["train"] | ids["ood"] | ids["unseen_terms"] == set(range(math.comb(16, 2)))
    trained_terms = set(task.combinations[sorted(ids["train"])].flatten().tolist())
    assert trained_terms == set(range(16)) - set(task.unseen_terms.tolist())
    unseen = set(task.unseen_terms.tolist())
    assert all(set(task.combinations[i].tolist()) & unseen for i in ids["unseen_terms"])
    for seed in range(3):  # training never yields a held-out combination
        batch = task.sample(512, "train", torch.Generator().manual_seed(seed))
        assert set(batch.info["task_id"].tolist()) <= ids["train"]


def test_table_a1_split_uses_every_term() -> None:
    task = FuzzyLogic()  # defaults: L=4, K=2, N=32, holdout 0.7, no unseen terms
    assert {k: len(v) for k, v in task.task_ids.items()} == {"train": 36, "test": 36, "ood": 84}
    assert task.eval_splits == ("test", "ood") and task.seq_len == 32 and task.input_dim == 5


def test_determinism_and_split_seed() -> None:
    task = FuzzyLogic()
    a = task.sample(4, "ood", torch.Generator().manual_seed(1))
    b = task.sample(4, "ood", torch.Generator().manual_seed(1))
    assert torch.equal(a.inputs, b.inputs)
    assert not torch.equal(FuzzyLogic(split_seed=1).task_ids["ood"], task.task_ids["ood"])


def test_r2_metric() -> None:
    task = FuzzyLogic()
    batch = task.sample(16, "test", torch.Generator().manual_seed(0))
    out = torch.zeros(16, 1, 1)
    out[:, -1, 0] = batch.targets[:, -1]
    assert torch.allclose(task.metrics(out, batch)["r2"], torch.ones(16))
    mean_pred = torch.zeros(16, 1, 1)
    mean_pred[:, -1, 0] = batch.targets.mean(1) + batch.targets.std(1, unbiased=False)
    r2 = task.metrics(mean_pred, batch)["r2"]
    want = 1 - (batch.targets.mean(1) + batch.targets.std(1, unbiased=False) - batch.targets[:, -1]) ** 2 / (
        batch.targets.var(1, unbiased=False)
    )
    assert torch.allclose(r2, want, atol=1e-5)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_terms": 17}, "num_terms=17 must be in 1..16"),
        ({"holdout": 0.99}, "holdout=0.99"),
        ({"holdout": 0.0}, "holdout must be in"),
        ({"num_examples": 1}, "num_examples must be >= 2"),
        ({"num_unseen_terms": 16}, "num_unseen_terms must be in"),
        ({"num_terms": 1}, "needs num_terms >= 2"),
    ],
)
def test_impossible_configurations(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        FuzzyLogic(**kwargs)


def test_unknown_split() -> None:
    with pytest.raises(ValueError, match="split='unseen_terms' is not valid for fuzzy_logic"):
        FuzzyLogic().sample(2, "unseen_terms", torch.Generator())
