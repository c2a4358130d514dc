"""The run directory's one owner: refuse or resume, ``config.yaml``, ``metrics.jsonl`` (append, truncate),
its state (new, stopped, done), the pieces of training it records, loading a trained run for analysis
and generation.

Layout: ``config.yaml`` (the resolved config as the run was created; never rewritten), ``config_changes.jsonl``
(the settings a resume changed, if any: ``run_config_values`` lays them over ``config.yaml``), ``metrics.jsonl``
(one ``{"step", "split", ...}`` line per record), ``made_by.jsonl`` (one line per piece of training, written by
``hyla sweep``), ``tb/`` (TensorBoard), ``checkpoints/`` (``hyla.train.run.checkpoint``). The lone and the
stacked trainer both write through here, so their run directories are the same format.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from hyla.models import Transformer
from hyla.tasks import task_entry
from hyla.tasks.base import Task
from hyla.textio import FileFormatError, append_jsonl, read_jsonl, read_yaml, rewrite_jsonl
from hyla.train.build import build_model, build_task
from hyla.train.config import (
    ExperimentConfig,
    config_with_overrides,
    dump_config,
    flat_config,
    set_dotted,
)
from hyla.train.run.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint, load_weights

METRICS = "metrics.jsonl"
CONFIG = "config.yaml"
#: one ``{"step", "changes": {"train.steps": ..., ...}}`` line per resume that changed a setting (only resumable
#: ones may change): ``config.yaml`` stays the run's config as created, and the changes say where it went since
CONFIG_CHANGES = "config_changes.jsonl"
#: each run's pieces: one line per piece of training, written when it starts (``ended``, ``to_step`` and
#: ``wall_s`` null) and completed when it ends; a piece killed outright keeps its start line
MADE_BY = "made_by.jsonl"
#: a finished run's final weights (model only), kept beside its records when its checkpoints go
FINAL_WEIGHTS = "model.safetensors"
#: a run's record, what the reports and a sweep's states read (its weights and checkpoints apart)
RECORD_FILES = (CONFIG, CONFIG_CHANGES, METRICS, MADE_BY)


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
    """``config.yaml`` of a new run: its config as created."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # a file in the way, no permission: the user's path, so one line, not a traceback
        raise ValueError(f"cannot make the run directory {run_dir} ({err.strerror}); choose another place") from err
    (run_dir / CONFIG).write_text(dump_config(cfg))


def record_config_changes(run_dir: Path, step: int, cfg: ExperimentConfig) -> dict[str, Any]:
    """A resume at ``step`` with ``cfg``: the settings in which it differs from the run's config as it stands
    (``config.yaml`` and the changes so far), appended as one line of ``config_changes.jsonl``; ``{}`` (nothing
    written) when it differs in none. The run's ``name`` is left out: a run resumed under a former folder name
    keeps its own."""
    standing = flat_config(load_run_config(run_dir).to_dict())
    changes = {k: v for k, v in flat_config(cfg.to_dict()).items() if k != "name" and standing.get(k) != v}
    if changes:
        append_jsonl(run_dir / CONFIG_CHANGES, {"step": step, "changes": changes})
    return changes


def run_config_values(run_dir: str | Path) -> dict[str, Any]:
    """The run's config as a mapping, as it stands: ``config.yaml`` with the resumes' changes laid over it in
    order (a record without ``config_changes.jsonl``, as every record before it, is its ``config.yaml``)."""
    run_dir = Path(run_dir)
    values = read_yaml(run_dir / CONFIG)
    if not isinstance(values, dict):
        raise FileFormatError(f"{run_dir / CONFIG}: not a run's resolved config (a mapping); restore it from the run")
    path = run_dir / CONFIG_CHANGES
    if path.is_file():
        values = copy.deepcopy(values)
        for line in read_jsonl(path):
            for key, value in line["changes"].items():
                set_dotted(values, key, value)
    return values


