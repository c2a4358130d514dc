"""Sweeps: the one sweep-file format, the one naming rule of run folders, and the one planner.

Sweep files (``hyla/configs/sweeps/*.yaml``) give the grid of runs of one experiment.

A sweep file names a base config, rows (each a set of overrides, e.g. one attention preset;
``config:`` picks another base for that row), a grid of hyperparameters and seeds::

    name: table_a1_fuzzy
    config: fuzzy_logic
    rows: {softmax: {model.attention: softmax}, hyla_moe: {config: fuzzy_logic_moe, model.attention: hyla}}
    grid: {train.lr: [0.001, 0.003], train.weight_decay: [0.1, 0.03]}
    seeds: [0, 1, 2]
    first: [softmax]          # rows whose runs go first (default: file order)
    across: []                # grid keys a report shows each row across (a figure's x-axis), never chooses among
    overrides: {}             # applied to every run
    slurm: {partition: gpu, account: lab, qos: normal, time: 240, cpus: 8, mem_gb: 32, gpus: 1}
                              # what `hyla sweep --launcher slurm` asks of the cluster (SLURM_KEYS)

``runs: [{train.lr: 0.003}, ...]`` is short for rows named by their values (``lr0.003``).

A row may add axes of its own to the sweep's grid with a ``grid:`` entry among its overrides (keys not in
the sweep's grid), e.g. ``hyla: {model.attention: hyla, grid: {train.warmup_steps: [1000, 3000]}}``: that
row's points are the sweep's grid points times its own axes (last axis fastest), the other rows' are not.

Run names (``run_name``): ``ROW-<key>VALUE...-seedS``, ``<key>`` the last part of each grid key, e.g.
``hyla-lr0.001-weight_decay0.1-seed0``. The sweep's grid keys are always named; a row's own axis is named
only at values other than the one the row's runs have without it (its config with the sweep's and the row's
overrides), so ``hyla-lr0.001-weight_decay0.1-seed0`` stays the run at the config's warmup after a row adds
warmup to its grid, and ``hyla-lr0.001-weight_decay0.1-warmup_steps3000-seed0`` is the new one.
``--where KEY=V`` on a row's own axis keeps the other rows' runs whose own value of KEY is V.

``hyla sweep`` (``hyla.sweep``) trains them; ``hyla train CONFIG --sweep FILE`` reads the same format over its
``CONFIG`` (``load_sweep(FILE, base=CONFIG)``: a file without rows names no row, and without ``seeds`` no seed),
so both commands name runs alike; ``hyla report --paper`` and ``hyla demo`` read them with their records.
This module sits in ``train/`` because the analysis, a layer above it and below the commands, reads
sweep files. The run directories' states are ``hyla.train.run.folder``'s.

The planner (``plan_groups``) says which runs train together and with which engine, for both commands: runs
form one stack when the stacked engine can stack them (``hyla.train.engines.stacked.stack_key``: same config but
seed, held-out split, data seed and optimizer hyperparameters) and they start together: all new, or all
resuming from checkpoints of the same step (a stack stopped together continues together; runs stopped at
different steps resume one by one). A group of one run trains with the lone engine, the reference; a group
of two or more with the stacked one (``engine_for``). ``describe_plan`` says how they train.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hyla.textio import read_yaml
from hyla.train.config import (
    CONFIG_DIR,
    ExperimentConfig,
    flat_config,
    load_config,
    packaged_yaml,
    parse_override_value,
)

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
#: where sweep records go and are read from by default: under the working directory, never inside the package
RECORD_ROOT = Path("results") / "sweeps"


@dataclass(frozen=True)
class RunSpec:
    """One run of a sweep: its name, base config and overrides (``key=value`` strings); ``point``: its value of
    each of its row's grid keys (the sweep's, then the row's own)."""

    name: str
    row: str
    config: str
    overrides: tuple[str, ...]
    point: tuple[tuple[str, Any], ...]
    seed: int | None

    def command(self, out: Path, device: str = "cpu", resume: bool = False, stop_at_step: int | None = None) -> str:
        parts = ["hyla", "train", self.config, *self.overrides, "--out", str(out), "--quiet"]
        parts += ["--device", device] if device != "cpu" else []
        parts += ["--resume"] if resume else []
        parts += ["--stop-at-step", str(stop_at_step)] if stop_at_step is not None else []
        return " ".join(parts)


