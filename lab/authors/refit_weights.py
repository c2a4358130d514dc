"""Give a finished record that kept no weights its final weights: retrain it from its own config, check
that the retrain retraces the record, and only then put ``model.safetensors`` beside the record.

Usage (one thread, as the records were trained; resumable: run the same command again)::

    python lab/authors/refit_weights.py lab/runs/table_a1_fuzzy/hyla-lr0.001-weight_decay0.1-seed0 \\
        --work runs/refit/hyla-seed0 --from-commit a9077b3 --phase 39472=direct --cpu-march x86-64-v2
    ATEN_CPU_CAPABILITY=avx2 python lab/authors/refit_weights.py \\
        lab/runs/table_a1_fuzzy/softmax-lr0.001-weight_decay0.1-seed0 --work runs/refit/softmax-seed0 \\
        --from-commit f558bce

``--phase STEP=BACKEND`` trains up to ``STEP`` with ``model.attention_backend=BACKEND``: the attention code
that ran then. The fuzzy-logic HYLA record trained its first 39,472 steps with attention dropout on the
direct form (commits 8252169, 0298179; its third piece, at b82cb3b where the C kernel learned to drop,
resumed from the second piece's stop checkpoint at 39,472, though ``made_by.jsonl`` names the last logged
step, 39,400); today ``auto`` runs the C kernel, whose sums round differently. A phase changes how sums
round, nothing else (``model.attention_backend`` is a resumable change, see
``hyla.train.loop.RESUMABLE_CHANGES``).

Two settings decide how a CPU run's sums round, beside the code: PyTorch's kernels, chosen by the CPU's
vector width unless ``ATEN_CPU_CAPABILITY`` names one (set it in the environment: it is read when torch
loads), and the C kernel's ``-march`` target, which ``--cpu-march`` sets (``HYLA_CPU_MARCH``; the kernel
before #40 was built with ``-fassociative-math``, so the target decided the order of its vectorized sums).
The kernel itself changed in #40 (its own 8-lane sums; ``kernel_source`` in ``made_by.jsonl`` since): a
record made before retraces only when this script runs from a worktree of a commit before it. Records made since
2026-11-26 name both in ``made_by.jsonl`` (``cpu_capability``, ``kernel_march``). The fuzzy-logic records
before came from an AVX2 machine: on a 2-core AMD EPYC with AVX-512, softmax seed 0 is retraced bit for bit
with ``ATEN_CPU_CAPABILITY=avx2`` only, and HYLA seed 0's C-kernel steps with ``--cpu-march x86-64-v2``
only (``native``, ``x86-64-v3``, ``x86-64-v4`` and ``znver1-3`` drift from the first logged step on).

``--from-commit C`` starts from the record's own newest checkpoint as committed at ``C`` (runs that trained
in pieces committed one), instead of from step 0: only the steps after it are retrained and checked.

The check: every metric the retrain logged at a step the record logged must equal the record's
(``--rtol 0``, the default: the same CPU kind and thread count reproduce a run bit for bit). Evaluations
made inside a ``--phase`` ran on that phase's backend, while the record evaluated on ``auto`` (dropout
is off in evaluation, so the old code did not fall back to the direct form there): the same weights
through two summation orders, so those rows may differ by float32 rounding of a mean over thousands of
problems, at most ``EVAL_IN_PHASE_RTOL``. On another CPU kind no run retraces a 50,000-step record
exactly; ``--rtol`` then sets the tolerance, and the report shows how far the curves drifted.

On agreement the weights go to ``RECORD/model.safetensors`` and how they were made to
``RECORD/model.refit.json``; otherwise the record is left as it was, and the exit code is 1.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import torch

from hyla.ops.clib import MARCH_ENV
from hyla.sweep.cli import budget_deadline
from hyla.sweep.groups import provenance
from hyla.train.config import ExperimentConfig
from hyla.train.loop import Trainer
from hyla.train.run.checkpoint import checkpoint_step, load_weights, save_weights
from hyla.train.run.folder import FINAL_WEIGHTS, load_run_config, read_run

#: evaluations inside a ``--phase``: the same weights summed in another order (see the module docstring)
EVAL_IN_PHASE_RTOL = 1e-5
REFIT_NOTE = "model.refit.json"
#: in ``--work``: where a ``--from-commit`` retrain started (commit and step)
REFIT_START = "refit_start.json"


def parse_phases(specs: list[str], total_steps: int) -> list[tuple[int, str]]:
    """``["39400=direct"]`` as ``[(39400, "direct")]``, in step order, each step inside the schedule."""
    phases = []
    for spec in specs:
        step, sep, backend = spec.partition("=")
        if not sep or not step.isdigit() or not backend:
            raise ValueError(f"--phase must be STEP=BACKEND (e.g. 39400=direct), got {spec!r}")
        if not 0 < int(step) < total_steps:
            raise ValueError(f"--phase {spec}: STEP must be in 1..{total_steps - 1} (the record's schedule)")
        phases.append((int(step), backend))
    steps = [s for s, _ in phases]
    if len(set(steps)) != len(steps):
        raise ValueError(f"--phase: each STEP once, got {specs}")
    return sorted(phases)


def phase_config(record: Path, backend: str | None) -> ExperimentConfig:
    """The record's config, with ``backend`` for the attention when given."""
    overrides = [f"model.attention_backend={backend}"] if backend else []
    return load_run_config(record, overrides)


