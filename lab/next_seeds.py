"""Which grid points of a sweep's rows earn seeds beyond seed 0: the point the report chooses for the row
(``sweep_results``: the most finished seeds, then the in-distribution validation metric, split ``test``, never OOD)
once no seed 0 of the row is still training, and the points whose finished seed 0 beats the chosen point's seed 0 by
that metric, unless the seeds such a point has finished already keep it below the chosen point's final mean even if
its missing seeds all scored 100%. Prints one ``hyla sweep`` command per such point: the chosen point's missing
seeds, another point's next missing seed only (so that the rule is asked again once that seed has finished). A grid
searched at seed 0 first grows its seeds only at the chosen point and where a point could still take over the row.

    python lab/next_seeds.py                                     # Table A1 fuzzy's ablation rows, lab/runs
    python lab/next_seeds.py --sweep table_a1_fuzzy --rows hyla_plus --root lab/runs
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from hyla.analysis.selection import SweepResults, final_value, paper_column, sweep_results
from hyla.train.sweeps import RunSpec, load_sweep

LAB = Path(__file__).resolve().parent
#: the test metrics (R^2, accuracy) in %: no missing seed can score above it
METRIC_CEILING = 100.0
#: the ablation rows of Table A1, whose points beyond lr 1e-3 / wd 0.1 run at seed 0 first
ABLATION_ROWS = (
    "linear_rmshead",
    "hyla_no_rmshead",
    "hyla_no_nonlinearity",
    "hyla_no_nonlinearity_no_rmshead",
    "hyla_softmax",
)


@dataclass
class Candidate:
    row: str
    point: tuple
    seed0: float
    incumbent: float
    missing: list[int]
    #: the row's chosen point itself (its seed 0 is the incumbent)
    chosen: bool = False


def _seed0(found: SweepResults, row: str, point: tuple) -> float | None:
    metric = paper_column(found.task).metric
    for spec in found.by_point[(row, point)]:
        if spec.seed == 0 and spec.name in found.done:
            return final_value(found.loaded[spec.name], "test", metric)
    return None


def _missing(found: SweepResults, specs: list[RunSpec]) -> list[int]:
    return [s.seed for s in specs if s.name not in found.done]


def _best_case_mean(found: SweepResults, row: str, point: tuple) -> float:
    """The point's test mean over its planned seeds (from the report's grid-point line) if every missing seed
    scored ``METRIC_CEILING``."""
    done, planned, test = next((n, m, t) for r, p, n, m, t, _ in found.points if (r, p) == (row, point))
    return ((test[0] * done if test else 0.0) + METRIC_CEILING * (planned - done)) / planned


def candidates(found: SweepResults, rows: tuple[str, ...]) -> list[Candidate]:
    """Per row (and setting of the sweep's ``across`` keys): the point the report chose (among equally seeded
    points, the one with the better test mean), for the seeds it lacks, once none of the row's seed 0 runs is still
    training (one that finishes could take the choice over); then the points whose finished seed 0 beats its and
    which could still overtake the chosen point's mean once that point has all its seeds (their next seed only)."""
    out = []
    for result in found.rows:
        if result.row not in rows or not result.point or (best := _seed0(found, result.row, result.point)) is None:
            continue
        points = [
            (point, specs)
            for (row, point), specs in found.by_point.items()
            if row == result.row and set(result.across) <= set(point)
        ]
        training = [s for _, specs in points for s in specs if s.seed == 0 and s.name in found.loaded]
        chosen_missing = _missing(found, found.by_point[(result.row, result.point)])
        if chosen_missing and all(s.name in found.done for s in training):
            out.append(Candidate(result.row, result.point, best, best, chosen_missing, chosen=True))
        for point, specs in points:
            if point == result.point:
                continue
            if (value := _seed0(found, result.row, point)) is None or value <= best:
                continue
            if (
                not chosen_missing
                and result.test is not None
                and _best_case_mean(found, result.row, point) <= result.test[0]
            ):
                continue
            if missing := _missing(found, specs):
                # one seed at a time: its result can end the point's claim to the next
                out.append(Candidate(result.row, point, value, best, missing[:1]))
    return out


def command(sweep: str, c: Candidate) -> str:
    """The ``hyla sweep`` line that trains the point's missing seeds (``sweep`` as given: a name or a file; keys as
    the sweep file names them)."""
    where = " ".join(f"--where {key}={value}" for key, value in c.point)
    seeds = ",".join(str(s) for s in c.missing)
    return f"hyla sweep {sweep} --only {c.row} {where} --where seed={seeds}"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sweep", default="table_a1_fuzzy", help="a packaged sweep's name or a sweep file")
    p.add_argument("--rows", default=",".join(ABLATION_ROWS), help="comma-separated rows of the sweep")
    p.add_argument("--root", type=Path, default=LAB / "runs", help="where the sweep's records are")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    sweep = load_sweep(args.sweep)
    rows = tuple(r for r in args.rows.split(",") if r)
    unknown = [r for r in rows if r not in sweep.rows]
    if unknown:
        print(f"--rows: {', '.join(unknown)} not in {sweep.name}; its rows: {', '.join(sweep.rows)}", file=sys.stderr)
        return 2
    found = sweep_results(sweep, args.root)
    chosen = candidates(found, rows)
    for c in chosen:
        if c.chosen:
            print(f"# {c.row}: the point the report chose (seed 0 test {c.seed0:.2f}), no seed 0 of the row training")
        else:
            print(f"# {c.row}: seed 0 test {c.seed0:.2f} > {c.incumbent:.2f} at the point the report chose")
        print(command(args.sweep, c))
    if not chosen:
        print("# no point earns seeds yet (chosen points have theirs or a seed 0 still trains; no seed 0 beats them)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