@dataclass
class Sweep:
    name: str
    config: str
    rows: dict[str, dict[str, Any]]
    grid: dict[str, list[Any]] = field(default_factory=dict)
    #: ``[None]``: one run per point at its config's seed, not named (``hyla train --sweep`` without seeds)
    seeds: list[int | None] = field(default_factory=lambda: [0])
    first: list[str] = field(default_factory=list)
    #: grid keys along which ``hyla report --paper`` shows each row (Fig. 2C's held-out fraction and length): the
    #: validation metric chooses a row's point among the other keys' values only, once per value of these
    across: list[str] = field(default_factory=list)
    overrides: dict[str, Any] = field(default_factory=dict)
    slurm: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None
    #: every run's config by run name, loaded once by ``check_run_configs`` and passed down to training
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

    def _row_base(self, row: str) -> tuple[str, dict[str, Any]]:
        """``row``'s base config and its overrides (its ``config:`` and ``grid:`` entries taken out)."""
        extra = {k: v for k, v in self.rows[row].items() if k not in ("config", "grid")}
        return str(self.rows[row].get("config", self.config)), extra

    def row_grid(self, row: str) -> dict[str, list[Any]]:
        """The axes of ``row``'s runs: the sweep's grid, then the row's own ``grid:``."""
        return {**self.grid, **self.rows[row].get("grid", {})}

    def own_keys(self) -> list[str]:
        """The keys of the rows' own grids, in file order."""
        return list(dict.fromkeys(k for spec in self.rows.values() for k in spec.get("grid", {})))

    def axis_keys(self) -> list[str]:
        """Every grid key of the sweep: its grid's, then the rows' own."""
        return [*self.grid, *self.own_keys()]

    def row_values(self, row: str) -> dict[str, Any]:
        """``row``'s value of each of the rows' own grid keys apart from its grid: its config with the sweep's
        and the row's overrides. Names leave a row's own axis out at this value; ``--where`` compares rows
        without the axis by it."""
        keys = self.own_keys()
        if not keys:  # no config to load for the sweeps without per-row axes
            return {}
        config, extra = self._row_base(row)
        items = [f"{k}={_yaml_scalar(v)}" for k, v in {**self.overrides, **extra}.items()]
        try:
            flat = flat_config(load_config(config, items).to_dict())
        except ValueError as err:
            raise ValueError(f"row {row}: {err}") from err
        unknown = [k for k in keys if k not in flat]
        if unknown:
            raise ValueError(f"row {row}: grid key {unknown[0]} is not a key of its config {config}")
        return {k: flat[k] for k in keys}

    def runs(self, only: list[str] | None = None, where: dict[str, list[str]] | None = None) -> list[RunSpec]:
        """Every run in order (the ``first`` rows, then by grid point (the sweep's, then the row's own
        axes), seed, row).

        ``only``: these rows. ``where``: grid keys (or ``seed``) to the values to keep, as written on the
        command line, e.g. ``{"train.lr": ["1e-3"], "seed": ["2"]}`` (numbers compare by value).
        """
        if only:
            unknown = [r for r in only if r not in self.rows]
            if unknown:
                raise ValueError(f"--only {unknown[0]!r} is not a row of {self.name}; rows: {', '.join(self.rows)}")
        axes: dict[str, list[Any]] = {}
        for row in self.rows:
            for key, values in self.row_grid(row).items():
                axes.setdefault(key, []).extend(v for v in values if v not in axes.get(key, []))
        axes["seed"] = list(self.seeds)
        keep: dict[str, list[Any]] = {}
        for key, wanted in (where or {}).items():
            if key not in axes:
                raise ValueError(f"--where {key}: not a grid key of {self.name}; keys: {', '.join(axes)}")
            keep[key] = [v for v in axes[key] if any(_same_value(w, v) for w in wanted)]
            missing = [w for w in wanted if not any(_same_value(w, v) for v in axes[key])]
            if missing:
                allowed = ", ".join(_yaml_scalar(v) for v in axes[key])
                raise ValueError(f"--where {key}={missing[0]}: not in the grid of {self.name}; {key} values: {allowed}")
        shared = [tuple(zip(self.grid, values)) for values in itertools.product(*self.grid.values())]
        specs = []
        for r, row in enumerate(self.rows):
            if only and row not in only:
                continue
            config, extra = self._row_base(row)
            own = self.rows[row].get("grid", {})
            fixed = self.row_values(row)
            own_points = [tuple(zip(own, values)) for values in itertools.product(*own.values())]
            for (p, base), (q, added) in itertools.product(enumerate(shared), enumerate(own_points)):
                point = base + added
                if not all(v in keep.get(k, [v]) for k, v in {**fixed, **dict(point)}.items()):
                    continue
                named = [*base, *((k, v) for k, v in added if v != fixed[k])]
                for seed in keep.get("seed", self.seeds):
                    name = run_name(row, named, seed)
                    seeded = {} if seed is None else {"seed": seed}
                    values = {**self.overrides, **extra, **dict(point), **seeded, "name": name}
                    overrides = tuple(f"{k}={_yaml_scalar(v)}" for k, v in values.items())
                    key = (row not in self.first, p, q, seed, self.first.index(row) if row in self.first else r)
                    specs.append((key, RunSpec(name, row, config, overrides, point, seed)))
        return [spec for _, spec in sorted(specs, key=lambda item: item[0])]


