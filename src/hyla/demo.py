"""``hyla demo``: what the paper found, on your CPU in minutes.

1. **The trained models, re-scored.** The runs behind the paper table's rows (at each row's grid point chosen by
   in-distribution validation, the rule of ``hyla report --paper``; its lowest seed with weights) are loaded
   from their records (``--records``) and scored on fresh held-out problems (a generator seed no evaluation
   of theirs used), beside their records' own final numbers and the paper's. Skipped, with a line, where the
   records hold no weights (an installed wheel ships the records' configs and metrics only).
2. **A short run.** Table A1's fuzzy-logic softmax and HYLA at the paper's grid point, seed 0, trained from
   their records' configs (the 50,000-step schedule, stopped after ``--steps``; one thread each, at most one
   run per core at a time). The report checks that this machine reproduces each record's training curve,
   scores the stopped models, and says which variant leads at the stop and from which step the records show it.

Re-running resumes unfinished runs and reuses finished ones (``<out>/<variant>/demo_eval.json``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from hyla.analysis.plots import first_steps_beside_records
from hyla.analysis.selection import paper_column, sweep_results
from hyla.train.cli import failure_exit_code
from hyla.train.config import ExperimentConfig
from hyla.train.loop import Interrupted, NonFiniteLossError, Trainer
from hyla.train.run.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint
from hyla.train.run.folder import (
    METRICS,
    RunRecord,
    has_record,
    has_trained_weights,
    load_run_config,
    load_trained,
    read_run,
)
from hyla.train.sweeps import RECORD_ROOT, load_sweep

DEMO_VARIANTS = ("softmax", "hyla")
#: steps of the short run: the records of both variants' seed 0 first show HYLA ahead on OOD R^2 at the
#: evaluation at step 5,000 (61 against 74%), and on one thread of a 2-core CPU it takes a few minutes
DEMO_STEPS = 5000
#: the paper-table rows whose trained models part 1 re-scores, per sweep
RESCORED_ROWS = {"table_a1_fuzzy": ("softmax", "linear", "hyla"), "table_a1_sraven": ("softmax", "hyla")}
#: fresh held-out problems per model, and their generator's seed (training's: ``hyla.train.seeds.eval_split_seed``)
RESCORE_PROBLEMS, RESCORE_SEED = 8192, 20250124
DEMO_EVAL = "demo_eval.json"
#: what the report compares: the metric of the task (fuzzy logic: R^2) on held-out combinations
METRIC, SPLIT = "r2", "ood"
#: the records of the demo's runs, shipped with the package (config and metrics, copies of the committed
#: records of ``table_a1_fuzzy``), for an installed wheel run outside a clone
PACKAGED_RECORDS = Path(__file__).resolve().parent / "demo_records"


def paper_records(sweep_name: str, root: Path, variants: list[str]) -> dict[str, Path]:
    """Each variant's record folder: the sweep's first run of that row at seed 0 (its first grid point), under
    ``root``, else the package's copy (``PACKAGED_RECORDS``)."""
    sweep = load_sweep(sweep_name)
    records = {}
    for variant in variants:
        if variant not in sweep.rows:
            raise ValueError(f"--variants: {variant!r} is not a row of {sweep.name}; rows: {', '.join(sweep.rows)}")
        specs = [s for s in sweep.runs([variant]) if s.seed == 0]
        if not specs:
            raise ValueError(f"--variants: sweep {sweep.name} has no run of row {variant!r} at seed 0")
        record = root / sweep.name / specs[0].name
        if not has_record(record):  # outside a clone: the package's copy
            record = PACKAGED_RECORDS / sweep.name / specs[0].name
        if not has_record(record):
            raise ValueError(
                f"{root / sweep.name / specs[0].name}: no committed record (config.yaml, {METRICS}) to start from"
            )
        records[variant] = record
    return records


def rescore(run_dir: Path, problems: int, seed: int) -> float:
    """The run's trained model scored on ``problems`` fresh ``ood`` problems: its paper metric, in %."""
    import torch

    run = load_trained(run_dir)
    metric = paper_column(run.config.data.task).metric
    gen = torch.Generator().manual_seed(seed)
    sums: dict[str, float] = {}
    done = 0
    with torch.no_grad():
        while done < problems:
            batch = run.task.sample(min(512, problems - done), "ood", gen)
            for key, per_problem in run.task.metrics(run.model(batch.inputs).float(), batch).items():
                sums[key] = sums.get(key, 0.0) + per_problem.double().sum().item()
            done += len(batch.inputs)
    return 100 * run.task.summarize({k: v / done for k, v in sums.items()})[metric]


