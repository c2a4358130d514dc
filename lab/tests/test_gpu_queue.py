"""The GPU queue's plan (lab/gpu/gpu_queue.py, lab/gpu/gpu_paper.sh --plan) on the CPU: its stages
in order, each sweep stage's stacks from the one planner, the projected minutes from the given rates, the
call's budget, and the loud warning before a run another machine may still train. Nothing here trains."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gpu_queue as queue
import pytest
import yaml

from hyla.train.sweeps import load_sweep
from tiny import HANG_GUARD_S, tiny_overrides

REPO = Path(__file__).resolve().parents[2]


def tiny_sweep(where: Path, task: str, steps: int, warmups: tuple[int, ...] = ()) -> Path:
    """Rows softmax and hyla at two learning rates (and ``warmups``, each row's own axis as in Table A1's SRAVEN
    sweep), seeds 0-2, on a split shared by the seeds."""
    overrides = {k: yaml.safe_load(v) for k, v in (o.split("=", 1) for o in tiny_overrides(steps=steps, every=steps))}
    spec = {
        "name": f"tiny_{task}",
        "config": task,
        "rows": {
            row: {"model.attention": row, **({"grid": {"train.warmup_steps": list(warmups)}} if warmups else {})}
            for row in ("softmax", "hyla")
        },
        "grid": {"train.lr": [0.001, 0.0003], "train.weight_decay": [0.3]},
        "seeds": [0, 1, 2],
        "overrides": {**overrides, "train.warmup_steps": 1000},
    }
    path = where / f"{task}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_the_stage_table_names_the_selected_sraven_point_and_refuses_unknown_stages() -> None:
    stage = queue.stage_named("sraven-selected")
    assert queue.sweep_arguments(stage) == [
        "--only",
        "hyla",
        "--where",
        "train.lr=0.0003",
        "--where",
        "train.weight_decay=0.3",
        "--where",
        "train.warmup_steps=1000",
        "--where",
        "seed=0,1,2",
        "--override",
        "train.eval_every=2500",
    ]
    # softmax there: seed 0 alone (its seeds 1-2 once that point leads softmax's row)
    softmax = queue.sweep_arguments(queue.stage_named("sraven-selected-softmax"))
    assert softmax[:2] == ["--only", "softmax"] and "seed=0" in softmax and list(stage.where[:3]) == softmax[3:8:2]
    # the developers' order: (3) SRAVEN at the selected point, HYLA and softmax, with softmax's seeds where its
    # row's rule points; (4) the authors' code there; (5) the fuzzy Table A1; (6) the other SRAVEN rows
    selected, rest = queue.DEFAULT_STAGES[:3], queue.DEFAULT_STAGES[3:]
    assert selected == ("sraven-selected", "sraven-selected-softmax", "sraven-softmax-chosen")
    assert rest == ("authors", "fuzzy", "sraven-rest")
    with pytest.raises(ValueError, match="unknown stage '2-sraven'; allowed: smoke, throughput, sraven-selected"):
        queue.stage_named("2-sraven")


def test_check_names_the_first_unknown_stage(capsys: pytest.CaptureFixture[str]) -> None:
    assert queue.main(["check", *queue.DEFAULT_STAGES]) == 0
    assert queue.main(["check", "fuzzy", "2-sraven", "sraven"]) == 2
    assert "gpu queue: error: unknown stage '2-sraven'; allowed: smoke" in capsys.readouterr().err


def test_the_authors_stage_trains_their_code_at_the_same_point_and_given_flags_win() -> None:
    assert queue.authors_flags() == ["--config.lr=0.0003", "--config.weight_decay=0.3", "--config.warmup_steps=1000"]
    # a key given twice is an error of their flag parser: what AUTHORS_EXTRA names is left out of the point
    assert queue.authors_flags("--config.batch_size=8 --config.warmup_steps=4") == [
        "--config.lr=0.0003",
        "--config.weight_decay=0.3",
    ]
    # the same grid point as our sraven-selected stage
    ours = dict(w.split("=", 1) for w in queue.stage_named("sraven-selected").where)
    theirs = dict(f.removeprefix("--config.").split("=", 1) for f in queue.authors_flags())
    assert {k.removeprefix("train."): v for k, v in ours.items() if k != "seed"} == theirs
    # their logs go to one folder per point, named by it
    assert queue.authors_logs() == "lab/tables/gpu_sraven_verdict/authors_lr3e-4_wd0.3"
    spelled = [queue._short(v) for v in ("0.001", "0.0003", "0.3", "0.1", "1e-05")]
    assert spelled == ["1e-3", "3e-4", "0.3", "0.1", "1e-5"]


def test_authors_flags_command_takes_one_given_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """gpu_paper.sh passes AUTHORS_EXTRA as ``--given=...``: a single flag there starts with a dash, which
    ``--given FLAG`` (two words) would read as an option of its own."""
    assert queue.main(["authors-flags", "--given=--config.lr=0.001"]) == 0
    assert capsys.readouterr().out.split() == ["--config.weight_decay=0.3", "--config.warmup_steps=1000"]
    script = (REPO / "lab" / "gpu" / "gpu_paper.sh").read_text()
    assert 'authors-flags --given="${AUTHORS_EXTRA:-}"' in script


def test_stack_rates_come_from_the_largest_measured_stack_else_the_lone_run() -> None:
    assert queue.stack_rate("sraven", 3, {}) == (567.0 / 3, "one lone H100 run, no stacking gain")
    measured = {"sraven": {1: 600.0, 4: 400.0}}
    assert queue.stack_rate("sraven", 4, measured) == (400.0, "measured stack of 4")
    assert queue.stack_rate("sraven", 8, measured) == (200.0, "measured stack of 4")  # 1,600 run-steps/s over 8
    assert queue.stack_rate("sraven", 2, measured) == (300.0, "measured stack of 1")
    with pytest.raises(ValueError, match="no GPU rate for task 'text'"):
        queue.stack_rate("text", 1, {})


def finished_record(run: Path, steps: int, test: float, ood: float) -> None:
    """A finished run's record as the report reads it: its schedule's length and its final evaluations."""
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"train": {"steps": steps}}))
    rows = [{"step": steps, "split": split, "acc": acc} for split, acc in (("test", test), ("ood", ood))]
    (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_softmax_seeds_go_where_its_seed_0_runs_score_best_in_distribution(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The stage sraven-softmax-chosen waits until softmax at the selected point (seed 0) is finished, then
    trains softmax's seeds 0-2 at the point whose finished seed-0 run has the best test accuracy (never OOD;
    a point with more finished seeds does not win on their number)."""
    sraven = tiny_sweep(tmp_path, "sraven", steps=8, warmups=(1000, 3000))
    root, sweeps = tmp_path / "records", {"sraven": str(sraven)}
    sweep = load_sweep(str(sraven))

    def run(lr: str, seed: int) -> Path:
        (spec,) = sweep.runs(["softmax"], {"train.lr": [lr], "train.warmup_steps": ["1000"], "seed": [str(seed)]})
        return root / sweep.name / spec.name

    stage = queue.stage_named("sraven-softmax-chosen")
    args = ["args", "sraven-softmax-chosen", "--root", str(root), "--sraven", str(sraven)]
    # lr 1e-3 has two finished seeds and the best OOD; the selected point (lr 3e-4) has not finished seed 0
    finished_record(run("0.001", 0), 8, test=0.50, ood=0.90)
    finished_record(run("0.001", 1), 8, test=0.50, ood=0.90)
    assert queue.main(args) == 3
    waits = f"softmax at the selected point ({run('0.0003', 0).name}) is not finished yet"
    assert capsys.readouterr().out == f"stage sraven-softmax-chosen waits: {waits}\n"
    plan = queue.plan(["sraven-softmax-chosen"], 9.0, root, sweeps, tmp_path / "none.json")
    assert plan[1] == f"== sraven-softmax-chosen: waits: {waits}", plan
    # finished, ahead in distribution: seeds 1 and 2 there
    finished_record(run("0.0003", 0), 8, test=0.60, ood=0.10)
    where = queue.stage_where(stage, root, sweep)
    assert where == ("train.lr=0.0003", "train.weight_decay=0.3", "train.warmup_steps=1000", "seed=0,1,2")
    assert queue.main(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["sraven", *queue.sweep_arguments(stage, where)] and out[1:3] == ["--only", "softmax"]
    plan = queue.plan(["sraven-softmax-chosen"], 9.0, root, sweeps, tmp_path / "none.json")
    assert plan[1] == "== sraven-softmax-chosen: tiny_sraven, 2 of 3 runs to train", plan
    # behind in distribution (though ahead out of it): lr 1e-3's seed 2 is the one left
    (run("0.0003", 0) / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": 8, "split": s, "acc": a}) + "\n" for s, a in (("test", 0.4), ("ood", 0.95)))
    )
    assert queue.stage_where(stage, root, sweep)[0] == "train.lr=0.001"
    plan = queue.plan(["sraven-softmax-chosen"], 9.0, root, sweeps, tmp_path / "none.json")
    assert plan[1] == "== sraven-softmax-chosen: tiny_sraven, 1 of 3 runs to train", plan
    assert plan[-2].strip() == run("0.001", 2).name, plan


def test_runs_left_are_every_run_not_done_a_started_one_included(tmp_path: Path) -> None:
    """What gpu_paper.sh archives the checkpoints of and lists as left: ``root/NAME/RUN`` for each run whose
    final evaluation is not written."""
    sraven = tiny_sweep(tmp_path, "sraven", steps=8)
    root = tmp_path / "records"
    runs = load_sweep(str(sraven)).runs()
    done, started = (root / "tiny_sraven" / r.name for r in runs[:2])
    done.mkdir(parents=True)
    (done / "config.yaml").write_text(yaml.safe_dump({"train": {"steps": 8}}))
    (done / "metrics.jsonl").write_text(json.dumps({"step": 8, "split": "test", "acc": 0.5}) + "\n")
    started.mkdir(parents=True)
    (started / "config.yaml").write_text(yaml.safe_dump({"train": {"steps": 8}}))
    (started / "metrics.jsonl").write_text(json.dumps({"step": 4, "split": "test", "acc": 0.5}) + "\n")
    names, left = queue.runs_left(root, {"sraven": str(sraven)})
    assert names == ["tiny_sraven"] and len(runs) == 12
    assert left == [root / "tiny_sraven" / r.name for r in runs[1:]]


def test_plan_lists_the_stacks_that_fit_the_call_and_sums_the_rest(tmp_path: Path) -> None:
    sraven = tiny_sweep(tmp_path, "sraven", steps=567_000)  # 1,000 s a lone run at 567 steps/s
    root = tmp_path / "records"
    rates = tmp_path / "rates.json"
    # a run another machine left unfinished is named loudly
    runs = load_sweep(str(sraven)).runs()
    started = root / "tiny_sraven" / runs[0].name
    started.mkdir(parents=True)
    (started / "made_by.jsonl").write_text(
        json.dumps({"from_step": 0, "machine": "cpu-box", "date": "d", "ended": None}) + "\n"
    )
    lone = queue.plan(["sraven-rest"], 20.0, root, {"sraven": str(sraven)}, rates)  # the default: each run alone
    assert lone[3].startswith("  stack of 1 (softmax, from step 0): 17.1 min at 567 steps/s"), lone
    lines = queue.plan(["throughput", "sraven-rest"], 20.0, root, {"sraven": str(sraven)}, rates, max_stack=6)
    assert lines[0].startswith("plan of the next call: 20 min, stages throughput sraven-rest (no stack measured")
    assert lines[1].startswith("== throughput: 4.0 min") and lines[1].endswith("; fits")
    assert lines[2] == "== sraven-rest: tiny_sraven, 12 of 12 runs to train"
    assert lines[3].startswith(f"!!! {runs[0].name}: its piece from step 0 on cpu-box (d) never ended")
    # a row's grid points and seeds in one stack (the tiny split is shared), at a sixth of the lone run's rate:
    # 6 x 1,000 s of steps and 6 x 24 s of evaluations, 102.4 min; the first fills the 16 min left of the call
    assert lines[4] == (
        "  stack of 6 (softmax, from step 0): 102.4 min at 94 steps/s (one lone H100 run, no stacking gain); "
        "16.0 min of it this call"
    )
    assert lines[5].strip().split(", ") == [r.name for r in runs if r.name.startswith("softmax")]
    assert lines[6:] == [
        "  later calls: 1 more stacks, 6 runs, 102.4 min",
        "projected: 208.8 min of work for these stages; the call has 20 (compile not counted)",
    ]

    # with measured rates: smoke and throughput are done, and a stack of 6 runs at its measured rate
    # (500 s of steps + 144 s of evaluations = 10.7 min)
    rates.write_text(json.dumps({"device": "H100", "tasks": {"sraven": {"6": 1134.0}}}))
    lines = queue.plan(["smoke", "throughput", "sraven-rest"], 20.0, root, {"sraven": str(sraven)}, rates, 6)
    assert lines[1:3] == ["== smoke: measured already", "== throughput: measured already"]
    stacks = [line for line in lines if line.startswith("  stack of")]
    assert stacks == [
        "  stack of 6 (softmax, from step 0): 10.7 min at 1134 steps/s (measured stack of 6); fits",
        "  stack of 6 (hyla, from step 0): 10.7 min at 1134 steps/s (measured stack of 6); 9.3 min of it this call",
    ]


def test_gpu_paper_plan_prints_the_next_call_without_a_gpu_and_trains_nothing(tmp_path: Path) -> None:
    fuzzy, sraven = tiny_sweep(tmp_path, "fuzzy_logic", 50_000), tiny_sweep(tmp_path, "sraven", 156_250, (1000, 3000))
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "PYTHONPATH": str(REPO / "src"),
        "FUZZY": str(fuzzy),
        "SRAVEN": str(sraven),
        "ROOT": "records",
        "MINUTES": "9",
        "MAX_STACK": "3",
        "STAGES": " ".join(["smoke", "throughput", *queue.DEFAULT_STAGES]),
    }
    script = ["bash", str(REPO / "lab" / "gpu" / "gpu_paper.sh")]
    done = subprocess.run(
        [*script, "--plan"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    stages = [line.split(":")[0] for line in out.splitlines() if line.startswith("== ")]
    assert stages == [
        "== smoke",
        "== throughput",
        "== sraven-selected",
        "== sraven-selected-softmax",
        "== sraven-softmax-chosen",
        "== authors",
        "== fuzzy",
        "== sraven-rest",
    ]
    # lr 3e-4, wd 0.3, warmup 1000: HYLA's seeds 0-2, one stack; softmax's seed 0 alone
    assert "== sraven-selected: tiny_sraven, 3 of 3 runs to train" in out, out
    assert "== sraven-selected-softmax: tiny_sraven, 1 of 1 runs to train" in out, out
    # after smoke and throughput's 5 min, 4 of HYLA's stack's 15.0 min; softmax waits for a later call
    assert "  stack of 3 (hyla, from step 0): 15.0 min at 189 steps/s" in out and "4.0 min of it this call" in out
    softmax = out.split("== sraven-selected-softmax")[1].split("== sraven-softmax-chosen")[0]
    assert "  later calls: 1 more stacks, 1 runs, 5.0 min" in softmax, softmax
    assert "== sraven-softmax-chosen: waits: softmax at the selected point" in out  # its seed 0 is not trained
    # the stages whose records also train on CPUs, and only those, say to stop the CPU runs first
    by_stage = {text.split(":")[0]: text for text in out.split("\n== ")[1:]}
    stops = [name for name, text in by_stage.items() if "!!! stop every CPU run of these records first" in text]
    assert stops == ["sraven-selected", "sraven-selected-softmax"], out
    assert out.splitlines()[-1].startswith("projected: ") and out.splitlines()[-1].endswith(
        "the call has 9 (compile not counted)"
    )
    assert not (tmp_path / "records").exists() and not (tmp_path / ".gpu_state").exists()
    # PLAN=1 is the same; a bad stage is refused naming the allowed ones
    assert subprocess.run(script, env={**env, "PLAN": "1"}, cwd=tmp_path, capture_output=True, text=True).stdout == out
    bad = subprocess.run(script, env={**env, "STAGES": "fuzzy 1-fuzzy"}, cwd=tmp_path, capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown stage '1-fuzzy'; allowed: smoke" in bad.stderr
