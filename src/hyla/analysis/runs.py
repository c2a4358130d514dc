"""Reading run directories: resolved config and metrics."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hyla.tasks import Task, task_entry
from hyla.textio import FileFormatError, read_jsonl, read_yaml


@dataclass
class Run:
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


def load_run(path: str | Path) -> Run:
    path = Path(path)
    cfg_path, metrics_path = path / "config.yaml", path / "metrics.jsonl"
    if not cfg_path.is_file() or not metrics_path.is_file():
        raise ValueError(f"{path} is not a run directory (needs config.yaml and metrics.jsonl)")
    config = read_yaml(cfg_path)
    if not isinstance(config, dict):
        raise FileFormatError(f"{cfg_path}: not a run's resolved config (a mapping); restore it from the run")
    return Run(path, config, read_jsonl(metrics_path))
