"""A sweep's records read once, and each row's grid point chosen by its in-distribution validation metric.

What ``hyla report --paper`` tabulates (``hyla.analysis.paper_report``), without the report's figures and
latent-code analysis, so that a script choosing which point to train next can import this module alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hyla.analysis.paper_numbers import paper_reference
from hyla.analysis.stats import mean_se
from hyla.tasks import PaperColumn, task_entry
from hyla.train.run.folder import RunRecord, has_record, read_pieces, read_run, run_state
from hyla.train.sweeps import RunSpec, Sweep


def paper_column(task: str) -> PaperColumn:
    """The task's Table A1 column; a task outside the paper gets one of its primary metric on ``ood``."""
    entry = task_entry(task)
    return entry.paper_column or PaperColumn(-1, entry.task.primary_metric, f"OOD {entry.metric_title} (%)")


def final_value(run: RunRecord, split: str, metric: str) -> float | None:
    """A finished run's final ``metric`` on ``split`` in %; None before the schedule's last evaluation."""
    last = run.final(split)
    steps = run.config["train"]["steps"]
    return None if last is None or last["step"] != steps or metric not in last else 100 * last[metric]


@dataclass
class RowResult:
    """One sweep row as the report reads it: the grid point its validation metric chose and its numbers."""

    row: str
    #: finished seeds at the chosen grid point (0: no grid point has one yet)
    seeds: int
    #: the chosen grid point, ``((key, value), ...)``; ``()`` when none is chosen yet
    point: tuple
    test: tuple[float, float] | None
    ood: tuple[float, float] | None
    #: the paper's (mean, s.e.) in % where the row's config is a setting of the paper's Table A1
    #: (``paper_reference``): at the chosen point; for a row not chosen yet, where all its points share one
    paper: tuple[float, float] | None
    #: where a row without a chosen point stands: ``not run yet`` or ``in progress (...)``
    status: str = ""
    #: the chosen grid point's runs that have records
    runs: list[RunRecord] = field(default_factory=list)
    #: the grid points the choice compared (those with the row's most finished seeds), the points with a
    #: finished seed but fewer (left out of the choice), and all the row plans
    points_compared: int = 0
    points_with_fewer_seeds: int = 0
    points_planned: int = 0
    #: finished runs at the chosen point that trained some of their steps on a GPU (TF32, compiled, another data
    #: stream from the switch on): the row's numbers are then not all-CPU ones
    partly_gpu: int = 0
    #: the point's values of the sweep's ``across`` keys (the row is chosen once per such setting); ``()`` without
    across: tuple = ()


@dataclass
class SweepResults:
    """A sweep's records, read once: each row's result and every grid point's line."""

    sweep: Sweep
    task: str
    rows: list[RowResult]
    #: ``(row, point, seeds done, seeds planned, test, ood)`` for every grid point, in sweep order
    points: list[tuple[str, tuple, int, int, tuple[float, float] | None, tuple[float, float] | None]]
    loaded: dict[str, RunRecord]
    done: set[str]
    #: every planned run, grouped by ``(row, point)``, in sweep order
    by_point: dict[tuple[str, tuple], list[RunSpec]]
    #: the paper's (mean, s.e.) in % at every planned ``(row, point)`` whose config is a Table A1 setting
    paper: dict[tuple[str, tuple], tuple[float, float]]


def trained_on_gpu(run_dir: Path) -> bool:
    """Whether any piece of the run's ``made_by.jsonl`` trained on a GPU."""
    return any(not str(piece.get("device", "cpu")).startswith("cpu") for piece in read_pieces(run_dir))


def sweep_results(sweep: Sweep, root: Path) -> SweepResults:
    """Read a sweep's records under ``root`` and choose each row's grid point by its in-distribution
    validation metric (among the points with the most finished seeds), never by OOD; in a sweep with
    ``across`` keys, once per setting of those (a row result each)."""
    runs = sweep.runs()
    task = sweep.configs[runs[0].name].data.task
    metric = paper_column(task).metric
    records = root / sweep.name
    loaded = {spec.name: read_run(records / spec.name) for spec in runs if has_record(records / spec.name)}
    done = {name for name in loaded if run_state(records / name) == "done"}
    by_point: dict[tuple[str, tuple], list[RunSpec]] = {}
    for spec in runs:
        by_point.setdefault((spec.row, spec.point), []).append(spec)
    # the paper's number wherever a point is the paper's setting, decided by its config alone (one place for
    # Table A1's sweeps and for a figure's sweep whose `across` keys pass through Table A1's setting)
    at_points = {key: paper_reference(sweep.configs[specs[0].name].to_dict()) for key, specs in by_point.items()}
    paper = {key: value for key, value in at_points.items() if value is not None}

    def stats(specs: list[RunSpec], split: str) -> tuple[list[float], tuple[float, float] | None]:
        values = [v for s in specs if s.name in done if (v := final_value(loaded[s.name], split, metric)) is not None]
        return values, (mean_se(values) if values else None)

    rows, points = [], []
    for row in sweep.rows:
        # the validation metric chooses among a row's points once per setting of the sweep's `across` keys
        settings: dict[tuple, list] = {}
        planned: dict[tuple, int] = {}  # the row's points per setting
        for (r, point), specs in by_point.items():
            if r != row:
                continue
            _, test = stats(specs, "test")
            ood_values, ood = stats(specs, "ood")
            points.append((row, point, len(ood_values), len(specs), test, ood))
            setting = tuple((k, v) for k, v in point if k in sweep.across)
            planned[setting] = planned.get(setting, 0) + 1
            candidates = settings.setdefault(setting, [])
            if test is not None and ood is not None:
                candidates.append((test[0], point, specs, ood, len(ood_values)))
        if not any(settings.values()):
            started = [loaded[s.name] for s in runs if s.row == row and s.name in loaded and loaded[s.name].metrics]
            status = "not run yet"
            if started:
                furthest = max(started, key=lambda run: run.metrics[-1]["step"])
                last_ood = furthest.final("ood")
                ood_now = f", ood {100 * last_ood[metric]:.1f} at step {last_ood['step']}" if last_ood else ""
                status = f"in progress ({furthest.label}: step {furthest.metrics[-1]['step']}{ood_now})"
            shared = {paper.get(key) for key in by_point if key[0] == row}
            rows.append(RowResult(row, 0, (), None, None, shared.pop() if len(shared) == 1 else None, status))
            continue
        for setting, candidates in settings.items():
            if not candidates:
                continue
            # a grid point with fewer finished seeds must not win on one lucky seed: compare equals first
            _, point, specs, ood, n = max(candidates, key=lambda c: (c[4], c[0]))
            compared = sum(c[4] == n for c in candidates)
            _, test = stats(specs, "test")
            chosen = [loaded[s.name] for s in specs if s.name in loaded]
            on_gpu = sum(trained_on_gpu(records / s.name) for s in specs if s.name in done)
            rows.append(
                RowResult(
                    row,
                    n,
                    point,
                    test,
                    ood,
                    paper.get((row, point)),
                    runs=chosen,
                    points_compared=compared,
                    points_with_fewer_seeds=len(candidates) - compared,
                    points_planned=planned[setting],
                    partly_gpu=on_gpu,
                    across=setting,
                )
            )
    return SweepResults(sweep, task, rows, points, loaded, done, by_point, paper)
