"""``hyla report --paper``: ``OUT/paper.md``, ours beside the paper's numbers, from the sweep records.

For each paper sweep (``hyla/configs/sweeps/``; then our follow-ups that have records): the command, the
commits, machines and devices that trained it, the wall time, and per row our final OOD metric (mean +-
s.e. over the finished seeds) at the grid point its in-distribution validation metric (split ``test``,
final evaluation; among the points with the most finished seeds) chose, beside the paper's value,
whether they agree within two standard errors, and every grid point. Rows not run yet say so. One
figure per sweep: OOD against training step, one colour per row.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from hyla.analysis.latent_summary import figure_lines, latent_section
from hyla.analysis.plots import learning_curves, sweep_plot
from hyla.analysis.selection import RowResult, SweepResults, paper_column, sweep_results
from hyla.analysis.stats import first_reaching, format_mean_se
from hyla.train.run.checkpoint import checkpoint_step
from hyla.train.run.folder import (
    MADE_BY,
    RunRecord,
    has_trained_weights,
    read_pieces,
)
from hyla.train.sweeps import Sweep, load_sweep

PAPER_SWEEPS = ("table_a1_fuzzy", "table_a1_sraven", "fig2c_fuzzy")
#: our own follow-up experiments, shown after the paper's once they have records
FOLLOW_UP_SWEEPS = ("init_fuzzy",)
#: problems per split whose latent codes the report analyses for each finished run with weights
LATENT_PROBLEMS = 2048


def _fmt(mean_se_pair: tuple[float, float] | None) -> str:
    if mean_se_pair is None:
        return "-"
    return format_mean_se(*mean_se_pair)


def agreement(ours: tuple[float, float], paper: tuple[float, float] | None, seeds: int) -> str:
    """``yes``/``no``: |ours - paper| <= 2 sqrt(se_ours^2 + se_paper^2); undecided with fewer than 2 seeds."""
    if paper is None:
        return "-"
    if seeds < 2:
        return f"n/a ({seeds} seed)"
    bound = 2 * math.sqrt(ours[1] ** 2 + paper[1] ** 2)
    return f"{'yes' if abs(ours[0] - paper[0]) <= bound else 'no'} ({ours[0] - paper[0]:+.1f})"


def _made_by(root: Path) -> tuple[set[str], set[str], float, int]:
    """Commits, devices and wall time (a stack's time shared among its runs) of the pieces recorded under
    ``root``, and how many pieces never recorded their end (still training, or killed outright)."""
    commits, devices, wall, unfinished = set(), set(), 0.0, 0
    for path in sorted(root.glob(f"*/{MADE_BY}")):
        for rec in read_pieces(path.parent):
            commits.add(rec["commit"])
            devices.add(f"{rec['device']} on {rec['machine']}")
            if rec.get("wall_s") is None:
                unfinished += 1
                continue
            wall += rec["wall_s"] / rec.get("stacked_with", 1)
    return commits, devices, wall, unfinished


def matched_updates(found: SweepResults, cells: Callable[[str, tuple], list[str]], metric: str) -> list[str]:
    """Every run of a row that has a run in progress, seed by seed, at the same update counts: ``test / ood``
    (%) at 10,000, 20,000, 30,000 and each 50,000 an unfinished run has passed; grid points compare before
    they finish (the probes of a grid search)."""
    records = found.sweep.runs()
    unfinished_rows = {s.row for s in records if s.name in found.loaded and s.name not in found.done}
    shown = [s for s in records if s.row in unfinished_rows and s.name in found.loaded]
    shown.sort(key=lambda s: (list(found.sweep.rows).index(s.row), s.seed))  # stable: grid points in sweep order
    if not shown:
        return []
    reached = {s.name: _updates_reached(found.loaded[s.name]) for s in shown if s.name not in found.done}
    milestones = [10_000, 20_000, 30_000, *range(50_000, max(reached.values()) + 1, 50_000)]
    keys = ", ".join(k.split(".")[-1] for k in found.sweep.axis_keys())
    lines = [
        "Grid points at matched updates (rows with a run in progress; `test / ood`, %, at each update count):",
        "",
        f"| row | {keys} | seed | updates reached | " + " | ".join(f"{m:,}" for m in milestones) + " |",
        "|" + "---|" * (4 + len(milestones)),
    ]
    for spec in shown:
        run = found.loaded[spec.name]
        at = {(m["step"], m["split"]): m.get(metric) for m in run.metrics}
        row_cells = []
        for m in milestones:
            test, ood = at.get((m, "test")), at.get((m, "ood"))
            row_cells.append("-" if test is None or ood is None else f"{100 * test:.1f} / {100 * ood:.1f}")
        where = f"{reached[spec.name]:,}" if spec.name in reached else "finished"
        lines.append(
            f"| {spec.row} | {', '.join(cells(spec.row, spec.point))} | {spec.seed} | {where} | "
            + " | ".join(row_cells)
            + " |"
        )
    return [*lines, ""]


def plateau_exits(found: SweepResults, cells: Callable[[str, tuple], list[str]], level: float) -> list[str]:
    """Per grid point with records, which runs have reached ``level`` on ``ood`` (the task's
    ``PaperColumn.past_plateau``) and at which evaluation first; the others' updates and OOD so far."""
    column = paper_column(found.task)
    metric, title = column.metric, column.title.removesuffix(" (%)")
    by_point = {
        key: with_records
        for key, specs in found.by_point.items()
        if (with_records := [spec for spec in specs if spec.name in found.loaded])
    }
    if not by_point:
        return []
    keys = ", ".join(k.split(".")[-1] for k in found.sweep.axis_keys())
    lines = [
        f"Leaving the plateau: the first evaluation at which each run's {title} reached {100 * level:g}% "
        "(above every plateau this task's runs were seen to sit on); the runs that have not, with their updates "
        "and OOD so far:",
        "",
        f"| row | {keys} | reached it (of the runs with records) | first at (seed: updates) "
        "| not yet (seed: OOD % at updates) |",
        "|---|---|---|---|---|",
    ]
    for (row, point), specs in by_point.items():
        reached, not_yet = [], []
        for spec in specs:
            run = found.loaded[spec.name]
            ood = list(zip(*run.curve("ood", metric), strict=True))
            if (step := first_reaching(ood, level)) is not None:
                reached.append(f"{spec.seed}: {step:,}")
            elif ood:
                last_step, last = max(ood)
                where = "the end" if spec.name in found.done else f"{last_step:,}"
                not_yet.append(f"{spec.seed}: {100 * last:.1f} at {where}")
            else:
                not_yet.append(f"{spec.seed}: no evaluation yet")
        lines.append(
            f"| {row} | {', '.join(cells(row, point))} | {len(reached)} of {len(specs)} | "
            f"{'; '.join(reached) or '-'} | {'; '.join(not_yet) or '-'} |"
        )
    return [*lines, ""]


def _updates_reached(run: RunRecord) -> int:
    """The newest checkpoint's step (what a resumed run continues from), else the last logged step."""
    step = checkpoint_step(run.path)
    return step if step is not None else max((m["step"] for m in run.metrics), default=0)


def point_cells(sweep: Sweep) -> Callable[[str, tuple], list[str]]:
    """The cells of a grid point of a row, one per axis of the sweep (``Sweep.axis_keys``)."""
    grid_keys = sweep.axis_keys()
    fixed = {row: sweep.row_values(row) for row in sweep.rows}

    def cells(row: str, point: tuple) -> list[str]:
        # a row without another row's own axis (its grid:) shows the value its runs have there
        values = {**fixed[row], **dict(point)}
        return [str(values[k]) for k in grid_keys]

    return cells


def across_figures(found: SweepResults, figures: Path) -> list[str]:
    """For a sweep with ``across`` keys: one figure per setting of the others that has a finished point, the OOD
    metric (mean +- s.e.) of each row against the first key, and the paper's Table A1 value at each planned
    point that is its setting (run or not); the markdown lines that show them."""
    sweep = found.sweep
    if not sweep.across:
        return []
    x_key, rest = sweep.across[0], sweep.across[1:]
    title = paper_column(found.task).title
    panels: dict[tuple, tuple[dict, dict]] = {}
    for r in found.rows:
        if r.ood is None:
            continue
        setting = dict(r.across)
        series, paper = panels.setdefault(tuple((k, setting[k]) for k in rest), ({}, {}))
        xs, means, ses = series.setdefault(r.row, ([], [], []))
        xs.append(setting[x_key])
        means.append(r.ood[0])
        ses.append(r.ood[1])
    for (row, point), value in found.paper.items():  # the paper's value, also where ours is not run yet
        setting = dict(point)
        panel = tuple((k, setting[k]) for k in rest)
        if panel in panels:
            panels[panel][1][row] = (setting[x_key], *value)
    lines = []
    for panel, (series, paper) in sorted(panels.items()):
        at = "".join(f", {k.split('.')[-1]} {v}" for k, v in panel)
        name = f"{sweep.name}_{x_key.split('.')[-1]}" + "".join(f"_{k.split('.')[-1]}{v}" for k, v in panel)
        sweep_plot(series, x_key, title, figures / f"{name}.png", f"{sweep.name}{at}", paper)
        lines += [f"![{sweep.name}: {title} against {x_key}{at}]({figures.name}/{name}.png)", ""]
    return lines


def chosen_table(found: SweepResults) -> list[str]:
    """A sweep's main table: per row the chosen grid point, ours beside the paper (``paper.md``, and the
    docs' results page, which is ``paper.md``; ``make test`` checks it against the records)."""
    cells, what = point_cells(found.sweep), paper_column(found.task).title
    keys = found.sweep.axis_keys()
    chosen = "at" if set(keys) <= set(found.sweep.across) else "chosen"  # nothing to choose: a figure's points
    head = f"| row | seeds done | {chosen} " + ", ".join(k.split(".")[-1] for k in keys)
    table = [
        head + f" | test (ID) | ours: {what} | paper | agree within 2 s.e. (diff) | chosen among |",
        "|" + "---|" * 8,
    ]
    for r in found.rows:
        if r.ood is None:
            table.append(f"| {r.row} | 0 | {r.status} | - | - | {_fmt(r.paper)} | - | - |")
            continue
        chosen = ", ".join(cells(r.row, r.point)) or "-"
        table.append(
            f"| {r.row} | {seeds_cell(r)} | {chosen} | {_fmt(r.test)} | {_fmt(r.ood)} | {_fmt(r.paper)} | "
            f"{agreement(r.ood, r.paper, r.seeds)} | {points_cell(r)} |"
        )
    return table


def seeds_cell(r: RowResult) -> str:
    """The finished seeds, and how many of them trained partly on a GPU."""
    return f"{r.seeds} ({r.partly_gpu} partly on GPU)" if r.partly_gpu else str(r.seeds)


def points_cell(r: RowResult) -> str:
    """Among how many grid points, of those the sweep plans, the row's point was chosen, and how many more have
    a finished seed but too few to be compared."""
    fewer = f" ({r.points_with_fewer_seeds} more with fewer seeds)" if r.points_with_fewer_seeds else ""
    return f"{r.points_compared} of {r.points_planned} points{fewer}"


def sweep_section(sweep: Sweep, root: Path, figures: Path, latents: int = LATENT_PROBLEMS) -> str:
    """The markdown section of one sweep (and its figure under ``figures``)."""
    found = sweep_results(sweep, root)
    task, loaded, done = found.task, found.loaded, found.done
    metric = paper_column(task).metric
    commits, devices, wall, unfinished = _made_by(root / sweep.name)
    untimed = f" (not counting {unfinished} pieces still training or killed before their end)" if unfinished else ""
    lines = [
        f"## {sweep.name}",
        "",
        f"Command: `hyla sweep {sweep.name}` (`src/hyla/configs/sweeps/{sweep.name}.yaml`; records in "
        f"`{root / sweep.name}/`), then `hyla report --paper`. {len(done)} of {len(sweep.runs())} runs "
        f"finished, {len(loaded) - len(done)} in progress.",
        f"Commits: {', '.join(sorted(commits)) or '-'}. Devices: {'; '.join(sorted(devices)) or '-'}. "
        f"Training wall time so far: {wall / 3600:.2f} h{untimed}.",
        "",
    ]
    grid_keys = sweep.axis_keys()
    cells = point_cells(sweep)
    table = chosen_table(found)
    all_points = ["| row | " + " | ".join(k.split(".")[-1] for k in grid_keys) + " | seeds done | test | ood |"]
    all_points.append("|" + "---|" * (len(grid_keys) + 4))
    for row, point, n, planned, test, ood in found.points:
        values = " | ".join(cells(row, point))
        all_points.append(f"| {row} | {values} | {n}/{planned} | {_fmt(test)} | {_fmt(ood)} |")
    chosen_runs = [
        (r.row + "".join(f" {k.split('.')[-1]} {v}" for k, v in r.across), run)
        for r in found.rows
        if r.ood is not None
        for run in r.runs
    ]
    in_progress = [run for name, run in loaded.items() if name not in done]
    for run in in_progress:
        chosen_runs.append((run.label.split("-")[0] + " (in progress)", run))
    lines += [*table, ""]
    if chosen_runs:
        figure = figures / f"{sweep.name}_ood.png"
        learning_curves(
            [run for _, run in chosen_runs],
            metric,
            ["test", "ood"],
            figure,
            f"{sweep.name}: {metric} over training (chosen grid point per row; in-progress runs too)",
            groups=[label for label, _ in chosen_runs],
        )
        lines += [f"![{sweep.name}: OOD over training]({figure.parent.name}/{figure.name})", ""]
    lines += across_figures(found, figures)
    lines += ["Every grid point (final evaluation, mean +- s.e. over the finished seeds, in %):", ""]
    lines += [*all_points, ""]
    lines += matched_updates(found, cells, metric)
    if (level := paper_column(task).past_plateau) is not None:
        lines += plateau_exits(found, cells, level)
    trained: dict[str, list[RunRecord]] = {}
    for label, run in chosen_runs:
        if run.path.name in done and has_trained_weights(run.path):
            trained.setdefault(label, []).append(run)
    if trained and latents:
        section, names, results = latent_section(
            trained, {k: k for k in trained}, figures, latents, 1000, figure_prefix=f"{sweep.name}_"
        )
        lines += ["### The latent code of the trained models", "", *section, ""]
        lines += [*figure_lines(results, names, f"{figures.name}/"), ""]
    return "\n".join(lines)


#: the README's generated table sits between these lines (``hyla report --readme-table --out README.md``)
README_BEGIN = "<!-- paper-table:begin (generated by `hyla report --readme-table --out README.md`; do not edit) -->"
README_END = "<!-- paper-table:end -->"
#: the Table A1 sweeps the README's table reads, in the paper's column order
README_SWEEPS = ("table_a1_fuzzy", "table_a1_sraven")
TASK_TITLES = {"fuzzy_logic": "fuzzy logic", "sraven": "SRAVEN"}


def readme_table(root: Path) -> str:
    """The README's paper-vs-ours table: every Table A1 cell with a finished seed (row chosen as in
    ``paper.md``), the paper's value, agreement within 2 s.e. and seeds; then the rows not run yet."""
    from hyla.attention.config import PRESET_TITLES

    lines = [
        "| Table A1 row | task: OOD metric | ours (%) | paper (%) | agree within 2 s.e. | seeds | chosen among |",
        "|---|---|---|---|---|---|---|",
    ]
    missing = []
    for name in README_SWEEPS:
        found = sweep_results(load_sweep(name), root)
        task = TASK_TITLES.get(found.task, found.task)
        what = f"{task}: {paper_column(found.task).title.removesuffix(' (%)')}"
        for r in found.rows:
            if r.ood is None:
                continue
            preset = r.row.removesuffix("_moe")
            title = PRESET_TITLES.get(preset, preset) + (" + MoE" if r.row.endswith("_moe") else "")
            lines.append(
                f"| {title} | {what} | {_fmt(r.ood)} | {_fmt(r.paper)} | {agreement(r.ood, r.paper, r.seeds)} "
                f"| {seeds_cell(r)} | {points_cell(r)} |"
            )
        missing.append(f"{sum(r.ood is None for r in found.rows)} of {len(found.rows)} {task} rows")
    lines += ["", f"Not run yet: {', '.join(missing)}; every row and grid point: `hyla report --paper`."]
    return "\n".join(lines)


def replace_readme_table(text: str, table: str) -> str:
    """``text`` with the part between ``README_BEGIN`` and ``README_END`` replaced by ``table``."""
    if text.count(README_BEGIN) != 1 or text.count(README_END) != 1:
        raise ValueError(f"the README needs one line {README_BEGIN!r} and one {README_END!r} to put the table in")
    head, rest = text.split(README_BEGIN)
    _, tail = rest.split(README_END)
    return f"{head}{README_BEGIN}\n{table}\n{README_END}{tail}"


def paper_report(
    out: Path,
    root: Path,
    sweeps: list[str] | None = None,
    latents: int = LATENT_PROBLEMS,
) -> str:
    """Write ``out/paper.md`` (figures in ``out/paper/``) and return its text."""
    figures = out / "paper"
    figures.mkdir(parents=True, exist_ok=True)
    parts = [
        "# Ours beside the paper: Table A1 and Fig. 2C",
        "",
        f"Generated by `hyla report --paper --out {out} --sweep-root {root}` from the sweep records in `{root}/` "
        "(each run's `made_by.jsonl` names the commit, machine and device that trained it). The paper "
        "configs follow the authors' code (`src/hyla/configs/fuzzy_logic.yaml`, "
        "`src/hyla/configs/sraven.yaml`). Each row's "
        "grid point is chosen by its in-distribution validation metric (split `test`, final evaluation, among "
        "the points with the most finished seeds), never by OOD; every grid point is listed below its table. "
        "'agree' compares ours with the paper within two combined standard errors (needs >= 2 finished seeds).",
        "",
    ]
    follow_ups = [name for name in FOLLOW_UP_SWEEPS if (root / name).is_dir()]
    for name in sweeps or [*PAPER_SWEEPS, *follow_ups]:
        parts.append(sweep_section(load_sweep(name), root, figures, latents))
    text = "\n".join(parts)
    (out / "paper.md").write_text(text)
    return text
