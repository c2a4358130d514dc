"""The GPU queue (``lab/gpu/gpu_paper.sh``): its stages in the developers' order, the ``hyla sweep``
arguments of each, and the plan of the next device call (the stacks, runs and projected minutes) from the
last measured GPU rates, printed without a GPU.

Stages, in order: ``smoke`` (a minute of stacks on a GPU, until stacks have been measured there),
``throughput`` (steps/s against stack size, peak memory and the authors' updates/s in the same call, until
``lab/tables/gpu_throughput.json`` exists), ``sraven-selected`` (SRAVEN HYLA at the selected point, lr 3e-4,
wd 0.3, warmup 1000, seeds 0-2), ``sraven-selected-softmax`` (softmax there, seed 0), ``sraven-softmax-chosen``
(softmax's seeds 0-2 at the grid point its row's seed-0 runs choose, once the one at the selected point is
finished), ``authors`` (their code at the selected point), ``fuzzy`` (Table A1, fuzzy logic) and
``sraven-rest`` (the other SRAVEN runs). Two more for the older drivers: ``sraven-hyla`` and ``sraven-main``.
The stacks are the one planner's (:func:`hyla.sweep.groups.plan_sweep`); the minutes are
:func:`hyla.sweep.estimate.seconds_left` at the measured rates.

    python lab/gpu/gpu_queue.py plan [--minutes 9] [--stages ...] [--root lab/runs] [--rates FILE] [--max-stack R]
    python lab/gpu/gpu_queue.py args STAGE [--root R] [--sraven S]  # the stage's `hyla sweep` arguments, one a
                                              # line; exit 3 with the reason when its point is not chosen yet
    python lab/gpu/gpu_queue.py check STAGE... # exit 2 naming the first unknown stage
    python lab/gpu/gpu_queue.py left [--root R] [--fuzzy F] [--sraven S]  # the sweeps' names, their runs not done
    python lab/gpu/gpu_queue.py authors-flags [--given FLAGS] | authors-logs   # the authors stage's point
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from hyla.analysis.selection import sweep_results
from hyla.sweep.cli import parse_where
from hyla.sweep.estimate import seconds_left
from hyla.sweep.groups import plan_sweep, states_and_pending
from hyla.train.config import ExperimentConfig
from hyla.train.run.folder import read_pieces, run_state
from hyla.train.sweeps import SWEEP_MAX_STACK, Sweep, load_sweep

#: the selected SRAVEN point (lab/findings.md: the probe at lr 3e-4, wd 0.3 left its plateau)
SELECTED_POINT = ("train.lr=0.0003", "train.weight_decay=0.3", "train.warmup_steps=1000")
SELECTED = (*SELECTED_POINT, "seed=0,1,2")

#: our keys of SELECTED -> the flags of the authors' configs/raven.py that set the same
AUTHORS_FLAGS = {
    "train.lr": "--config.lr",
    "train.weight_decay": "--config.weight_decay",
    "train.warmup_steps": "--config.warmup_steps",
}


def _selected_values() -> dict[str, str]:
    """SELECTED_POINT as ``{key: value}`` (one value each: a point, not a grid)."""
    return {key: values[0] for key, values in parse_where(list(SELECTED_POINT)).items()}


def authors_flags(given: str = "") -> list[str]:
    """The authors' driver flags of the selected point (``--config.lr=0.0003``, ...), less the keys that the
    flags ``given`` already set: their flag parser refuses a key given twice, so ``given`` wins."""
    named = {flag.split("=", 1)[0] for flag in given.split()}
    point = _selected_values()
    return [f"{flag}={point[key]}" for key, flag in AUTHORS_FLAGS.items() if flag not in named]


def _short(value: str) -> str:
    """0.0003 -> "3e-4", 0.3 -> "0.3": the shorter of the plain and the exponent spelling of the same number."""
    plain = f"{float(value):g}"
    exponent = f"{float(value):.0e}".replace("e-0", "e-").replace("e+0", "e")
    return exponent if len(exponent) < len(plain) and float(exponent) == float(value) else plain


def authors_logs() -> str:
    """Where the ``authors`` stage writes their logs: one folder per selected point,
    ``lab/tables/gpu_sraven_verdict/authors_lr3e-4_wd0.3`` for SELECTED."""
    point = _selected_values()
    lr, wd = (_short(point[key]) for key in ("train.lr", "train.weight_decay"))
    return f"lab/tables/gpu_sraven_verdict/authors_lr{lr}_wd{wd}"


@dataclass(frozen=True)
class Stage:
    """One stage of the queue: a sweep (``sweep`` "fuzzy" or "sraven", ``only`` rows, ``where`` filters, more
    ``overrides``) or a fixed-budget job (``minutes``) that the script runs itself."""

    name: str
    sweep: str | None = None
    only: tuple[str, ...] = ()
    where: tuple[str, ...] = ()
    minutes: float = 0.0
    what: str = ""
    overrides: tuple[str, ...] = ()
    #: at the grid point its one row's seed-0 runs choose (:func:`chosen_point`) rather than a fixed one;
    #: ``where`` then holds only the seeds
    at_chosen_point: bool = False
    #: its records also train on CPUs (issue #48's background runs): the plan says to stop those first
    trained_on_cpus_too: bool = False


class NotChosenYet(Exception):
    """A stage at the chosen point whose point cannot be chosen yet (the message says why)."""


STAGES = (
    Stage(
        "smoke",
        minutes=1.0,
        what="a stack of 3 seeds a task, 300 steps at the paper sizes: the first time stacks run on a GPU",
    ),
    Stage("throughput", minutes=4.0, what="steps/s vs stack size 1,4,12,24, peak memory, authors' updates/s"),
    # issue #48: evaluations every 2,500 updates, so that when a run leaves its plateau is visible; softmax's
    # seeds 1 and 2 at HYLA's point only once that point leads softmax's row by the report's rule (then in
    # sraven-rest), so its seed 0 alone here
    Stage(
        "sraven-selected",
        "sraven",
        ("hyla",),
        SELECTED,
        overrides=("train.eval_every=2500",),
        trained_on_cpus_too=True,
    ),
    Stage(
        "sraven-selected-softmax",
        "sraven",
        ("softmax",),
        (*SELECTED_POINT, "seed=0"),
        overrides=("train.eval_every=2500",),
        trained_on_cpus_too=True,
    ),
    # the headline compares rows at their chosen points over three seeds each: softmax's seeds go where its
    # seed-0 runs point (lr 1e-3 led softmax's row while the selected point's run was at 60,000 updates)
    Stage(
        "sraven-softmax-chosen",
        "sraven",
        ("softmax",),
        ("seed=0,1,2",),
        at_chosen_point=True,
        trained_on_cpus_too=True,
    ),
    Stage("authors", minutes=0.0, what="the authors' HYLA seeds 0-2 and softmax seed 0 at the selected point"),
    Stage("fuzzy", "fuzzy"),
    Stage("sraven-rest", "sraven"),
    Stage("sraven-hyla", "sraven", ("hyla",)),
    Stage("sraven-main", "sraven", ("softmax", "linear", "hyla")),
)
#: smoke and throughput run when named: stacks first ran on a GPU on 2026-11-27, slower per run than lone runs,
#: and sweeps train each run alone (lab/tables/gpu_queue/2026-11-27)
DEFAULT_STAGES = (
    "sraven-selected",
    "sraven-selected-softmax",
    "sraven-softmax-chosen",
    "authors",
    "fuzzy",
    "sraven-rest",
)

#: one lone run on one H100 with train.fast and train.graph_step (lab/tables/gpu_h100.md): steps/s, and the
#: seconds of a full schedule's evaluations (SRAVEN 0.4 min of 5.0; fuzzy logic 0.68 min in all at 1,747/s)
LONE_H100 = {"sraven": (567.0, 24.0), "fuzzy_logic": (1747.0, 0.68 * 60 - 50_000 / 1747.0)}
#: the measured rates the throughput stage writes: {"device": ..., "tasks": {task: {"R": stack steps/s}}}
RATES_FILE = Path("lab/tables/gpu_throughput.json")
#: the paper's run records, which the queue trains on
RECORD_ROOT = Path("lab/runs")


def stage_named(name: str) -> Stage:
    """The stage ``name``; an unknown one is a ``ValueError`` naming the allowed ones."""
    for stage in STAGES:
        if stage.name == name:
            return stage
    raise ValueError(f"unknown stage {name!r}; allowed: {', '.join(s.name for s in STAGES)}")


def chosen_point(sweep: Sweep, row: str, root: Path) -> tuple[str, ...]:
    """``key=value`` of the grid point of ``row`` that the paper report's rule chooses among the row's finished
    seed-0 runs (records in ``root / NAME``; the rule: in-distribution test accuracy, never OOD,
    :func:`hyla.analysis.selection.sweep_results`). One seed at each point, so no point wins on its number of
    finished seeds. Raises :class:`NotChosenYet` until the row's run at :data:`SELECTED_POINT`, seed 0, is
    finished: softmax's seeds 1-2 go to the selected point only if its own seed 0 leads there."""
    selected = sweep.runs([row], parse_where([*SELECTED_POINT, "seed=0"]))
    if any(run_state(root / sweep.name / s.name) != "done" for s in selected):
        raise NotChosenYet(f"{row} at the selected point ({', '.join(s.name for s in selected)}) is not finished yet")
    one_seed = dataclasses.replace(sweep, rows={row: sweep.rows[row]}, seeds=[0])
    (result,) = sweep_results(one_seed, root).rows
    return tuple(f"{key}={value}" for key, value in result.point)


