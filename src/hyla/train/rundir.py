"""The run directory's one owner: refuse or resume, ``config.yaml``, ``metrics.jsonl`` (append, truncate),
loading a trained run for analysis and generation.

Layout: ``config.yaml`` (the resolved config), ``metrics.jsonl`` (one ``{"step", "split", ...}`` line
per record), ``tb/`` (TensorBoard), ``checkpoints/`` (:mod:`hyla.train.checkpoint`). The lone and
the stacked trainer both write through here, so their run directories are the same format.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hyla.models import Transformer
from hyla.tasks.base import Task
from hyla.train.build import build_model, build_task
from hyla.train.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint
from hyla.train.config import ExperimentConfig, dump_config, load_config

METRICS = "metrics.jsonl"


def check_new_or_resumable(run_dir: Path, resume: bool) -> Path | None:
    """The checkpoint to resume from (``resume``), or None for a new run; refuses a run directory that
    already holds a run unless resuming, and ``--resume`` without a checkpoint."""
    ckpt = latest_checkpoint(run_dir) if run_dir.exists() else None
    if resume and ckpt is None:
        raise CheckpointError(
            f"--resume: no checkpoint in {run_dir} (expected {run_dir}/checkpoints/latest); drop --resume to start anew"
        )
    if not resume and (ckpt is not None or (run_dir / METRICS).exists()):
        raise CheckpointError(f"{run_dir} already holds a run; pass --resume to continue it or choose another --out")
    return ckpt if resume else None


def write_config(run_dir: Path, cfg: ExperimentConfig) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(dump_config(cfg))


def append_metrics(run_dir: Path, step: int, split: str, values: dict[str, Any]) -> None:
    with open(run_dir / METRICS, "a") as f:
        f.write(json.dumps({"step": step, "split": split, **values}) + "\n")


def truncate_metrics_after(run_dir: Path, step: int) -> None:
    """Drop metric lines past ``step`` (written after the checkpoint by a run that was then interrupted)."""
    path = run_dir / METRICS
    if not path.exists():
        return
    keep = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in keep))
    os.replace(tmp, path)


def load_trained(run_dir: str | Path) -> tuple[ExperimentConfig, Task, Transformer]:
    """(config, task, model in eval mode) of a run directory, weights from its latest checkpoint."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise ValueError(f"{run_dir} is not a run directory (no config.yaml)")
    cfg = load_config(str(run_dir / "config.yaml"))
    task = build_task(cfg, run_dir)
    model = build_model(cfg, task)
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        raise ValueError(f"{run_dir} has no checkpoint")
    model.load_state_dict(load_checkpoint(ckpt).model)
    return cfg, task, model.eval()
