"""Sweep files (``configs/sweeps/*.yaml``): the grid of runs of one experiment and the state of its records.

A sweep file names a base config, rows (each a set of overrides, e.g. one attention preset;
``config:`` picks another base for that row), a grid of hyperparameters and seeds::

    name: table_a1_fuzzy
    config: fuzzy_logic
    rows: {softmax: {model.attention: softmax}, hyla_moe: {config: fuzzy_logic_moe, model.attention: hyla}}
    grid: {train.lr: [0.001, 0.003], train.weight_decay: [0.1, 0.03]}
    seeds: [0, 1, 2]
    first: [softmax]          # rows whose runs go first (default: file order)
    overrides: {}             # applied to every run
    slurm: {partition: gpu, account: lab, qos: normal, time: 240, cpus: 8, mem_gb: 32, gpus: 1}
                              # what `hyla sweep --launcher slurm` asks of the cluster (SLURM_KEYS)

``hyla sweep`` (:mod:`hyla.sweep`) trains them; ``hyla report --paper`` and ``hyla demo`` read them with
their records. The reader lives here, below the analysis layer, rather than in the top-level
:mod:`hyla.sweep` package, because the analysis reads sweep files and nothing below the commands may
import them. The run directories' states are :mod:`hyla.train.rundir`'s.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hyla.textio import read_yaml
from hyla.train.config import CONFIG_DIR, ExperimentConfig, load_config, parse_override_value

SWEEP_DIR = CONFIG_DIR / "sweeps"
#: the ``slurm:`` keys of a sweep file (and ``hyla sweep --slurm KEY=VALUE``): what one job asks for
SLURM_KEYS = {
    "partition": "SLURM partition",
    "account": "account to charge",
    "qos": "quality of service",
    "time": "minutes per job (a preempted or timed-out job requeues and resumes)",
    "cpus": "CPUs per job",
    "mem_gb": "memory per job in GB",
    "gpus": "GPUs per job",
}
RECORD_ROOT = CONFIG_DIR.parent / "results" / "sweeps"


@dataclass(frozen=True)
class RunSpec:
    """One run of a sweep: its name, base config and overrides (``key=value`` strings)."""

    name: str
    row: str
    config: str
    overrides: tuple[str, ...]
    point: tuple[tuple[str, Any], ...]
    seed: int

    def command(self, out: Path, device: str = "cpu", resume: bool = False) -> str:
        parts = ["hyla", "train", self.config, *self.overrides, "--out", str(out), "--quiet"]
        parts += ["--device", device] if device != "cpu" else []
        parts += ["--resume"] if resume else []
        return " ".join(parts)


@dataclass
class Sweep:
    name: str
    config: str
    rows: dict[str, dict[str, Any]]
    grid: dict[str, list[Any]] = field(default_factory=dict)
    seeds: list[int] = field(default_factory=lambda: [0])
    first: list[str] = field(default_factory=list)
    overrides: dict[str, Any] = field(default_factory=dict)
    slurm: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None
    #: every run's config by run name, loaded once by :func:`check_run_configs` and passed down to training
    configs: dict[str, ExperimentConfig] = field(default_factory=dict, repr=False, compare=False)

    def override(self, items: list[str]) -> None:
        """``--override key=value``: added to every run (its config, so a stopped run resumes only under the
        same overrides); the runs' configs are checked and reloaded."""
        for item in items:
            if "=" not in item:
                raise ValueError(f"--override {item!r} must look like key.sub=value")
            key, raw = item.split("=", 1)
            self.overrides[key.strip()] = parse_override_value(item, raw)
        if items:
            check_run_configs(self, "--override " + " ".join(items))

    def runs(self, only: list[str] | None = None, where: dict[str, list[str]] | None = None) -> list[RunSpec]:
        """Every run in order (the ``first`` rows, then by grid point, seed, row).

        ``only``: these rows. ``where``: grid keys (or ``seed``) to the values to keep, as written on the
        command line, e.g. ``{"train.lr": ["1e-3"], "seed": ["2"]}`` (numbers compare by value).
        """
        if only:
            unknown = [r for r in only if r not in self.rows]
            if unknown:
                raise ValueError(f"--only {unknown[0]!r} is not a row of {self.name}; rows: {', '.join(self.rows)}")
        axes: dict[str, list[Any]] = {**self.grid, "seed": list(self.seeds)}
        keep: dict[str, list[Any]] = {}
        for key, wanted in (where or {}).items():
            if key not in axes:
                raise ValueError(f"--where {key}: not a grid key of {self.name}; keys: {', '.join(axes)}")
            keep[key] = [v for v in axes[key] if any(_same_value(w, v) for w in wanted)]
            missing = [w for w in wanted if not any(_same_value(w, v) for v in axes[key])]
            if missing:
                allowed = ", ".join(_yaml_scalar(v) for v in axes[key])
                raise ValueError(f"--where {key}={missing[0]}: not in the grid of {self.name}; {key} values: {allowed}")
        points = [
            tuple(zip(self.grid, values))
            for values in itertools.product(*self.grid.values())
            if all(v in keep.get(k, [v]) for k, v in zip(self.grid, values))
        ]
        row_order = list(self.rows)
        specs = []
        for p, point in enumerate(points):
            for seed in keep.get("seed", self.seeds):
                for r, row in enumerate(row_order):
                    if only and row not in only:
                        continue
                    extra = dict(self.rows[row])
                    config = str(extra.pop("config", self.config))
                    name = "-".join([row, *(f"{k.split('.')[-1]}{v}" for k, v in point), f"seed{seed}"])
                    values = {**self.overrides, **extra, **dict(point), "seed": seed, "name": name}
                    overrides = tuple(f"{k}={_yaml_scalar(v)}" for k, v in values.items())
                    key = (row not in self.first, p, seed, self.first.index(row) if row in self.first else r)
                    specs.append((key, RunSpec(name, row, config, overrides, point, seed)))
        return [spec for _, spec in sorted(specs, key=lambda item: item[0])]