def stage_where(stage: Stage, root: Path, sweep: Sweep) -> tuple[str, ...]:
    """The stage's ``--where`` filters in ``sweep`` (its loaded sweep file): its own, after the chosen point for a
    stage :attr:`Stage.at_chosen_point` (may raise :class:`NotChosenYet`)."""
    if not stage.at_chosen_point:
        return stage.where
    if len(stage.only) != 1:
        raise ValueError(f"stage {stage.name}: a chosen point needs one row")
    return (*chosen_point(sweep, stage.only[0], root), *stage.where)


def sweep_arguments(stage: Stage, where: tuple[str, ...] | None = None) -> list[str]:
    """The stage's ``--only``, ``--where`` (``where``, else its own) and ``--override`` arguments of ``hyla sweep``
    (after its sweep file)."""
    out = ["--only", ",".join(stage.only)] if stage.only else []
    for item in stage.where if where is None else where:
        out += ["--where", item]
    for item in stage.overrides:
        out += ["--override", item]
    return out


def read_rates(path: Path) -> dict[str, dict[int, float]]:
    """Measured stack steps/s by task and stack size from ``path`` (none if it is absent)."""
    if not path.is_file():
        return {}
    tasks = json.loads(path.read_text()).get("tasks", {})
    return {task: {int(r): float(v) for r, v in sizes.items()} for task, sizes in tasks.items()}