def run_name(row: str, point: Iterable[tuple[str, Any]] = (), seed: int | None = None) -> str:
    """The folder name of a run, the one rule of ``hyla sweep`` and ``hyla train --seeds/--sweep``: ``row``
    (left out when empty), ``<key>VALUE`` for each named grid key (its last part), then ``seedS`` (left out
    for None), joined by ``-``: ``hyla-lr0.001-weight_decay0.1-seed0``, ``lr0.003-seed1``."""
    parts = [row, *(f"{k.split('.')[-1]}{v}" for k, v in point), "" if seed is None else f"seed{seed}"]
    return "-".join(p for p in parts if p)


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


def load_sweep(name_or_path: str, base: str | None = None) -> Sweep:
    """A sweep file by path or by name in the packaged ``hyla/configs/sweeps/``; bad fields fail naming the field.

    ``base``: ``hyla train BASE --sweep FILE``'s reading: the runs' base config is ``base``, a file without
    rows names no row (not ``default``) and one without ``seeds`` leaves each run its config's seed, unnamed."""
    path = packaged_yaml(name_or_path, SWEEP_DIR, "sweep")
    spec = read_yaml(path) or {}
    allowed = {"name", "config", "rows", "runs", "grid", "seeds", "first", "across", "overrides", "slurm"}
    if not isinstance(spec, dict) or not set(spec) <= allowed:
        extra = sorted(set(spec) - allowed) if isinstance(spec, dict) else ["(not a mapping)"]
        raise ValueError(f"{path}: unknown sweep field {extra[0]}; allowed fields: {', '.join(sorted(allowed))}")
    if base is not None:
        spec["config"] = base
    rows = spec.get("rows") or {}
    if not isinstance(rows, dict) or not all(isinstance(v, dict) for v in rows.values()):
        raise ValueError(f"{path}: rows must map names to override mappings, e.g. {{hyla: {{model.attention: hyla}}}}")
    runs = spec.get("runs", [])
    if not isinstance(runs, list) or not all(isinstance(e, dict) and e for e in runs):
        raise ValueError(f"{path}: runs must be a list of override mappings, e.g. [{{train.lr: 0.003}}]")
    named = {run_name("", entry.items()): entry for entry in runs}
    if len(named) < len(runs) or set(named) & set(rows):
        raise ValueError(f"{path}: two rows or runs would share a run name; make the entries distinct")
    rows = {**rows, **named} or {"" if base is not None else "default": {}}
    grid = spec.get("grid") or {}
    if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
        raise ValueError(f"{path}: grid must map keys to non-empty lists, e.g. {{train.lr: [0.001, 0.003]}}")
    for row, overrides in rows.items():
        own = overrides.get("grid", {})
        if not isinstance(own, dict) or not all(isinstance(v, list) and v for v in own.values()):
            raise ValueError(
                f"{path}: row {row}: grid must map keys to non-empty lists, e.g. {{train.warmup_steps: [1000, 3000]}}"
            )
        # one axis, one naming rule: a key of the sweep's grid is always named, a row's own only off its value
        clash = [k for k in own if k in grid or k in ("seed", "name")]
        if clash:
            raise ValueError(
                f"{path}: row {row}: grid key {clash[0]} is already an axis of every run; a row's grid adds keys"
            )
    seeds = spec.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds):
        raise ValueError(f"{path}: seeds must be a non-empty list of integers, got {seeds!r}")
    first = spec.get("first") or []
    if not isinstance(first, list) or any(r not in rows for r in first):
        raise ValueError(f"{path}: first must list row names among: {', '.join(rows)}")
    across = spec.get("across") or []
    if not isinstance(across, list) or any(k not in grid for k in across):
        raise ValueError(f"{path}: across must list keys of the sweep's grid, among: {', '.join(grid) or '(none)'}")
    without_config = [r for r, overrides in rows.items() if "config" not in overrides]
    if not spec.get("config") and without_config:
        raise ValueError(
            f"{path}: config (the base config of the runs: a packaged config name or a YAML path) is missing, and "
            f"row {without_config[0]} names none of its own; add e.g. 'config: sraven'"
        )
    name = path.stem if spec.get("name") is None else str(spec["name"])
    if not is_one_path_component(name):
        raise ValueError(
            f"{path}: name {name!r} must be one folder name (the records go to --root/NAME): not empty, no '/', "
            "not '.' or '..'"
        )
    sweep = Sweep(
        name=name,
        config=str(spec.get("config") or ""),
        rows={str(k): v for k, v in rows.items()},
        grid=grid,
        seeds=seeds if "seeds" in spec or base is None else [None],
        first=first,
        across=across,
        overrides=spec.get("overrides") or {},
        slurm=check_slurm(spec.get("slurm") or {}, f"{path}: slurm"),
        path=path,
    )
    check_run_configs(sweep, str(path))
    return sweep