def train(record: Path, work: Path, phases: list[tuple[int, str]], deadline: float | None) -> int:
    """Train ``work`` on until the record's last step, a phase's end at a time, or ``deadline``; the step
    reached."""
    torch.set_num_threads(1)  # as the records were trained
    total = phase_config(record, None).train.steps
    for stop_at, backend in [*phases, (total, None)]:
        step = checkpoint_step(work)
        if step is not None and step >= stop_at:
            continue
        trainer = Trainer(phase_config(record, backend), work, resume=step is not None, quiet=True)
        trainer.stop_at_step = stop_at if stop_at < total else None
        trainer.deadline = deadline
        try:
            trainer.run()
        finally:
            trainer.close()
        if trainer.step < stop_at:  # out of time
            return trainer.step
    return total


def agreement(
    record: Path, work: Path, phases: list[tuple[int, str]], rtol: float, after_step: int = -1
) -> dict[str, Any]:
    """Every (step, split, metric) both logged after ``after_step``: how many, how many equal, the largest
    relative difference, and the rows outside their tolerance."""
    last_phase_step = phases[-1][0] if phases else 0
    theirs = {(m["step"], m["split"]): m for m in read_run(record).metrics}
    compared = equal = 0
    worst, failures = 0.0, []
    for row in read_run(work).metrics:
        ref = theirs.get((row["step"], row["split"]))
        if ref is None or row["step"] <= after_step:
            continue
        in_phase_eval = row["split"] != "train_batch" and row["step"] <= last_phase_step
        tol = max(rtol, EVAL_IN_PHASE_RTOL) if in_phase_eval else rtol
        for key, value in row.items():
            if key in ("step", "split") or not isinstance(value, (int, float)) or key not in ref:
                continue
            compared += 1
            equal += value == ref[key]
            rel = abs(value - ref[key]) / max(abs(ref[key]), 1e-30)
            worst = max(worst, rel)
            if not rel <= tol:  # a NaN fails too
                failures.append(f"step {row['step']} {row['split']} {key}: {value!r} vs {ref[key]!r} (rel {rel:.1e})")
    return {"compared": compared, "equal": equal, "max_rel": worst, "failures": failures}