def stack_rate(task: str, size: int, rates: dict[str, dict[int, float]]) -> tuple[float, str]:
    """Steps/s of a stack of ``size`` runs of ``task`` and where the number comes from: the measured stack
    of the largest size <= ``size`` (its run-steps/s spread over ``size`` runs), else the lone H100 run's
    rate with no gain from stacking (``size`` runs one after another: an upper bound on the minutes)."""
    measured = rates.get(task, {})
    below = [r for r in measured if r <= size]
    if below:
        r = max(below)
        return measured[r] * r / size, f"measured stack of {r}"
    if task not in LONE_H100:
        raise ValueError(f"no GPU rate for task {task!r}: measure it (stage throughput) or add it to LONE_H100")
    return LONE_H100[task][0] / size, "one lone H100 run, no stacking gain"


def stack_seconds(cfgs: list[ExperimentConfig], from_step: int, rates: dict[str, dict[int, float]]) -> float:
    """Projected seconds for a stack of ``cfgs`` from ``from_step`` to its end (evaluations included, at the
    lone run's measured share for each run)."""
    task = cfgs[0].data.task
    rate, _ = stack_rate(task, len(cfgs), rates)
    evals = -(-cfgs[0].train.steps // cfgs[0].train.eval_every)
    eval_s = LONE_H100.get(task, (0.0, 0.0))[1] / evals * len(cfgs)
    return seconds_left(cfgs[0], 1 / rate, eval_s, from_step)


def unfinished_pieces(run_dir: Path) -> str | None:
    """A warning when the run's last piece never recorded its end: another machine may still be training it,
    and a GPU piece from its last checkpoint would fork the record."""
    pieces = read_pieces(run_dir)
    if pieces and pieces[-1].get("ended") is None:
        last = pieces[-1]
        return (
            f"!!! {run_dir.name}: its piece from step {last.get('from_step')} on {last.get('machine', '?')} "
            f"({last.get('date', '?')}) never ended: if that machine still trains it, stop it there (SIGTERM "
            "saves a checkpoint) and bring that checkpoint here first, or the two records fork"
        )
    return None


def plan(
    stages: list[str],
    minutes: float,
    root: Path,
    sweeps: dict[str, str],
    rates_path: Path,
    max_stack: int = SWEEP_MAX_STACK,
) -> list[str]:
    """The lines of the next call's plan: per stage its stacks (runs, steps left, projected minutes) and
    whether they fit the ``minutes`` of the call, in the order they would train."""
    rates = read_rates(rates_path)
    lines, used = [], 0.0
    source = f"measured rates from {rates_path}" if rates else "no stack measured yet: lone H100 rates, no gain"
    lines.append(f"plan of the next call: {minutes:g} min, stages {' '.join(stages)} ({source})")
    for name in stages:
        stage = stage_named(name)
        if stage.sweep is None:
            skip = name in ("smoke", "throughput") and bool(rates)
            if skip or stage.minutes == 0:
                why = "measured already" if skip else "its own budget (AUTHORS_MINUTES), not planned here"
                lines.append(f"== {name}: {why}")
                continue
            fits = "fits" if used + stage.minutes <= minutes else "over the budget"
            used += stage.minutes
            lines.append(f"== {name}: {stage.minutes:.1f} min ({stage.what}); {fits}")
            continue
        sweep = load_sweep(sweeps[stage.sweep])
        try:
            where = stage_where(stage, root, sweep)
        except NotChosenYet as waits:
            lines.append(f"== {name}: waits: {waits}")
            continue
        specs = sweep.runs(list(stage.only) or None, parse_where(list(where)))
        sweep_root = root / sweep.name
        states, pending = states_and_pending(specs, sweep_root)
        lines.append(f"== {name}: {sweep.name}, {len(pending)} of {len(specs)} runs to train")
        if stage.trained_on_cpus_too and pending:
            lines.append(
                "!!! stop every CPU run of these records first and commit its newest checkpoint: a GPU piece "
                "beside a CPU one forks the record"
            )
        for warning in filter(None, (unfinished_pieces(sweep_root / s.name) for s in pending)):
            lines.append(warning)
        later = [0, 0, 0.0]  # stacks, runs and minutes after this call: one line for them all
        for group in plan_sweep(pending, sweep.configs, states, sweep_root, max_stack=max_stack):
            step = group.resume_from or 0
            seconds = stack_seconds(list(group.cfgs), step, rates)
            left = max(minutes - used, 0.0)
            used += seconds / 60
            if not left:
                later = [later[0] + 1, later[1] + len(group.names), later[2] + seconds / 60]
                continue
            rate, why = stack_rate(group.cfgs[0].data.task, len(group.cfgs), rates)
            fits = "fits" if seconds / 60 <= left else f"{left:.1f} min of it this call"
            lines.append(
                f"  stack of {len(group.names)} ({group.cfgs[0].model.attention}, from step {step}): "
                f"{seconds / 60:.1f} min at {rate:.0f} steps/s ({why}); {fits}"
            )
            lines.append(f"    {', '.join(group.names)}")
        if later[0]:
            lines.append(f"  later calls: {later[0]} more stacks, {later[1]} runs, {later[2]:.1f} min")
    lines.append(f"projected: {used:.1f} min of work for these stages; the call has {minutes:g} (compile not counted)")
    return lines


def runs_left(root: Path, sweeps: dict[str, str]) -> tuple[list[str], list[Path]]:
    """The sweeps' names and the folders of their runs not done yet (``root/NAME/RUN``), in sweep order."""
    names, left = [], []
    for file in sweeps.values():
        sweep = load_sweep(file)
        names.append(sweep.name)
        left += [root / sweep.name / s.name for s in states_and_pending(sweep.runs(), root / sweep.name)[1]]
    return names, left


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python lab/gpu/gpu_queue.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    pl = sub.add_parser("plan", help="print the next call's stacks, runs and projected minutes")
    pl.add_argument("--minutes", type=float, default=9.0, help="the call's budget (default 9)")
    pl.add_argument("--stages", default=" ".join(DEFAULT_STAGES), help="space-separated stage names, in order")
    pl.add_argument("--rates", default=str(RATES_FILE), help=f"measured GPU rates (default {RATES_FILE})")
    pl.add_argument("--max-stack", type=int, default=SWEEP_MAX_STACK, help="as hyla sweep's --max-stack")
    le = sub.add_parser("left", help="'sweep NAME' for each sweep, then 'left FOLDER' for each run not done")
    ar = sub.add_parser(
        "args", help="a stage's sweep, then its `hyla sweep` arguments, one a line; exit 3 if its point waits"
    )
    ar.add_argument("stage")
    for sp in (pl, le, ar):
        sp.add_argument("--root", default=str(RECORD_ROOT), help="where the sweep records are (default lab/runs)")
        sp.add_argument("--fuzzy", default="table_a1_fuzzy", help="the fuzzy-logic sweep file")
        sp.add_argument("--sraven", default="table_a1_sraven", help="the SRAVEN sweep file")
    ch = sub.add_parser("check", help="exit 2 naming the first unknown stage (one process for all of them)")
    ch.add_argument("stages", nargs="*")
    au = sub.add_parser("authors-flags", help="the authors' driver flags of the selected point, one line")
    au.add_argument("--given", default="", help="their flags already given (AUTHORS_EXTRA): these keys are left out")
    sub.add_parser("authors-logs", help="the folder of the authors stage's logs at the selected point")
    sub.add_parser("stages", help="the default stages, in order, one line")
    args = p.parse_args(argv)
    try:
        if args.what == "authors-flags":
            print(" ".join(authors_flags(args.given)))
            return 0
        if args.what == "stages":
            print(*DEFAULT_STAGES)
            return 0
        if args.what == "authors-logs":
            print(authors_logs())
            return 0
        if args.what == "check":
            for name in args.stages:
                stage_named(name)
            return 0
        if args.what == "left":
            names, left = runs_left(Path(args.root), {"fuzzy": args.fuzzy, "sraven": args.sraven})
            print("\n".join([*(f"sweep {name}" for name in names), *(f"left {path}" for path in left)]))
            return 0
        if args.what == "args":
            stage = stage_named(args.stage)
            if stage.sweep is None:
                print("-")
                return 0
            sweep = load_sweep({"fuzzy": args.fuzzy, "sraven": args.sraven}[stage.sweep])
            try:
                where = stage_where(stage, Path(args.root), sweep)
            except NotChosenYet as waits:
                print(f"stage {stage.name} waits: {waits}")
                return 3
            print("\n".join([stage.sweep, *sweep_arguments(stage, where)]))
            return 0
        if not args.minutes > 0:
            raise ValueError(f"--minutes must be > 0, got {args.minutes}")
        stages = args.stages.split()
        for name in stages:
            stage_named(name)
        sweeps = {"fuzzy": args.fuzzy, "sraven": args.sraven}
        print("\n".join(plan(stages, args.minutes, Path(args.root), sweeps, Path(args.rates), args.max_stack)))
    except ValueError as err:
        print(f"gpu queue: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
