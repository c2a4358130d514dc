"""Fuzzy logic: targets follow the terms, splits are exact and cover every term, errors are clear."""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hyla.tasks import make_task, task_entry
from hyla.tasks.fuzzy_logic import FuzzyLogic, FuzzyLogicOptions


def zadeh(x: list[float], terms: list[list[bool]]) -> float:
    """Independent slow reference: OR (max) over terms of AND (min) over literals x_i or NOT x_i = 1 - x_i."""
    return max(min(xi if pos else 1 - xi for xi, pos in zip(x, term)) for term in terms)


@settings(max_examples=12, deadline=None, derandomize=True)
@given(
    seed=st.integers(0, 2**31 - 1),
    split=st.sampled_from(["train", "test", "ood", "unseen_terms"]),
    variables=st.integers(3, 5),
    terms=st.integers(2, 3),
)
def test_targets_follow_the_zadeh_formula(seed: int, split: str, variables: int, terms: int) -> None:
    task = FuzzyLogic(num_variables=variables, num_terms=terms, num_examples=5, holdout=0.5, num_unseen_terms=1)
    batch = task.sample(6, split, torch.Generator().manual_seed(seed))
    assert batch.inputs.shape == (6, 5, variables + 1) and batch.targets.shape == (6, 5)
    assert batch.info["terms"].shape == (6, terms, variables) and batch.info["terms"].dtype == torch.bool
    x = batch.inputs[..., :variables]
    assert torch.all((x >= 0) & (x < 1))
    for n, t in itertools.product(range(6), range(5)):
        want = zadeh(x[n, t].tolist(), batch.info["terms"][n].tolist())
        assert abs(batch.targets[n, t].item() - want) < 1e-6
    assert torch.equal(batch.inputs[:, :-1, -1], batch.targets[:, :-1]) and torch.all(batch.inputs[:, -1, -1] == 0)
    # terms are the task's combination, term t's bit i set <=> literal x_i; distinct within a task
    for n in range(6):
        combo = task.combinations[batch.info["task_id"][n]].tolist()
        bits = [[bool((t >> i) & 1) for i in range(variables)] for t in combo]
        assert bits == batch.info["terms"][n].tolist() and len(set(combo)) == terms
    assert set(batch.info["task_id"].tolist()) <= set(task.task_ids[split].tolist())


@settings(max_examples=15, deadline=None, derandomize=True)
@given(
    holdout=st.sampled_from([0.3, 0.5, 0.7, 0.9]),
    unseen=st.integers(0, 3),
    split_seed=st.integers(0, 1000),
    shape=st.sampled_from([(4, 2), (3, 2), (4, 3), (5, 2)]),
)
def test_splits_disjoint_cover_space_and_every_seen_term_trains(
    holdout: float, unseen: int, split_seed: int, shape: tuple[int, int]
) -> None:
    variables, terms = shape
    task = FuzzyLogic(
        num_variables=variables, num_terms=terms, holdout=holdout, num_unseen_terms=unseen, split_seed=split_seed
    )
    ids = {k: set(v.tolist()) for k, v in task.task_ids.items()}
    total = 2**variables
    reserved = set(task.unseen_terms.tolist())
    assert len(reserved) == unseen and ids["train"] == ids["test"]
    assert task.splits == (("train", "test", "ood", "unseen_terms") if unseen else ("train", "test", "ood"))
    assert not ids["train"] & ids["ood"]
    assert ids["train"] | ids["ood"] | ids.get("unseen_terms", set()) == set(range(math.comb(total, terms)))
    assert not (ids["train"] | ids["ood"]) & ids.get("unseen_terms", set())
    seen_combos = math.comb(total - unseen, terms)
    assert len(ids["ood"]) == int(holdout * seen_combos) and len(ids["train"]) == seen_combos - len(ids["ood"])
    trained = set(task.combinations[sorted(ids["train"])].flatten().tolist())
    assert trained == set(range(total)) - reserved  # every seen term trains, no reserved one does
    assert not set(task.combinations[sorted(ids["ood"])].flatten().tolist()) & reserved
    assert all(set(task.combinations[i].tolist()) & reserved for i in ids.get("unseen_terms", set()))


def test_defaults_and_training_never_sees_held_out_combinations() -> None:
    task = FuzzyLogic()  # L=4, K=2, N=32, holdout 0.7, no reserved terms
    assert {k: len(v) for k, v in task.task_ids.items()} == {"train": 36, "test": 36, "ood": 84}
    assert task.eval_splits == ("test", "ood") and task.primary_metric == "r2"
    assert task.seq_len == 32 and task.input_dim == 5 and task.output_dim == 1 and task.num_tasks == 120
    with pytest.raises(ValueError, match="split='unseen_terms' is not valid for fuzzy_logic"):
        task.sample(2, "unseen_terms", torch.Generator())
    reserved = FuzzyLogic(num_unseen_terms=2)
    assert {k: len(v) for k, v in reserved.task_ids.items()} == {"train": 28, "test": 28, "ood": 63, "unseen_terms": 29}
    assert reserved.eval_splits == ("test", "ood", "unseen_terms")
    train = set(reserved.task_ids["train"].tolist())
    for seed in range(3):
        batch = reserved.sample(1024, "train", torch.Generator().manual_seed(seed))
        assert set(batch.info["task_id"].tolist()) <= train