def is_one_path_component(name: str) -> bool:
    """Whether ``name`` names one folder inside another: a sweep's or a run's records cannot land outside
    ``--root``."""
    return name not in ("", ".", "..") and not any(c in name for c in "/\\\0")


def check_slurm(values: Any, source: str) -> dict[str, Any]:
    """``values`` if it maps ``SLURM_KEYS`` to values of their kind; else a ValueError naming ``source``."""
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
    try:
        runs = sweep.runs()
    except ValueError as err:  # a row's grid key that its config lacks
        raise ValueError(f"{source}: {err}") from err
    for run in runs:
        if not is_one_path_component(run.name):  # a row or a grid value with a '/' would nest or escape it
            raise ValueError(
                f"{source}: run {run.name!r} is not one folder name (no '/'); rename its row or grid values"
            )
        if run.name in configs:  # two runs in one directory would resume each other's checkpoints
            raise ValueError(f"{source}: two runs are named {run.name}; give the grid values that differ")
        try:
            configs[run.name] = load_config(run.config, list(run.overrides))
        except ValueError as err:
            raise ValueError(f"{source}: run {run.name}: {err}") from err
    sweep.configs = configs


# ------------------------------------------------------------------------------ the planner


def engine_for(cfgs: list[ExperimentConfig]) -> str:
    """The engine of one group of ``plan_groups``: ``lone`` for one run, else ``stacked``. A stack of
    one equals its lone run bit for bit with the loop forward, so the lone engine (DDP, its own CUDA
    graph) is the one to use."""
    return "lone" if len(cfgs) == 1 else "stacked"


def plan_groups(
    cfgs: list[ExperimentConfig], resume_from: list[int | None] | None = None, max_stack: int | None = None
) -> list[list[int]]:
    """Indices of ``cfgs`` as the groups they train in, in order of each group's first run.
    ``resume_from[i]``: the checkpoint step run ``i`` resumes from, None for a new run (default: all new);
    ``max_stack``: a stack of more runs is cut into consecutive stacks of at most that many."""
    if max_stack is not None and max_stack < 1:
        raise ValueError(f"max_stack must be >= 1, got {max_stack}")
    from hyla.train.engines.stacked import stack_key

    starts = resume_from if resume_from is not None else [None] * len(cfgs)
    if len(starts) != len(cfgs):
        raise ValueError(f"resume_from must hold one step per run: {len(cfgs)} runs, {len(starts)} steps")
    groups: dict[tuple[int | None, str | int], list[int]] = {}
    for i, (cfg, start) in enumerate(zip(cfgs, starts)):
        key = stack_key(cfg)
        groups.setdefault((start, i if key is None else key), []).append(i)
    cap = max_stack or len(cfgs) or 1
    return [group[k : k + cap] for group in groups.values() for k in range(0, len(group), cap)]


#: the largest stack a sweep trains unless told otherwise (``hyla sweep --max-stack``): 1, each run alone. On a
#: CPU a stack of R runs costs about R lone steps (the loop forward); on an H100 a stack of 3 SRAVEN runs
#: trained 124 steps/s (372 run-steps/s), one run alone 567. Runs one after
#: another also finish, and land their records, one by one, instead of all at the end or none under a budget.
SWEEP_MAX_STACK = 1


def describe_plan(groups: list[list[ExperimentConfig]], cap: int | None = None) -> str:
    """The planner's line on groups of ``plan_groups`` (stacks of at most ``cap`` runs): how many, and why
    the runs are not one stack."""
    from hyla.train.engines.stacked import not_stackable_reason, stack_differences

    runs = [cfg for group in groups for cfg in group]
    if len(groups) == 1:
        return f"{len(runs)} runs in one stack" if len(runs) > 1 else "1 run"
    reasons = sorted({reason for cfg in runs if (reason := not_stackable_reason(cfg))})
    if cap is not None and any(len(g) == cap for g in groups):
        reasons.append("each run alone: --max-stack 1" if cap == 1 else f"stacks of at most {cap}: --max-stack")
    if differ := stack_differences(runs):
        reasons.append(f"they differ in {', '.join(differ)}")
    why = "; ".join(reasons) or "their checkpoints are at different steps"  # the one other cause
    return f"{len(runs)} runs in {len(groups)} groups ({why})"
