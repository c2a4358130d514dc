"""SRAVEN: every problem obeys its rules, splits are exact, encoding is invertible, errors are clear."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from hyla.tasks import make_task
from hyla.tasks.sraven import RULE_NAMES, SRaven, decode_inputs


def row_follows(rule: str, row: list[int], v: int) -> bool:
    """Independent slow checker of one row of one canonical feature (mod-v arithmetic)."""
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


def canonical_from_view(grid, perm) -> list:
    """Undo the feature permutation with plain loops: canonical[r][c][perm[c, i]] = grid[r, c, i]."""
    g, f = grid.shape[0], grid.shape[-1]
    canonical = [[[None] * f for _ in range(g)] for _ in range(g)]
    for r, c, i in itertools.product(range(g), range(g), range(f)):
        canonical[r][c][int(perm[c, i])] = int(grid[r, c, i])
    return canonical


def check_problem(task: SRaven, grid, rules, perm) -> None:
    g, f, v = task.grid_size, task.num_features, task.num_values
    for c in range(g):
        assert sorted(perm[c].tolist()) == list(range(f))
    assert all(0 <= x < v for x in grid.flatten().tolist())
    canonical = canonical_from_view(grid, perm)
    for feat in range(f):
        rule = RULE_NAMES[int(rules[feat])]
        rows = [[canonical[r][c][feat] for c in range(g)] for r in range(g)]
        assert all(row_follows(rule, row, v) for row in rows), (rule, rows)
        if rule == "distribute_three":
            assert len({tuple(sorted(row)) for row in rows}) == 1  # the same symbols in every row


@settings(max_examples=14, deadline=None, derandomize=True)
@given(
    seed=st.integers(0, 2**31 - 1),
    split=st.sampled_from(["train", "test", "ood"]),
    features=st.integers(1, 5),
    values=st.integers(4, 9),
    grid_size=st.sampled_from([3, 3, 4]),
    permute=st.sampled_from([True, True, False]),
)
def test_every_problem_satisfies_its_rules(
    seed: int, split: str, features: int, values: int, grid_size: int, permute: bool
) -> None:
    task = SRaven(
        num_features=features,
        num_values=values,
        grid_size=grid_size,
        holdout=0.25 if features > 1 else 0.2,
        permute_features=permute,
    )
    p = task.sample_problems(48, split, torch.Generator().manual_seed(seed))
    assert p["grid"].shape == (48, grid_size, grid_size, features) and p["perm"].shape == (48, grid_size, features)
    for n in range(48):
        check_problem(task, p["grid"][n], p["rules"][n], p["perm"][n])
        assert torch.equal(p["rules"][n], task.tasks[p["task_id"][n]])
        assert torch.equal(torch.tensor(canonical_from_view(p["grid"][n], p["perm"][n])), p["canonical"][n])
    assert set(p["task_id"].tolist()) <= set(task.task_ids[split].tolist())
    if not permute:
        assert torch.equal(p["grid"], p["canonical"])


def test_every_row_of_every_rule_is_drawn_and_permutations_are_uniform() -> None:
    """The index arithmetic reaches the whole support: all 8 constants, 64 addition rows, 56 value
    sets x 6 orders of distribute_three, 24 slot permutations, each near its expected frequency."""
    task = SRaven()
    p = task.sample_problems(20_000, "train", torch.Generator().manual_seed(1))
    rules, can = p["rules"], p["canonical"].permute(0, 3, 1, 2)  # (N, F, rows, cols)
    assert set(rules.unique().tolist()) == set(range(8))
    rows_of = {r: can[rules == r].reshape(-1, 3) for r in range(8)}
    assert len(rows_of[5].unique(dim=0)) == 64 and len(rows_of[6].unique(dim=0)) == 64
    assert len(rows_of[0].unique(dim=0)) == 8
    first_dist_rows = can[rules == 7][:, 0]  # row 0: its value set and its order are independent draws
    assert len(first_dist_rows.unique(dim=0)) == math.perm(8, 3)  # 336 ordered triples of distinct values
    values = p["grid"].flatten().bincount(minlength=8).double() / p["grid"].numel()
    assert torch.all((values - 1 / 8).abs() < 0.01), values
    perm_ids = torch.tensor([list(itertools.permutations(range(4))).index(tuple(x)) for x in p["perm"][:, 2].tolist()])
    counts = perm_ids.bincount(minlength=24).double()
    assert counts.min() > 0.8 * 20_000 / 24 and counts.max() < 1.2 * 20_000 / 24
    # columns get independent permutations; grid[n, r, c, i] == canonical[n, r, c, perm[n, c, i]]
    assert (p["perm"][:, 0] != p["perm"][:, 1]).any(dim=1).float().mean() > 0.9
    idx = p["perm"][:, None].expand(-1, 3, -1, -1)
    assert torch.equal(p["grid"], torch.gather(p["canonical"], 3, idx))


def test_split_is_exact_disjoint_and_independent_of_training_seed() -> None:
    task = SRaven()
    assert task.num_tasks == 330 and len(task.task_ids["ood"]) == 82 and len(task.task_ids["train"]) == 248
    train, ood = set(task.task_ids["train"].tolist()), set(task.task_ids["ood"].tolist())
    assert not train & ood and train | ood == set(range(330))
    assert torch.equal(task.task_ids["test"], task.task_ids["train"])
    assert {tuple(t) for t in task.tasks.tolist()} == set(itertools.combinations_with_replacement(range(8), 4))
    for seed in (0, 5):  # training never yields a held-out combination, whatever the data seed
        p = task.sample_problems(4096, "train", torch.Generator().manual_seed(seed))
        assert set(p["task_id"].tolist()) <= train
        assert {tuple(r) for r in p["rules"].tolist()}.isdisjoint({tuple(task.tasks[i].tolist()) for i in ood})
        got = set(task.sample_problems(2048, "ood", torch.Generator().manual_seed(seed))["task_id"].tolist())
        assert got <= ood and len(got) > 70  # nearly all 82 held-out tasks drawn
    assert torch.equal(SRaven(split_seed=0).task_ids["ood"], task.task_ids["ood"])
    assert not torch.equal(SRaven(split_seed=1).task_ids["ood"], task.task_ids["ood"])


def test_the_authors_held_out_tasks_per_seed() -> None:
    """``heldout_draw='authors'``: the tasks the authors' JAX permutation holds out for that seed (their first 8
    for seed 0 read off their code), the rest trained on; problems of ``ood`` come only from
    them; the seed, not the data stream, picks them, and a numpy draw of the same seed picks other ones."""
    theirs = SRaven(split_seed=0, heldout_draw="authors")
    assert theirs.task_ids["ood"][:8].tolist() == [0, 2, 5, 6, 7, 8, 14, 15]
    for seed in (0, 1, 2):
        task = SRaven(split_seed=seed, heldout_draw="authors")
        ood, train = set(task.task_ids["ood"].tolist()), set(task.task_ids["train"].tolist())
        assert len(ood) == 82 and not ood & train and ood | train == set(range(330))
        drawn = task.sample_problems(256, "ood", torch.Generator().manual_seed(seed))["task_id"]
        assert set(drawn.tolist()) <= ood
        ours = set(SRaven(split_seed=seed).task_ids["ood"].tolist())
        assert 10 < len(ours & ood) < 40  # two draws of 82 of 330 share about 20
    assert SRaven(split_seed=1, heldout_draw="authors").task_ids["ood"].tolist() != theirs.task_ids["ood"].tolist()


def test_holdout_zero_drops_the_ood_split() -> None:
    task = SRaven(holdout=0.0)
    assert task.eval_splits == ("test",) and len(task.task_ids["train"]) == 330
    with pytest.raises(ValueError, match="split='ood' is not valid for sraven; allowed values: train, test"):
        task.sample(2, "ood", torch.Generator())


@pytest.mark.float_sensitive
def test_determinism_per_seed_and_resume() -> None:
    task = SRaven()
    a = task.sample(64, "train", torch.Generator().manual_seed(3))
    b = task.sample(64, "train", torch.Generator().manual_seed(3))
    c = task.sample(64, "train", torch.Generator().manual_seed(4))
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    assert all(torch.equal(a.info[k], b.info[k]) for k in a.info)
    assert not torch.equal(a.inputs, c.inputs)
    # sample() and sample_problems() draw the same problems from the same state
    p = task.sample_problems(64, "train", torch.Generator().manual_seed(3))
    assert torch.equal(p["grid"], a.info["grid"]) and torch.equal(p["perm"], a.info["perm"])
    # all randomness comes from the generator: restoring its state replays the stream
    gen = torch.Generator().manual_seed(9)
    task.sample(16, "train", gen)
    state = gen.get_state()
    nxt = task.sample(16, "train", gen)
    gen.set_state(state)
    assert torch.equal(task.sample(16, "train", gen).inputs, nxt.inputs)
    torch.manual_seed(0)  # the global RNG plays no part
    again = task.sample(64, "train", torch.Generator().manual_seed(3))
    assert torch.equal(again.inputs, a.inputs)


def test_encoding_layout_and_answer_recoverable() -> None:
    task = SRaven()
    batch = task.sample(32, "ood", torch.Generator().manual_seed(0))
    assert batch.inputs.shape == (32, 36, 8) and batch.inputs.dtype == torch.float32
    assert task.seq_len == 36 and task.input_dim == 8 and task.output_dim == 8
    assert batch.targets.shape == (32, 4) and batch.targets.dtype == torch.long and task.num_output_positions == 4
    assert set(batch.info) >= {"grid", "rules", "perm", "task_id"}
    assert torch.all(batch.inputs[:, :32].sum(-1) == 1) and torch.all(batch.inputs[:, 32:] == 0)
    grid = batch.info["grid"]
    for n, r, c, i in [(0, 0, 0, 0), (5, 1, 2, 3), (31, 2, 1, 2)]:  # token (r*3 + c)*4 + i is (r, c, slot i)
        assert batch.inputs[n, (r * 3 + c) * 4 + i].argmax() == grid[n, r, c, i]
    decoded = decode_inputs(batch.inputs, 4)  # (B, 8 panels, F)
    assert torch.equal(decoded, grid.reshape(32, 9, 4)[:, :8]) and torch.equal(batch.targets, grid[:, 2, 2])
    for n in range(32):  # the answer follows from the context panels and the rules
        check_problem(task, grid[n], batch.info["rules"][n], batch.info["perm"][n])


def test_loss_and_metrics() -> None:
    task = SRaven()
    batch = task.sample(8, "test", torch.Generator().manual_seed(0))
    perfect = torch.full((8, 36, 8), -10.0)
    perfect[:, 32:] = torch.full((8, 4, 8), -10.0).scatter(2, batch.targets[..., None], 10.0)
    m = task.metrics(perfect, batch)
    assert torch.all(m["acc"] == 1) and torch.all(m["feature_acc"] == 1) and task.loss(perfect, batch) < 1e-6
    one_wrong = perfect.clone()
    one_wrong[0, 34] = perfect[0, 34].roll(1)
    m = task.metrics(one_wrong, batch)
    assert m["acc"][0] == 0 and m["feature_acc"][0] == 0.75 and torch.all(m["acc"][1:] == 1)
    logits = torch.randn(8, 36, 8, generator=torch.Generator().manual_seed(1))
    m = task.metrics(logits, batch)
    manual = torch.stack([F.cross_entropy(logits[n, 32:], batch.targets[n]) for n in range(8)])
    assert torch.allclose(m["loss"], manual, atol=1e-6)
    assert torch.allclose(task.loss(logits, batch), manual.mean(), atol=1e-6)
    want_acc = (logits[:, 32:].argmax(-1) == batch.targets).all(1).float()
    assert torch.equal(m["acc"], want_acc) and set(m) == {"loss", "acc", "feature_acc"}
    assert all(v.shape == (8,) for v in m.values())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_values": 2}, "num_values=2 is too small for distribute_three"),
        ({"holdout": 1.0}, "holdout must be in"),
        ({"holdout": -0.1}, "holdout must be in"),
        ({"holdout": 0.001}, "holdout=0.001 holds out no task"),
        ({"rules": ["constant", "fibonacci"]}, "rules=.* must be distinct names from: constant, progression"),
        ({"rules": []}, "rules=.* must be distinct names"),
        ({"num_features": 0}, "num_features must be >= 1"),
        ({"grid_size": 2}, "grid_size=2 is too small for addition/subtraction"),
        ({"grid_size": 1, "rules": ["constant"]}, "grid_size must be >= 2"),
        ({"num_values": 300, "grid_size": 4}, "num_values=300, grid_size=4: the row table"),
        ({"num_features": 6, "unambiguous_only": True}, "unambiguous_only=True .* num_features=6"),
        ({"rules": ["constant"], "num_features": 2, "holdout": 0.9}, "holdout=0.9 holds out no task of 1"),
        ({"heldout_draw": "jax"}, "heldout_draw must be one of numpy, authors, got 'jax'"),
        ({"heldout_draw": "authors", "holdout": 0.3}, "heldout_draw='authors' needs the authors' task space"),
        ({"heldout_draw": "authors", "split_seed": 10}, "for split seeds 0, 1, .*got split seed 10"),
    ],
)
def test_impossible_configurations(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SRaven(**kwargs)


def test_unknown_split_and_task_name() -> None:
    with pytest.raises(ValueError, match="split='val' is not valid for sraven; allowed values: train, test, ood"):
        SRaven().sample(2, "val", torch.Generator())
    with pytest.raises(ValueError, match="task 'raven' is unknown; allowed values: sraven, fuzzy_logic"):
        make_task("raven")
    assert isinstance(make_task("sraven", num_features=2), SRaven)


def test_rule_subset_and_other_sizes() -> None:
    task = SRaven(rules=["constant", "addition"], num_features=2, holdout=0.34)
    assert len(task.tasks) == 3 and len(task.task_ids["ood"]) == 1
    p = task.sample_problems(64, "train", torch.Generator().manual_seed(0))
    assert set(p["rules"].unique().tolist()) <= {0, 5}
    for n in range(64):
        check_problem(task, p["grid"][n], p["rules"][n], p["perm"][n])
    small = SRaven(grid_size=2, rules=["constant", "progression+1", "distribute_three"], num_features=3)
    batch = small.sample(16, "train", torch.Generator().manual_seed(0))
    assert batch.inputs.shape == (16, 12, 8) and small.seq_len == 12
    for n in range(16):
        check_problem(small, batch.info["grid"][n], batch.info["rules"][n], batch.info["perm"][n])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_sampling_on_cuda() -> None:
    task = SRaven()
    gen = torch.Generator("cuda").manual_seed(0)
    batch = task.sample(256, "train", gen)
    assert batch.inputs.device.type == "cuda" and all(v.device.type == "cuda" for v in batch.info.values())
    again = task.sample(256, "train", torch.Generator("cuda").manual_seed(0))
    assert torch.equal(batch.inputs, again.inputs)
    cpu = batch.to("cpu")
    for n in range(256):
        check_problem(task, cpu.info["grid"][n], cpu.info["rules"][n], cpu.info["perm"][n])
