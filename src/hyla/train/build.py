"""Building what a config describes: its task (from the task registry), and its model sized by the task."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import torch

from hyla.models import Transformer
from hyla.tasks import task_entry
from hyla.tasks.base import Task
from hyla.train.config import ExperimentConfig, task_options
from hyla.train.seeds import model_seed


def build_task(cfg: ExperimentConfig, run_dir: Path | None = None) -> Task:
    """The task of a config; a task that keeps state in its run directory (text: the tokenizer) reads
    it from ``run_dir`` when present."""
    return task_entry(cfg.data.task).build(task_options(cfg.data), cfg.split_seed, run_dir)


def build_tasks(cfgs: list[ExperimentConfig], run_dir: Path | None = None) -> tuple[list[Task], list[int]]:
    """The distinct tasks of runs (one per held-out split: runs whose data config and split seed are the
    same share one) and each run's index into them."""
    tasks: dict[str, Task] = {}
    task_of = []
    for cfg in cfgs:
        key = json.dumps({**dataclasses.asdict(cfg.data), "split_seed": cfg.split_seed}, sort_keys=True, default=str)
        if key not in tasks:
            tasks[key] = build_task(cfg, run_dir)
        task_of.append(list(tasks).index(key))
    return list(tasks.values()), task_of


def sized_config(cfg: ExperimentConfig, task: Task) -> ExperimentConfig:
    """A copy of ``cfg`` whose model has the sizes ``task`` fixes (``cfg`` itself is left as it is)."""
    sizes = task.model_sizes()
    if cfg.model.relative_position:  # unset: the sequence length (as the authors' SRAVEN code sets it)
        for key in ("relative_position_buckets", "relative_position_max_distance"):
            if getattr(cfg.model, key) is None:
                sizes[key] = task.seq_len
    sized = copy.deepcopy(cfg)
    for key, value in sizes.items():
        setattr(sized.model, key, value)
    return sized


def build_model(cfg: ExperimentConfig, task: Task) -> Transformer:
    """The model of ``cfg`` sized by ``task``, initialized from ``cfg.seed``."""
    model_cfg = sized_config(cfg, task).model
    torch.manual_seed(model_seed(cfg.seed))
    return Transformer(model_cfg)
