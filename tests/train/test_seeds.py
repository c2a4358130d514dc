"""The derived seeds keep the values every committed record and checkpoint was trained with."""

from __future__ import annotations

import pytest

from hyla.train.config import ExperimentConfig
from hyla.train.seeds import data_stream_seed, default_data_seed, eval_split_seed, model_seed


@pytest.mark.parametrize("seed", [0, 1, 7, 123456])
def test_seed_of_the_model_and_of_the_default_data_stream(seed: int) -> None:
    assert model_seed(seed) == seed
    assert default_data_seed(seed) == 1_000_003 * (seed + 1)
    cfg = ExperimentConfig(seed=seed)
    assert cfg.data_seed == 1_000_003 * (seed + 1)
    cfg.train.data_seed = 42
    assert cfg.data_seed == 42


@pytest.mark.parametrize(("data_seed", "rank"), [(0, 0), (1_000_003, 0), (2_000_006, 1), (42, 3)])
def test_data_stream_seed(data_seed: int, rank: int) -> None:
    assert data_stream_seed(data_seed, rank) == data_seed * 1009 + rank
    for step in (1, 500, 140_128):
        assert data_stream_seed(data_seed, rank, restarted_at_step=step) == (data_seed * 1009 + rank) * 1_000_003 + step


def test_data_stream_seed_of_seed_0_written_out() -> None:
    assert data_stream_seed(default_data_seed(0), 0) == 1_009_003_027
    assert data_stream_seed(default_data_seed(0), 0, restarted_at_step=500) == 1_009_003_027 * 1_000_003 + 500


@pytest.mark.parametrize(("eval_seed", "split_index"), [(1234, 0), (1234, 1), (1234, 2), (0, 5)])
def test_eval_split_seed(eval_seed: int, split_index: int) -> None:
    assert eval_split_seed(eval_seed, split_index) == eval_seed * 101 + split_index
    assert eval_split_seed(1234, 1) == 124_635
