"""``hyla demo``: the first steps of the paper's fuzzy-logic runs on your CPU, beside their full-length records.

The runs are Table A1's softmax, linear and HYLA at the paper's grid point, seed 0: the first run of each
row in ``hyla/configs/sweeps/table_a1_fuzzy.yaml`` (lr 1e-3, wd 0.1), trained from the config its committed
record holds (``results/sweeps/table_a1_fuzzy/<run>/config.yaml``): the 50,000-step schedule, stopped
after ``--steps``. Each run trains on one thread, as the records did, all at once. The report then

* checks that this machine reproduces each record's training curve over those steps (how close);
* evaluates the stopped models (``--eval-size`` problems per split);
* draws the records' full-length OOD curves beside the user's point, and says which variant leads at
  the end and where the records first show it, since the first steps alone do not.

Re-running resumes unfinished runs and reuses finished ones (``<out>/<variant>/demo_eval.json``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from hyla.analysis.plots import first_steps_beside_records
from hyla.train.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint
from hyla.train.cli import failure_exit_code
from hyla.train.config import ExperimentConfig, load_config
from hyla.train.loop import Interrupted, NonFiniteLossError, Trainer
from hyla.train.rundir import METRICS, RunRecord, has_record, read_run
from hyla.train.sweepfile import RECORD_ROOT, load_sweep

DEMO_VARIANTS = ("softmax", "linear", "hyla")
DEMO_EVAL = "demo_eval.json"
#: what the report compares: the metric of the task (fuzzy logic: R^2) on held-out combinations
METRIC, SPLIT = "r2", "ood"
#: the records of the demo's runs, shipped with the package (config and metrics, copies of the committed
#: ``results/sweeps/table_a1_fuzzy/<run>/``), for an installed wheel run outside a clone
PACKAGED_RECORDS = Path(__file__).resolve().parent / "demo_records"


def paper_records(sweep_name: str, root: Path, variants: list[str]) -> dict[str, Path]:
    """Each variant's record folder: the sweep's first run of that row at seed 0 (its first grid point), under
    ``root``, else the package's copy (:data:`PACKAGED_RECORDS`)."""
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


def demo_config(record: Path, steps: int, eval_size: int) -> ExperimentConfig:
    """The record's own config; only the evaluation is smaller (it draws from its own generators, so
    training is unchanged)."""
    cfg = load_config(str(record / "config.yaml"), [f"train.eval_size={eval_size}"])
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


def write_report(
    out: Path, records: dict[str, Path], results: dict[str, dict], steps: int, sweep_name: str, eval_size: int
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
    yours_at_stop = {v: evals[v][SPLIT][METRIC] for v in records}
    first_steps_beside_records(out / "demo.png", runs, recs, yours_at_stop, steps, SPLIT, METRIC)
    summary = [f"At step {steps} on this machine, {lead(yours)} leads on {SPLIT} {METRIC}."]
    if len(end) == len(records):
        winner = lead(end)
        since = first_lasting_lead(recs, winner)
        summary.append(
            f"The records end with {winner} ahead ("
            + ", ".join(f"{v} {100 * end[v]:.1f}" for v in sorted(end, key=end.__getitem__, reverse=True))
            + ")"
            + (f", and {winner} leads at every evaluation from step {since:,} on." if since else ".")
        )
        if winner != lead(yours):
            summary.append(
                f"So the first {steps} steps alone do not show who wins: the variants separate later in "
                "the schedule, which is why the paper trains 50,000 steps."
            )
    report = f"""# hyla demo: the first {steps} steps of the paper's runs, beside their records

Command: `hyla demo --steps {steps} --out {out}` (`make demo`). Runs: the seed-0 runs of `{sweep_name}`
at the paper's grid point, from their records' configs (softmax, linear, HYLA; authors' setup), stopped
at step {steps} of the {recs[next(iter(recs))].config["train"]["steps"]:,}-step schedule; one thread each.

{table}

{" ".join(summary)}

"loss vs record": the logged training losses of your run against the committed record's over the same
steps. Equal steps mean this machine computes what the record's did, bit for bit; elsewhere rounding
(another CPU, or code changed since the record) makes them drift apart slowly, and the max relative
difference says how far. "yours": evaluated on {eval_size:,} problems per split; the records evaluate on
their own schedule (every {recs[next(iter(recs))].config["train"]["eval_every"]:,} steps).

![training loss and OOD](demo.png)
"""
    (out / "report.md").write_text(report)
    return table + "\n\n" + " ".join(summary)


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    t0 = time.perf_counter()
    try:
        if not variants:
            raise ValueError(f"--variants must name rows of the sweep, e.g. {','.join(DEMO_VARIANTS)}")
        records = paper_records(args.sweep, Path(args.records), variants)
        for record in records.values():  # every config is valid before the first trains
            demo_config(record, args.steps, args.eval_size)
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(len(records), mp_context=context) as pool:
            futures = {
                v: pool.submit(train_and_evaluate, record, out / v, args.steps, args.eval_size)
                for v, record in records.items()
            }
            results = {v: f.result() for v, f in futures.items()}
    except (ValueError, CheckpointError, NonFiniteLossError, Interrupted) as err:
        return failure_exit_code("hyla demo", err, "(checkpoint saved); run the same command to continue")
    summary = write_report(out, records, results, args.steps, args.sweep, args.eval_size)
    print(f"\n{summary}\n\nreport: {out / 'report.md'} (total {time.perf_counter() - t0:.0f} s)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="the first steps of the paper's fuzzy-logic runs, beside their records (CPU)")
    p.add_argument("--out", default="runs/demo")
    p.add_argument("--steps", type=int, default=1500, help="steps of the 50,000-step schedule to train (default 1500)")
    p.add_argument("--eval-size", type=int, default=4096, help="problems per split for your runs' evaluation")
    p.add_argument(
        "--variants", default=",".join(DEMO_VARIANTS), help="rows of the sweep (default softmax,linear,hyla)"
    )
    p.add_argument("--sweep", default="table_a1_fuzzy", help="the sweep whose seed-0 records to start from")
    p.add_argument("--records", default=str(RECORD_ROOT), help="where its records are (default results/sweeps)")
    p.set_defaults(func=run)
