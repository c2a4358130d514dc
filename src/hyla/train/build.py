"""Building what a config describes: its task, and its model sized by the task."""

from __future__ import annotations

from pathlib import Path

import torch

from hyla.models import Transformer
from hyla.tasks.base import Task
from hyla.train.config import ExperimentConfig


def build_task(cfg: ExperimentConfig, run_dir: Path | None = None) -> Task:
    """The task of a config; for text, the tokenizer saved in ``run_dir`` is reused when present."""
    from hyla.tasks import make_task

    d = cfg.data
    if d.task == "text":
        from hyla.tasks.text import TextTask

        return TextTask(d, None if run_dir is None else Path(run_dir) / "tokenizer.json")
    if d.task == "sraven":
        return make_task(
            "sraven",
            num_features=d.num_features,
            num_values=d.num_values,
            grid_size=d.grid_size,
            holdout=d.holdout,
            split_seed=cfg.split_seed,
            unambiguous_only=d.unambiguous_only,
        )
    return make_task(
        "fuzzy_logic",
        num_variables=d.num_variables,
        num_terms=d.num_terms,
        num_examples=d.num_examples,
        holdout=d.holdout,
        split_seed=cfg.split_seed,
        num_unseen_terms=d.num_unseen_terms,
        split_style=d.split_style,
    )


def build_model(cfg: ExperimentConfig, task: Task) -> Transformer:
    m = cfg.model
    if cfg.data.task == "text":
        m.input_dim, m.vocab_size, m.output_dim = None, task.vocab_size, task.vocab_size  # type: ignore[attr-defined]
        m.causal = True
    else:
        m.input_dim, m.output_dim, m.vocab_size = task.input_dim, task.output_dim, None
    if m.relative_position:
        m.relative_position_buckets = m.relative_position_max_distance = task.seq_len
    torch.manual_seed(cfg.seed)
    return Transformer(m)