def _same_value(written: str, value: Any) -> bool:
    """Whether ``written`` (from the command line) names the grid value ``value``: ``1e-3`` names 0.001."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(written) == value
        except ValueError:
            return False
    return written == _yaml_scalar(value)


def _yaml_scalar(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def load_sweep(name_or_path: str) -> Sweep:
    """A sweep file by path or by name in ``configs/sweeps/``; bad fields fail naming the field."""
    path = Path(name_or_path)
    if not path.is_file():
        path = SWEEP_DIR / (name_or_path if name_or_path.endswith(".yaml") else f"{name_or_path}.yaml")
    if not path.is_file():
        known = sorted(p.stem for p in SWEEP_DIR.glob("*.yaml"))
        raise ValueError(f"sweep {name_or_path!r} not found; give a YAML path or one of: {', '.join(known)}")
    spec = read_yaml(path) or {}
    allowed = {"name", "config", "rows", "grid", "seeds", "first", "overrides", "slurm"}
    if not isinstance(spec, dict) or not set(spec) <= allowed:
        extra = sorted(set(spec) - allowed) if isinstance(spec, dict) else ["(not a mapping)"]
        raise ValueError(f"{path}: unknown sweep field {extra[0]}; allowed fields: {', '.join(sorted(allowed))}")
    rows = spec.get("rows") or {"default": {}}
    if not isinstance(rows, dict) or not all(isinstance(v, dict) for v in rows.values()):
        raise ValueError(f"{path}: rows must map names to override mappings, e.g. {{hyla: {{model.attention: hyla}}}}")
    grid = spec.get("grid") or {}
    if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
        raise ValueError(f"{path}: grid must map keys to non-empty lists, e.g. {{train.lr: [0.001, 0.003]}}")
    seeds = spec.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds):
        raise ValueError(f"{path}: seeds must be a non-empty list of integers, got {seeds!r}")
    first = spec.get("first") or []
    if not isinstance(first, list) or any(r not in rows for r in first):
        raise ValueError(f"{path}: first must list row names among: {', '.join(rows)}")
    without_config = [r for r, overrides in rows.items() if "config" not in overrides]
    if not spec.get("config") and without_config:
        raise ValueError(
            f"{path}: config (the base config of the runs: a name in configs/ or a YAML path) is missing, and "
            f"row {without_config[0]} names none of its own; add e.g. 'config: sraven'"
        )
    sweep = Sweep(
        name=str(spec.get("name") or path.stem),
        config=str(spec.get("config") or ""),
        rows={str(k): v for k, v in rows.items()},
        grid=grid,
        seeds=seeds,
        first=first,
        overrides=spec.get("overrides") or {},
        slurm=check_slurm(spec.get("slurm") or {}, f"{path}: slurm"),
        path=path,
    )
    check_run_configs(sweep, str(path))
    return sweep


def check_slurm(values: Any, source: str) -> dict[str, Any]:
    """``values`` if it maps :data:`SLURM_KEYS` to values of their kind; else a ValueError naming ``source``."""
    if not isinstance(values, dict):
        raise ValueError(f"{source} must map keys to values, e.g. {{partition: gpu, time: 240}}")
    for key, value in values.items():
        if key not in SLURM_KEYS:
            raise ValueError(f"{source}: unknown key {key!r}; allowed keys: {', '.join(SLURM_KEYS)}")
        numeric = key in ("time", "cpus", "mem_gb", "gpus")
        if numeric and not (isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0):
            raise ValueError(f"{source}: {key} must be a number >= 0 ({SLURM_KEYS[key]}), got {value!r}")
        if not numeric and not isinstance(value, str):
            raise ValueError(f"{source}: {key} must be a name ({SLURM_KEYS[key]}), got {value!r}")
    return dict(values)


def check_run_configs(sweep: Sweep, source: str) -> None:
    """Load every run's config into ``sweep.configs`` before anything trains; an error names ``source``
    (the sweep file, or the ``--override`` that broke it) and the run."""
    configs = {}
    for run in sweep.runs():
        try:
            configs[run.name] = load_config(run.config, list(run.overrides))
        except ValueError as err:
            raise ValueError(f"{source}: run {run.name}: {err}") from err
    sweep.configs = configs