def test_the_options_dataclass_is_the_one_place_of_the_defaults() -> None:
    """The constructor, a config naming only the task, and ``hyla data`` all build the same task."""
    from hyla.export import export_flags
    from hyla.train.build import build_task
    from hyla.train.config import config_from_dict

    defaults = dataclasses.asdict(FuzzyLogicOptions())
    assert defaults == {
        "holdout": 0.7,
        "num_variables": 4,
        "num_terms": 2,
        "num_examples": 32,
        "num_unseen_terms": 0,
        "split_style": "cover",
    }
    signature = inspect.signature(FuzzyLogic)
    assert {k: signature.parameters[k].default for k in defaults} == defaults
    assert export_flags(task_entry("fuzzy_logic")) == defaults
    from_config = build_task(config_from_dict({"data": {"task": "fuzzy_logic"}}))
    assert isinstance(from_config, FuzzyLogic)
    assert {k: getattr(from_config, k) for k in defaults} == defaults
    assert torch.equal(from_config.task_ids["ood"], FuzzyLogic().task_ids["ood"])


def test_determinism_and_split_seed() -> None:
    task = FuzzyLogic()
    a = task.sample(8, "ood", torch.Generator().manual_seed(1))
    b = task.sample(8, "ood", torch.Generator().manual_seed(1))
    c = task.sample(8, "ood", torch.Generator().manual_seed(2))
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.info["task_id"], b.info["task_id"])
    assert not torch.equal(a.inputs, c.inputs)
    gen = torch.Generator().manual_seed(5)
    task.sample(4, "train", gen)
    state = gen.get_state()
    nxt = task.sample(4, "train", gen)
    gen.set_state(state)
    assert torch.equal(task.sample(4, "train", gen).inputs, nxt.inputs)
    other = FuzzyLogic(split_seed=1)
    assert not torch.equal(other.task_ids["ood"], task.task_ids["ood"])
    assert torch.equal(FuzzyLogic(split_seed=0).task_ids["ood"], task.task_ids["ood"])


def test_r2_mse_and_loss() -> None:
    task = FuzzyLogic()
    batch = task.sample(16, "test", torch.Generator().manual_seed(0))
    out = torch.zeros(16, 32, 1)
    out[:, -1, 0] = batch.targets[:, -1]
    m = task.metrics(out, batch)
    assert set(m) == {"loss", "mse", "r2"} and all(v.shape == (16,) for v in m.values())
    assert torch.allclose(m["r2"], torch.ones(16)) and torch.all(m["mse"] == 0) and task.loss(out, batch) == 0
    pred = torch.rand(16, generator=torch.Generator().manual_seed(3))
    out[:, -1, 0] = pred
    m = task.metrics(out, batch)
    y = batch.targets
    var = ((y - y.mean(1, keepdim=True)) ** 2).mean(1)  # population variance of the N targets
    assert torch.allclose(m["r2"], 1 - (pred - y[:, -1]) ** 2 / var, atol=1e-5)
    assert torch.allclose(task.loss(out, batch), ((pred - y[:, -1]) ** 2).mean())
    # predicting the sequence mean scores r2 = 1 - (mean - y_last)^2 / var, not 0: r2 is per query
    flat = batch.__class__(batch.inputs, torch.full((16, 32), 0.5), batch.info)  # var = 0: guarded, finite
    assert torch.all(torch.isfinite(task.metrics(out, flat)["r2"]))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_terms": 17}, "num_terms=17 must be in 1..14"),
        ({"num_terms": 14}, "holdout=0.7 leaves 0 held-out and 1 training combinations of 1"),
        ({"holdout": 0.99}, "holdout=0.99 leaves"),
        ({"holdout": 0.0}, "holdout must be in"),
        ({"holdout": 1.0}, "holdout must be in"),
        ({"num_examples": 1}, "num_examples must be >= 2"),
        ({"num_unseen_terms": 16}, "num_unseen_terms must be in 0..15"),
        ({"num_terms": 1}, "holdout=0.7 leaves .* training needs >= 14"),
        ({"num_variables": 0}, "num_variables must be in"),
        ({"num_variables": 6, "num_terms": 5}, "num_variables=6, num_terms=5: .* too many"),
    ],
)
def test_impossible_configurations(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        FuzzyLogic(**{"num_unseen_terms": 2, **kwargs})  # 14 seen terms in the messages


def test_unknown_split_and_factory() -> None:
    with pytest.raises(ValueError, match="split='val' is not valid for fuzzy_logic; allowed values: train, test, ood"):
        FuzzyLogic().sample(2, "val", torch.Generator())
    task = make_task("fuzzy_logic", num_examples=8)
    assert isinstance(task, FuzzyLogic) and task.seq_len == 8
    with pytest.raises(ValueError, match="allowed values: sraven, fuzzy_logic"):
        make_task("logic")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_sampling_on_cuda() -> None:
    task = FuzzyLogic()
    batch = task.sample(64, "ood", torch.Generator("cuda").manual_seed(0))
    assert batch.inputs.device.type == "cuda" and batch.info["terms"].device.type == "cuda"
    lit = torch.where(batch.info["terms"][:, None], batch.inputs[:, :, None, :4], 1 - batch.inputs[:, :, None, :4])
    assert torch.allclose(lit.amin(-1).amax(-1), batch.targets)
