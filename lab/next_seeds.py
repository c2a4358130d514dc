"""Which grid points of a sweep's rows earn seeds beyond seed 0: the points whose finished seed 0 beats, by the
in-distribution validation metric (split ``test``, never OOD), the seed 0 of the point the report chooses for the
row (``sweep_results``: the most finished seeds, then test). Prints one ``hyla sweep`` command per such point (the
seeds it still lacks), so a grid searched at seed 0 first grows its seeds only where a point could take over the row.

    python lab/next_seeds.py                                     # Table A1 fuzzy's ablation rows, lab/runs
    python lab/next_seeds.py --sweep table_a1_fuzzy --rows hyla_plus --root lab/runs
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from hyla.analysis.selection import SweepResults, final_value, paper_column, sweep_results
from hyla.train.sweeps import load_sweep

LAB = Path(__file__).resolve().parent
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


def _seed0(found: SweepResults, row: str, point: tuple) -> float | None:
    metric = paper_column(found.task).metric
    for spec in found.by_point[(row, point)]:
        if spec.seed == 0 and spec.name in found.done:
            return final_value(found.loaded[spec.name], "test", metric)
    return None


def candidates(found: SweepResults, rows: tuple[str, ...]) -> list[Candidate]:
    """Per row (and setting of the sweep's ``across`` keys), the points whose finished seed 0 beats the seed 0 of
    the point the report chose: among equally seeded points, the one with the better test mean."""
    out = []
    for result in found.rows:
        if result.row not in rows or not result.point or (best := _seed0(found, result.row, result.point)) is None:
            continue
        for (row, point), specs in found.by_point.items():
            if row != result.row or point == result.point or not set(result.across) <= set(point):
                continue
            if (value := _seed0(found, row, point)) is None or value <= best:
                continue
            missing = [s.seed for s in specs if s.name not in found.done]
            if missing:
                out.append(Candidate(row, point, value, best, missing))
    return out


def command(sweep: str, c: Candidate) -> str:
    """The ``hyla sweep`` line that trains the point's missing seeds (keys as the sweep file names them)."""
    where = " ".join(f"--where {key}={value}" for key, value in c.point)
    seeds = ",".join(str(s) for s in c.missing)
    return f"hyla sweep {sweep} --only {c.row} {where} --where seed={seeds}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sweep", default="table_a1_fuzzy", help="a packaged sweep's name or a sweep file")
    p.add_argument("--rows", default=",".join(ABLATION_ROWS), help="comma-separated rows of the sweep")
    p.add_argument("--root", type=Path, default=LAB / "runs", help="where the sweep's records are")
    args = p.parse_args(argv)
    sweep = load_sweep(args.sweep)
    rows = tuple(r for r in args.rows.split(",") if r)
    unknown = [r for r in rows if r not in sweep.rows]
    if unknown:
        print(f"--rows: {', '.join(unknown)} not in {sweep.name}; its rows: {', '.join(sweep.rows)}", file=sys.stderr)
        return 2
    found = sweep_results(sweep, args.root)
    chosen = candidates(found, rows)
    for c in chosen:
        print(f"# {c.row}: seed 0 test {c.seed0:.2f} > {c.incumbent:.2f} at the point the report chose")
        print(command(sweep.name, c))
    if not chosen:
        print("# no point's seed 0 beats its row's chosen point yet (or none has finished)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