def rescored_table(root: Path, problems: int, seed: int) -> tuple[list[str], dict[str, dict[str, float]]]:
    """Part 1: the markdown rows of every paper-table model found under ``root`` (at its row's chosen point, the
    lowest seed with weights), re-scored; and ``{task: {row: fresh score}}`` for the summary."""
    from hyla.attention.config import PRESET_TITLES

    lines, fresh = [], {}
    for name, rows in RESCORED_ROWS.items():
        found = sweep_results(load_sweep(name), root)
        title = paper_column(found.task).title
        for result in (r for r in found.rows if r.row in rows):
            with_weights = sorted(
                (r for r in result.runs if has_trained_weights(r.path)), key=lambda r: r.config["seed"]
            )
            run = with_weights[0] if with_weights else None
            if run is None:
                continue
            final = run.final("ood") or {}
            record = 100 * final[paper_column(found.task).metric] if final else float("nan")
            score = rescore(run.path, problems, seed)
            fresh.setdefault(found.task, {})[result.row] = score
            paper = f"{result.paper[0]:.1f}" if result.paper else "-"
            point = ", ".join([*(f"{k.split('.')[-1]} {v}" for k, v in result.point), f"seed {run.config['seed']}"])
            lines.append(
                f"| {found.task} | {PRESET_TITLES.get(result.row, result.row)} ({point}) | {title} | {score:.1f} "
                f"| {record:.1f} | {paper} |"
            )
    return lines, fresh


def demo_config(record: Path, steps: int, eval_size: int) -> ExperimentConfig:
    """The record's own config; only the evaluation is smaller (it draws from its own generators, so
    training is unchanged)."""
    cfg = load_run_config(record, [f"train.eval_size={eval_size}"])
    if not 1 <= steps <= cfg.train.steps:
        raise ValueError(f"--steps must be in 1..{cfg.train.steps} (the record's schedule), got {steps}")
    return cfg


def train_and_evaluate(record: Path, run_dir: Path, steps: int, eval_size: int) -> dict[str, Any]:
    """Train the record's run to ``steps`` in ``run_dir`` (resuming, or reusing a finished demo run),
    evaluate it there; ``{"wall_s", "eval": {split: metrics}}``, also kept in ``run_dir/demo_eval.json``."""
    import torch

    torch.set_num_threads(1)  # as the records were trained: one thread per run
    cfg = demo_config(record, steps, eval_size)
    done = run_dir / DEMO_EVAL
    ckpt = latest_checkpoint(run_dir) if run_dir.exists() else None
    step = load_checkpoint(ckpt).step if ckpt is not None else 0
    if done.is_file() and step == steps:
        return {**json.loads(done.read_text()), "wall_s": 0.0}
    if step > steps:
        raise ValueError(f"{run_dir} is already at step {step}, past --steps {steps}: choose another --out")
    t0 = time.perf_counter()
    trainer = Trainer(cfg, run_dir, resume=ckpt is not None, quiet=True)
    try:
        trainer.stop_at_step = steps
        trainer.run()
        evaluation = trainer.evaluate()[0]
    finally:
        trainer.close()
    result = {"step": steps, "eval": evaluation}
    done.write_text(json.dumps(result))
    return {**result, "wall_s": time.perf_counter() - t0}


def curve_agreement(yours: RunRecord, record: RunRecord, steps: int) -> dict[str, Any]:
    """How closely your training loss follows the record's over the first ``steps``: the logged steps
    compared, how many are bit-equal and the largest relative difference."""
    mine = dict(zip(*yours.curve("train_batch", "loss")))
    theirs = {s: v for s, v in zip(*record.curve("train_batch", "loss")) if s <= steps}
    common = sorted(set(mine) & set(theirs))
    rel = [abs(mine[s] - theirs[s]) / abs(theirs[s]) for s in common]
    return {
        "steps": len(common),
        "equal": sum(mine[s] == theirs[s] for s in common),
        "max_rel": max(rel, default=float("nan")),
        "last_rel": rel[-1] if rel else float("nan"),
    }