def load_run_config(run_dir: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    """The run's config as it stands (``run_config_values``), with ``KEY=VALUE`` overrides laid over it."""
    return config_with_overrides(run_config_values(run_dir), overrides)


def append_metrics(run_dir: Path, step: int, split: str, values: dict[str, Any]) -> None:
    append_jsonl(run_dir / METRICS, {"step": step, "split": split, **values})


def truncate_metrics_after(run_dir: Path, step: int) -> None:
    """Drop metric lines past ``step`` (written after the checkpoint by a run that was then interrupted),
    and a torn last line (a write cut off by ``kill -9``), so that appends continue a valid file."""
    path = run_dir / METRICS
    if not path.exists():
        return
    rewrite_jsonl(path, [record for record in read_jsonl(path) if record["step"] <= step])


def has_record(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds a run's record: its ``config.yaml`` and its metrics (what ``read_run`` reads)."""
    run_dir = Path(run_dir)
    return (run_dir / CONFIG).is_file() and (run_dir / METRICS).is_file()


def metrics_path(run_dir: str | Path) -> Path:
    """The file a run directory's metrics are in (one ``{"step", "split", ...}`` line per record)."""
    return Path(run_dir) / METRICS


def run_state(run_dir: Path) -> str:
    """``done`` (its final evaluation is written), ``stopped`` (a checkpoint to resume) or ``new``."""
    if has_record(run_dir):
        steps = run_config_values(run_dir).get("train", {}).get("steps")
        for row in read_jsonl(run_dir / METRICS):
            if row.get("step") == steps and row.get("split") not in (None, "train_batch"):
                return "done"
    return "stopped" if latest_checkpoint(run_dir) is not None else "new"


def last_step(run_dir: Path) -> int:
    """The last step ``metrics.jsonl`` records (0 for none)."""
    path = run_dir / METRICS
    return max((row["step"] for row in read_jsonl(path)), default=0) if path.is_file() else 0


def start_piece_record(run_dir: Path, started: dict[str, Any]) -> None:
    """Append the line of a piece of training as it starts (``ended``, ``to_step``, ``wall_s`` null)."""
    append_jsonl(run_dir / MADE_BY, started)


def finish_piece_record(run_dir: Path, started: dict[str, Any], finished: dict[str, Any]) -> None:
    """Replace the piece's ``started`` line (the last of ``made_by.jsonl``) by ``finished``, atomically;
    appended instead if that line is gone."""
    path = run_dir / MADE_BY
    records = read_jsonl(path) if path.exists() else []
    if records and records[-1] == started:
        records[-1] = finished
    else:
        records.append(finished)
    rewrite_jsonl(path, records)


def read_pieces(run_dir: Path) -> list[dict[str, Any]]:
    """The pieces of training ``made_by.jsonl`` records (none if it is absent)."""
    path = run_dir / MADE_BY
    return read_jsonl(path) if path.is_file() else []


def has_trained_weights(run_dir: str | Path) -> bool:
    """Whether ``load_trained`` finds weights in ``run_dir`` (final ones or a checkpoint)."""
    run_dir = Path(run_dir)
    return (run_dir / FINAL_WEIGHTS).is_file() or latest_checkpoint(run_dir) is not None


class TrainedRun(NamedTuple):
    """A run directory's trained model, as ``load_trained`` reads it."""

    #: the run directory it was read from
    path: Path
    config: ExperimentConfig
    task: Task
    model: Transformer
    #: which weights ``model`` holds: ``"final"`` or ``"checkpoint at step N"``
    weights: str
    #: the optimizer updates those weights had (a finished run's: its ``train.steps``)
    step: int


def load_trained(run_dir: str | Path) -> TrainedRun:
    """The trained model of a run directory, in eval mode: a finished run's final weights
    (``model.safetensors``), else those of its latest checkpoint.

    ``trained = load_trained("results/sweeps/table_a1_fuzzy/hyla-lr0.001-weight_decay0.1-seed0")``, then
    ``trained.model``, ``trained.task``, ``trained.weights``...
    """
    run_dir = Path(run_dir)
    if not (run_dir / CONFIG).is_file():
        raise ValueError(f"{run_dir} is not a run directory (no {CONFIG})")
    cfg = load_run_config(run_dir)
    task = build_task(cfg, run_dir)
    model = build_model(cfg, task)
    if (run_dir / FINAL_WEIGHTS).is_file():
        model.load_state_dict(load_weights(run_dir / FINAL_WEIGHTS))
        return TrainedRun(run_dir, cfg, task, model.eval(), "final", cfg.train.steps)
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        raise ValueError(f"{run_dir} has neither final weights ({FINAL_WEIGHTS}) nor a checkpoint")
    state = load_checkpoint(ckpt)
    model.load_state_dict(state.model)
    return TrainedRun(run_dir, cfg, task, model.eval(), f"checkpoint at step {state.step}", state.step)


# ------------------------------------------------------------------------------ records read back
@dataclass
class RunRecord:
    """A run directory as read back: its resolved config and every line of its ``metrics.jsonl``."""

    path: Path
    config: dict[str, Any]
    metrics: list[dict[str, Any]]

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def label(self) -> str:
        """The config's run name (``--seeds`` runs differ in it, not in their ``seedN`` folders)."""
        return str(self.config.get("name") or self.path.name)

    def curve(self, split: str, metric: str) -> tuple[list[int], list[float]]:
        rows = [m for m in self.metrics if m["split"] == split and metric in m]
        return [m["step"] for m in rows], [m[metric] for m in rows]

    def final(self, split: str) -> dict[str, Any] | None:
        rows = [m for m in self.metrics if m["split"] == split]
        return rows[-1] if rows else None

    @property
    def task(self) -> type[Task]:
        """The class of the run's task (what it measures, how it is analysed)."""
        return task_entry(self.config["data"]["task"]).task

    @property
    def primary_metric(self) -> str:
        return self.task.primary_metric


def read_run(path: str | Path) -> RunRecord:
    """The records of the run directory ``path``; a damaged file is an error naming it and its line."""
    path = Path(path)
    if not has_record(path):
        raise ValueError(f"{path} is not a run directory (needs config.yaml and {METRICS})")
    return RunRecord(path, run_config_values(path), read_jsonl(path / METRICS))