def start_from_commit(record: Path, work: Path, commit: str) -> int:
    """Put ``record`` as committed at ``commit`` (its records and newest checkpoint) into the new folder
    ``work``; the checkpoint's step. Raises ValueError if ``commit`` holds no checkpoint of the record."""

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=record, capture_output=True)

    prefix = git("rev-parse", "--show-prefix").stdout.decode().strip()
    archive = git("archive", "--format=tar", commit, "--", ".")
    if not prefix or archive.returncode != 0:
        raise ValueError(f"--from-commit {commit}: no {record} there ({archive.stderr.decode().strip()[-300:]})")
    work.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(work, filter="data")
    step = checkpoint_step(work)
    if step is None:
        raise ValueError(f"--from-commit {commit}: {prefix} has no checkpoint in that commit")
    return step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("record", type=Path, help="a finished run folder (config.yaml, metrics.jsonl)")
    parser.add_argument("--work", type=Path, required=True, help="where the retrain runs (resumed if there)")
    parser.add_argument("--phase", action="append", default=[], metavar="STEP=BACKEND")
    parser.add_argument("--rtol", type=float, default=0.0, help="relative tolerance (default 0: bit for bit)")
    parser.add_argument("--from-commit", metavar="C", help="start from the record's checkpoint committed at C")
    parser.add_argument("--cpu-march", metavar="TARGET", help="-march of the C kernel (HYLA_CPU_MARCH)")
    parser.add_argument("--max-minutes", type=float, default=None, help="stop with a checkpoint before this")
    args = parser.parse_args(argv)

    record, work = args.record, args.work
    cfg = phase_config(record, None)
    if not (record / "metrics.jsonl").is_file():
        raise SystemExit(f"{record}: no metrics.jsonl, so nothing to check a retrain against")
    if (record / FINAL_WEIGHTS).is_file():
        raise SystemExit(f"{record} already keeps its weights ({FINAL_WEIGHTS}); nothing to do")
    if not args.rtol >= 0 or math.isinf(args.rtol):
        raise SystemExit(f"--rtol must be a finite number >= 0, got {args.rtol}")
    try:
        phases = parse_phases(args.phase, cfg.train.steps)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    if args.cpu_march:  # before anything builds the kernel
        os.environ[MARCH_ENV] = args.cpu_march
    start_note = work / REFIT_START
    if args.from_commit and not work.exists():
        try:
            step = start_from_commit(record, work, args.from_commit)
        except ValueError as err:
            raise SystemExit(str(err)) from None
        start_note.write_text(json.dumps({"commit": args.from_commit, "step": step}) + "\n")
    elif args.from_commit and not start_note.is_file():
        raise SystemExit(f"--from-commit: {work} already holds a retrain from step 0; name a new --work")
    start = json.loads(start_note.read_text()) if start_note.is_file() else {"step": 0}
    deadline = None if args.max_minutes is None else budget_deadline(time.monotonic(), args.max_minutes)

    t0 = time.monotonic()
    step = train(record, work, phases, deadline)
    check = agreement(record, work, phases, args.rtol, after_step=start["step"] - 1)
    print(
        f"{record.name}: retrained to step {step} of {cfg.train.steps} in {work} ({time.monotonic() - t0:.0f} s "
        f"this call); {check['equal']} of {check['compared']} logged values equal to the record, "
        f"largest relative difference {check['max_rel']:.1e}"
    )
    for line in check["failures"][:20]:
        print("  differs:", line)
    if check["failures"]:
        print(f"the retrain does not retrace {record}; its weights are not kept there")
        return 1
    if step < cfg.train.steps:
        print("out of time: run the same command again to continue")
        return 0
    save_weights(record / FINAL_WEIGHTS, load_weights(work / FINAL_WEIGHTS))
    note = {
        "made_by": "lab/authors/refit_weights.py: retrained from config.yaml, checked against metrics.jsonl",
        "phases": [f"{s}={b}" for s, b in phases],
        "started_from": start,
        "rtol": args.rtol,
        "compared": check["compared"],
        "equal": check["equal"],
        "max_rel": check["max_rel"],
        **provenance("cpu"),  # with the CPU capability and the C kernel's -march it ran with
    }
    (record / REFIT_NOTE).write_text(json.dumps(note, indent=1) + "\n")
    print(f"kept: {record / FINAL_WEIGHTS} ({record / REFIT_NOTE} says how)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