def lead(values: dict[str, float]) -> str:
    return max(values, key=values.__getitem__)


def first_lasting_lead(records: dict[str, RunRecord], leader: str) -> int | None:
    """The first evaluation step from which ``leader`` stays ahead of every other record on OOD."""
    curves = {v: dict(zip(*run.curve(SPLIT, METRIC))) for v, run in records.items()}
    steps = sorted(set.intersection(*(set(c) for c in curves.values())))
    ahead = [all(curves[leader][s] > c[s] for v, c in curves.items() if v != leader) for s in steps]
    for i, step in enumerate(steps):
        if all(ahead[i:]):
            return step
    return None


def rescored_summary(fresh: dict[str, dict[str, float]]) -> str:
    """One sentence per task: which re-scored model leads, and by how much over softmax."""
    said = []
    for task, scores in fresh.items():
        best = lead(scores)
        over = f", {scores[best] - scores['softmax']:.1f} points above softmax" if "softmax" in scores else ""
        said.append(f"On {task}, {best} leads on fresh held-out problems ({scores[best]:.1f}%{over}).")
    return " ".join(said)


def write_report(
    out: Path,
    records: dict[str, Path],
    results: dict[str, dict],
    steps: int,
    sweep_name: str,
    eval_size: int,
    rescored: tuple[list[str], dict[str, dict[str, float]]],
    rescore_problems: int,
) -> str:
    runs = {v: read_run(out / v) for v in records}
    recs = {v: read_run(path) for v, path in records.items()}
    evals = {v: results[v]["eval"] for v in records}
    agree = {v: curve_agreement(runs[v], recs[v], steps) for v in records}
    final = {v: recs[v].final(SPLIT) for v in records}
    end = {v: final[v][METRIC] for v in records if final[v]}
    yours = {v: evals[v][SPLIT][METRIC] for v in records}
    lines = [
        f"| variant | yours at step {steps}: {SPLIT} {METRIC} (%) | loss vs record: equal steps | max rel. diff "
        f"| record at its end: {SPLIT} {METRIC} (%) | wall (s) |",
        "|---|---|---|---|---|---|",
    ]
    for v in records:
        a = agree[v]
        end_cell = f"{100 * end[v]:.1f} (step {final[v]['step']:,})" if v in end else "-"
        lines.append(
            f"| {v} | {100 * yours[v]:.1f} | {a['equal']}/{a['steps']} | {a['max_rel']:.1e} | {end_cell} "
            f"| {results[v]['wall_s']:.0f} |"
        )
    table = "\n".join(lines)
    first_steps_beside_records(out / "demo.png", runs, recs, yours, steps, SPLIT, METRIC)
    leader = lead(yours)
    ranked = ", ".join(f"{v} {100 * yours[v]:.1f}" for v in sorted(yours, key=yours.__getitem__, reverse=True))
    summary = [f"At step {steps:,} on this machine, {leader} leads on {SPLIT} {METRIC} ({ranked})."]
    if len(end) == len(records):
        winner = lead(end)
        since = first_lasting_lead(recs, winner)
        summary.append(
            f"The records end with {winner} ahead ("
            + ", ".join(f"{v} {100 * end[v]:.1f}" for v in sorted(end, key=end.__getitem__, reverse=True))
            + ")"
            + (f", and {winner} leads at every evaluation from step {since:,} on." if since else ".")
        )
        if winner != leader:
            summary.append(
                f"So the first {steps} steps alone do not show who wins: the variants separate later in "
                "the schedule, which is why the paper trains 50,000 steps."
            )
    rescored_lines, fresh = rescored
    if rescored_lines:
        part1 = "\n".join(
            [
                f"| task | model (grid point) | metric | fresh, {rescore_problems:,} problems | its record | paper |",
                "|---|---|---|---|---|---|",
                *rescored_lines,
            ]
        )
        part1 += "\n\n" + rescored_summary(fresh)
    else:
        part1 = (
            "No trained models under the records given (`--records`): the hyla repository's clone has the paper's "
            "(`make demo` passes them); an installed wheel carries the records' curves only."
        )
    report = f"""# hyla demo: HYLA beside softmax, on the paper's tasks

Command: `hyla demo --steps {steps} --out {out}` (`make demo`).

## 1. The trained models behind the paper's table, on fresh held-out problems

Each row's run at the grid point its in-distribution validation chose (its lowest seed with weights), scored
on {rescore_problems:,} held-out problems drawn afresh (a seed no evaluation of the records used); beside it
the record's own last evaluation and the paper's mean.

{part1}

## 2. The first {steps:,} steps of the fuzzy-logic runs, on this machine

The seed-0 runs of `{sweep_name}` at the paper's grid point, from their records' configs (authors' setup),
stopped at step {steps:,} of the {recs[next(iter(recs))].config["train"]["steps"]:,}-step schedule; one thread each.

{table}

{" ".join(summary)}

"loss vs record": the logged training losses of your run against the committed record's over the same
steps. Equal steps mean this machine computes what the record's did, bit for bit; elsewhere rounding
(another CPU, or code changed since the record) makes them drift apart slowly, and the max relative
difference says how far. "yours": evaluated on {eval_size:,} problems per split; the records evaluate on
their own schedule (every {recs[next(iter(recs))].config["train"]["eval_every"]:,} steps). One seed: the
paper's table averages three, and early in the schedule another seed may rank the variants otherwise.

![training loss and OOD](demo.png)
"""
    (out / "report.md").write_text(report)
    return (part1 if rescored_lines else "") + "\n\n" + table + "\n\n" + " ".join(summary)


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    t0 = time.perf_counter()
    try:
        if not variants:
            raise ValueError(f"--variants must name rows of the sweep, e.g. {','.join(DEMO_VARIANTS)}")
        if args.rescore < 0:
            raise ValueError(f"--rescore must be >= 0 problems, got {args.rescore}")
        records = paper_records(args.sweep, Path(args.records), variants)
        for record in records.values():  # every config is valid before the first trains
            demo_config(record, args.steps, args.eval_size)
        rescored: tuple[list[str], dict[str, dict[str, float]]] = ([], {})
        if args.rescore:
            print(f"hyla demo: re-scoring the paper table's trained models on {args.rescore:,} fresh problems each")
            rescored = rescored_table(Path(args.records), args.rescore, RESCORE_SEED)
        jobs = min(len(records), os.cpu_count() or 1)  # one thread a run, as the records trained: never oversubscribe
        print(f"hyla demo: training {', '.join(records)} to step {args.steps:,}, {jobs} at a time")
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(jobs, mp_context=context) as pool:
            futures = {
                v: pool.submit(train_and_evaluate, record, out / v, args.steps, args.eval_size)
                for v, record in records.items()
            }
            results = {v: f.result() for v, f in futures.items()}
    except (ValueError, CheckpointError, NonFiniteLossError, Interrupted) as err:
        return failure_exit_code("hyla demo", err, "(checkpoint saved); run the same command to continue")
    summary = write_report(out, records, results, args.steps, args.sweep, args.eval_size, rescored, args.rescore)
    print(f"\n{summary}\n\nreport: {out / 'report.md'} (total {time.perf_counter() - t0:.0f} s)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="HYLA beside softmax: the trained models re-scored, and a short run (CPU)")
    p.add_argument("--out", default="runs/demo")
    p.add_argument(
        "--steps", type=int, default=DEMO_STEPS, help=f"steps of the schedule to train (default {DEMO_STEPS})"
    )
    p.add_argument(
        "--rescore",
        type=int,
        default=RESCORE_PROBLEMS,
        help=f"fresh held-out problems per trained model in part 1 (default {RESCORE_PROBLEMS}; 0: skip part 1)",
    )
    p.add_argument("--eval-size", type=int, default=4096, help="problems per split for your runs' evaluation")
    p.add_argument(
        "--variants", default=",".join(DEMO_VARIANTS), help=f"rows of the sweep (default {','.join(DEMO_VARIANTS)})"
    )
    p.add_argument("--sweep", default="table_a1_fuzzy", help="the sweep whose seed-0 records to start from")
    p.add_argument("--records", default=str(RECORD_ROOT), help="where its records are (default results/sweeps)")
    p.set_defaults(func=run)
