"""`hyla sweep`: order and names, records, stop and continue, finished runs left alone, dry run, commands."""

from __future__ import annotations

import itertools
import json
import os
import shlex
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from hyla.analysis.paper_report import sweep_section
from hyla.cli import main
from hyla.sweep import cli as sweep_cli
from hyla.sweep import estimate as sweep_estimate
from hyla.sweep import launch as sweep_launch
from hyla.sweep.estimate import probe_threads, seconds_left, wall_seconds
from hyla.sweep.workers import worker_threads
from hyla.textio import read_jsonl
from hyla.train.config import load_config
from hyla.train.run.folder import read_run, run_state
from hyla.train.sweeps import check_slurm, load_sweep
from tiny import HANG_GUARD_S, TINY_SWEEP_OVERRIDES, torch_threads, write_sweep


def two_rows_two_seeds(tmp_path: Path) -> Path:
    """softmax and hyla at one lr, seeds 0 and 1: four runs, each row's two seeds one stack."""
    rows = {"softmax": {"model.attention": "softmax"}, "hyla": {"model.attention": "hyla"}}
    return write_sweep(tmp_path, rows=rows, grid={"train.lr": [0.001]}, seeds=[0, 1])


def records(root: Path) -> dict[str, tuple[str, str]]:
    return {
        run.name: ((run / "config.yaml").read_text(), (run / "metrics.jsonl").read_text())
        for run in sorted(root.iterdir())
        if (run / "config.yaml").is_file()
    }


def test_runs_are_ordered_named_and_valid(tmp_path: Path) -> None:
    path = write_sweep(
        tmp_path,
        rows={"softmax": {"model.attention": "softmax"}, "hyla": {"model.attention": "hyla"}},
        grid={"train.lr": [0.001, 0.003]},
        seeds=[0, 1],
    )
    spec = yaml.safe_load(path.read_text())
    spec["first"] = ["hyla"]
    path.write_text(yaml.safe_dump(spec))
    runs = load_sweep(str(path)).runs()
    assert [r.name for r in runs[:4]] == [
        "hyla-lr0.001-seed0",
        "hyla-lr0.001-seed1",
        "hyla-lr0.003-seed0",
        "hyla-lr0.003-seed1",
    ]
    assert len(runs) == 8 and len({r.name for r in runs}) == 8
    assert "model.attention=softmax" in runs[4].overrides and "seed=0" in runs[4].overrides
    assert [r.name for r in load_sweep(str(path)).runs(["softmax"])][:1] == ["softmax-lr0.001-seed0"]


def test_every_paper_sweep_file_loads() -> None:
    counts = {name: len(load_sweep(name).runs()) for name in ("table_a1_fuzzy", "table_a1_sraven", "fig2c_fuzzy")}
    # SRAVEN: softmax, linear and hyla also sweep warmup {1000, 3000} (the authors' sweeps/raven.yaml)
    sraven = 3 * 8 * 3 + 9 * 4 * 3
    assert counts == {"table_a1_fuzzy": 12 * 4 * 3, "table_a1_sraven": sraven, "fig2c_fuzzy": 3 * 12 * 3}
    first = load_sweep("table_a1_fuzzy").runs()[:9]
    assert {r.row for r in first} == {"softmax", "linear", "hyla"}
    assert all(dict(r.point) == {"train.lr": 0.001, "train.weight_decay": 0.1} for r in first)


def test_bad_sweeps_fail_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_sweep(tmp_path, rows={"hyla": {"model.attention": "hyla"}}, grid={}, seeds=[0])
    assert main(["sweep", str(path), "--only", "nope", "--dry-run"]) == 2
    assert "--only 'nope' is not a row of tiny; rows: hyla" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nrowz: {}\n")
    assert main(["sweep", str(bad), "--dry-run"]) == 2
    assert "unknown sweep field rowz" in capsys.readouterr().err
    bad.write_text("name: x\nconfig: fuzzy_logic\nrows: {a: {model.attention: nope}}\n")
    assert main(["sweep", str(bad), "--dry-run"]) == 2
    assert "run a-seed0" in capsys.readouterr().err


def test_stopped_and_continued_sweep_writes_the_records_of_an_uninterrupted_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = two_rows_two_seeds(tmp_path)
    stacks = ["--max-stack", "2"]  # each row's two seeds as one stack, stopped and continued together
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert main(["sweep", str(path), "--root", str(whole), *stacks]) == 0
    assert "4 runs finished now, 0 left" in capsys.readouterr().out

    # a fake clock, one second per reading: --max-minutes 0.1 leaves 6 - 0.6 (margin: a tenth) = 5.4 s, i.e.
    # the first run stops a few steps in, with a checkpoint
    clock = itertools.count()
    monkeypatch.setattr(time, "monotonic", lambda: float(next(clock)))
    assert main(["sweep", str(path), "--root", str(parts), "--max-minutes", "0.1", *stacks]) == 0
    out = capsys.readouterr().out
    assert "time budget reached" in out and "0 runs finished now, 4 left" in out
    states = {run.name: run_state(parts / "tiny" / run.name) for run in load_sweep(str(path)).runs()}
    assert sorted(states.values()) == ["new", "new", "stopped", "stopped"]  # the first stack, seeds 0 and 1
    monkeypatch.undo()

    assert main(["sweep", str(path), "--root", str(parts), *stacks]) == 0
    assert "4 runs finished now, 0 left" in capsys.readouterr().out
    assert records(parts / "tiny") == records(whole / "tiny")
    made = [json.loads(line) for line in (parts / "tiny" / "softmax-lr0.001-seed0" / "made_by.jsonl").open()]
    assert len(made) == 2 and made[0]["from_step"] == 0 and 0 < made[0]["to_step"] < 8
    assert made[1]["from_step"] == made[0]["to_step"] and made[1]["to_step"] == 8  # resumed at the checkpoint
    assert {"commit", "machine", "device", "date", "wall_s"} <= set(made[0])

    # finished runs are never rerun
    before = {p: p.stat().st_mtime_ns for p in (parts / "tiny").glob("*/metrics.jsonl")}
    assert main(["sweep", str(path), "--root", str(parts)]) == 0
    assert "all 4 runs are done" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in before} == before


@pytest.mark.slow
def test_a_stopped_sweep_moved_to_another_folder_resumes_there_bit_for_bit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Records move between a run's pieces (a repository reorganized, a disk changed): nothing in a record names
    its folder, so the next piece continues from the new place as if it had never moved."""
    import shutil

    path = two_rows_two_seeds(tmp_path)
    whole, before, after = tmp_path / "whole", tmp_path / "before", tmp_path / "moved" / "elsewhere"
    assert main(["sweep", str(path), "--root", str(whole)]) == 0
    clock = itertools.count()  # a fake clock, as above: the first run stops a few steps in
    monkeypatch.setattr(time, "monotonic", lambda: float(next(clock)))
    assert main(["sweep", str(path), "--root", str(before), "--max-minutes", "0.1"]) == 0
    monkeypatch.undo()
    states = {run.name: run_state(before / "tiny" / run.name) for run in load_sweep(str(path)).runs()}
    assert "stopped" in states.values()
    after.parent.mkdir()
    shutil.move(before, after)
    capsys.readouterr()
    assert main(["sweep", str(path), "--root", str(after)]) == 0
    assert "4 runs finished now, 0 left" in capsys.readouterr().out
    assert records(after / "tiny") == records(whole / "tiny")
    for run in load_sweep(str(path)).runs():
        ours = load_file(str(after / "tiny" / run.name / "model.safetensors"))
        theirs = load_file(str(whole / "tiny" / run.name / "model.safetensors"))
        assert all(torch.equal(ours[k], theirs[k]) for k in theirs)


#: ``python -c`` this with ``hyla`` arguments: the command is killed with SIGKILL right after step 6 (no
#: handler, no ``finally`` runs: what ``kill -9`` or the OOM killer does)
SIGKILL_AFTER_STEP_6 = """
import os, signal, sys
from hyla.cli import main
from hyla.train.loop import Trainer

real_step = Trainer.train_step

def step_then_sigkill(self):
    real_step(self)
    if self.step == 6:
        os.kill(os.getpid(), signal.SIGKILL)

Trainer.train_step = step_then_sigkill
sys.exit(main(sys.argv[1:]))
"""


def test_a_killed_piece_keeps_its_record_and_the_next_piece_completes_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import signal
    import subprocess
    import sys

    path = write_sweep(tmp_path, rows={"hyla": {"model.attention": "hyla"}}, grid={}, seeds=[0])
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert main(["sweep", str(path), "--root", str(whole)]) == 0
    [piece] = read_jsonl(whole / "tiny" / "hyla-seed0" / "made_by.jsonl")  # one piece, one complete line
    assert piece["from_step"] == 0 and piece["to_step"] == 8 and piece["ended"] and piece["wall_s"] > 0

    cmd = [sys.executable, "-c", SIGKILL_AFTER_STEP_6, "sweep", str(path), "--root", str(parts)]
    killed = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    run = parts / "tiny" / "hyla-seed0"
    [started] = read_jsonl(run / "made_by.jsonl")  # what it was, though it never said how it ended
    assert started["from_step"] == 0 and started["stacked_with"] == 1
    assert started["ended"] is None and started["to_step"] is None and started["wall_s"] is None
    assert {"commit", "machine", "device", "date"} <= set(started)
    assert run_state(run) == "stopped"
    section = sweep_section(load_sweep(str(path)), parts, tmp_path / "figures")
    assert "(not counting 1 pieces still training or killed before their end)" in section

    assert main(["sweep", str(path), "--root", str(parts)]) == 0
    assert "1 runs finished now, 0 left" in capsys.readouterr().out
    assert records(parts / "tiny") == records(whole / "tiny")
    killed_piece, resumed = read_jsonl(run / "made_by.jsonl")
    assert killed_piece == started  # left as it was; the new piece appended and completed its own line
    assert resumed["from_step"] == 4 and resumed["to_step"] == 8 and resumed["ended"] and resumed["wall_s"] > 0


def test_runs_without_dropout_train_as_one_stack_with_ordinary_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_sweep(
        tmp_path,
        rows={"hyla": {"model.attention": "hyla"}},
        grid={"train.lr": [0.001, 0.003]},
        seeds=[0],
        extra={"model.attention_dropout": "0.0", "data.split_seed": "0"},
    )
    assert main(["sweep", str(path), "--root", str(tmp_path / "r"), "--max-stack", "2"]) == 0
    assert "2 runs finished now" in capsys.readouterr().out
    made = json.loads((tmp_path / "r" / "tiny" / "hyla-lr0.003-seed0" / "made_by.jsonl").read_text())
    assert made["stacked_with"] == 2
    # what a bit-exact retrain must pin: PyTorch's CPU kernels and the C kernel's -march
    assert made["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert made["kernel_march"] == (os.environ.get("HYLA_CPU_MARCH") or "native")
    assert run_state(tmp_path / "r" / "tiny" / "hyla-lr0.003-seed0") == "done"


@pytest.mark.parametrize("seeds", [[0], [0, 1]])
def test_hyla_train_seeds_and_hyla_sweep_train_the_same_groups_with_the_same_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seeds: list[int]
) -> None:
    """One planner (:mod:`hyla.train.sweeps`): a lone run trains lone under both commands, two stackable seeds
    as one stack (a sweep told ``--max-stack 2``)."""
    from hyla.train import loop

    built: list[tuple[str, int]] = []  # (engine, runs) of each Trainer
    make_engine = loop.make_engine

    def spy(cfgs: list, outs: list[Path], engine: str, device: str) -> object:
        built.append((engine, len(cfgs)))
        return make_engine(cfgs, outs, engine, device)

    monkeypatch.setattr(loop, "make_engine", spy)
    stackable = {"model.attention_dropout": "0.0", "data.split_seed": "0"}
    path = write_sweep(tmp_path, rows={"hyla": {"model.attention": "hyla"}}, grid={}, seeds=seeds, extra=stackable)
    assert main(["sweep", str(path), "--root", str(tmp_path / "r"), "--max-stack", "2"]) == 0
    by_sweep, built[:] = list(built), []
    overrides = [*TINY_SWEEP_OVERRIDES, *(f"{k}={v}" for k, v in stackable.items()), "model.attention=hyla"]
    seeds_arg = ",".join(map(str, seeds))
    assert main(["train", "fuzzy_logic", *overrides, "--seeds", seeds_arg, "--quiet", "--out", str(tmp_path)]) == 0
    expected = [("lone", 1)] if len(seeds) == 1 else [("stacked", 2)]
    assert by_sweep == built == expected
    made = read_jsonl(tmp_path / "r" / "tiny" / "hyla-seed0" / "made_by.jsonl")
    assert [m["stacked_with"] for m in made] == [len(seeds)]


def test_where_keeps_the_runs_at_those_grid_values_and_seeds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_sweep(
        tmp_path,
        rows={"softmax": {"model.attention": "softmax"}, "hyla": {"model.attention": "hyla"}},
        grid={"train.lr": [0.001, 0.003], "train.weight_decay": [0.1, 0.03]},
        seeds=[0, 1, 2],
    )
    sweep = load_sweep(str(path))
    kept = sweep.runs(["hyla"], {"train.lr": ["1e-3"], "seed": ["2", "0"]})
    assert [r.name for r in kept] == [
        "hyla-lr0.001-weight_decay0.1-seed0",
        "hyla-lr0.001-weight_decay0.1-seed2",
        "hyla-lr0.001-weight_decay0.03-seed0",
        "hyla-lr0.001-weight_decay0.03-seed2",
    ]
    assert kept == [r for r in sweep.runs(["hyla"]) if r in kept]  # the same runs, in the sweep's order
    root = tmp_path / "r"
    argv = ["sweep", str(path), "--root", str(root), "--emit-commands"]
    assert main([*argv, "--where", "train.weight_decay=0.03", "--where", "seed=1"]) == 0
    commands = capsys.readouterr().out.strip().splitlines()
    assert len(commands) == 4 and all("weight_decay=0.03" in c and "seed=1 " in c for c in commands)
    for where, message in [
        ("train.beta2=0.9", "--where train.beta2: not a grid key of tiny; keys: train.lr, train.weight_decay, seed"),
        ("train.lr=0.01", "--where train.lr=0.01: not in the grid of tiny; train.lr values: 0.001, 0.003"),
        ("seed=3", "--where seed=3: not in the grid of tiny; seed values: 0, 1, 2"),
        ("seed", "--where takes KEY=VALUE[,VALUE...]"),
    ]:
        assert main([*argv, "--where", where]) == 2
        assert message in capsys.readouterr().err


def own_warmup_axis(tmp_path: Path) -> Path:
    """softmax on the sweep's grid; hyla adds warmup {2, 4} (the sweep's overrides set 2) as a row's own axis."""
    rows = {
        "softmax": {"model.attention": "softmax"},
        "hyla": {"model.attention": "hyla", "grid": {"train.warmup_steps": [2, 4]}},
    }
    return write_sweep(tmp_path, rows=rows, grid={"train.lr": [0.001, 0.003]}, seeds=[0, 1])


def test_a_rows_own_grid_adds_an_axis_named_only_off_the_rows_value(tmp_path: Path) -> None:
    path = own_warmup_axis(tmp_path)
    sweep = load_sweep(str(path))
    spec = yaml.safe_load(path.read_text())
    del spec["rows"]["hyla"]["grid"]
    (tmp_path / "plain.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    plain = load_sweep(str(tmp_path / "plain.yaml"))
    runs, before = sweep.runs(), plain.runs()
    # the runs at the row's own value keep their names, order and configs; the new ones say their value
    assert [r for r in runs if "warmup" not in r.name and r.row == "softmax"] == [
        r for r in before if r.row == "softmax"
    ]
    kept = [r.name for r in runs if "warmup_steps4" not in r.name]
    assert kept == [r.name for r in before]
    assert all(sweep.configs[n].to_dict() == plain.configs[n].to_dict() for n in kept)
    assert [r.name for r in runs if r.row == "hyla"][:4] == [
        "hyla-lr0.001-seed0",
        "hyla-lr0.001-seed1",
        "hyla-lr0.001-warmup_steps4-seed0",
        "hyla-lr0.001-warmup_steps4-seed1",
    ]
    assert len(runs) == 2 * 2 + 2 * 2 * 2 and sweep.configs["hyla-lr0.003-warmup_steps4-seed1"].train.warmup_steps == 4
    assert {dict(r.point).get("train.warmup_steps") for r in runs if r.row == "softmax"} == {None}
    assert sweep.axis_keys() == ["train.lr", "train.warmup_steps"] and sweep.row_values("softmax") == {
        "train.warmup_steps": 2
    }
    for rows, message in [
        ({"hyla": {"grid": {"train.lr": [0.01]}}}, "row hyla: grid key train.lr is already an axis of every run"),
        ({"hyla": {"grid": {"train.nope": [1]}}}, "row hyla: grid key train.nope is not a key of its config"),
        ({"hyla": {"grid": {"train.warmup_steps": []}}}, "row hyla: grid must map keys to non-empty lists"),
    ]:
        with pytest.raises(ValueError, match=message):
            load_sweep(str(write_sweep(tmp_path, rows=rows, grid={"train.lr": [0.001]}, seeds=[0])))


def test_the_sraven_main_rows_sweep_warmup_and_the_ablation_rows_do_not(tmp_path: Path) -> None:
    sweep = load_sweep("table_a1_sraven")
    spec = yaml.safe_load(sweep.path.read_text())
    for row in spec["rows"].values():
        row.pop("grid", None)
    (tmp_path / "plain.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    before = [r.name for r in load_sweep(str(tmp_path / "plain.yaml")).runs()]
    runs = sweep.runs()
    assert [r.name for r in runs if "warmup" not in r.name] == before  # the records' names, in their order
    assert "hyla-lr0.001-weight_decay0.1-seed0" in before
    main_rows = {"softmax", "linear", "hyla"}
    warmups: dict[str, set[int]] = {}
    for r in runs:
        warmups.setdefault(r.row, set()).add(sweep.configs[r.name].train.warmup_steps)
    assert all(warmups[row] == ({1000, 3000} if row in main_rows else {1000}) for row in sweep.rows)
    new = sweep.runs(where={"train.warmup_steps": ["3000"]})
    assert len(new) == 3 * 4 * 3 and {r.row for r in new} == main_rows
    assert all(r.name.endswith(f"-warmup_steps3000-seed{r.seed}") for r in new)
    # warmup 1000: every row, ablation rows too (their config's warmup)
    assert [r.name for r in sweep.runs(where={"train.warmup_steps": ["1e3"]})] == before


def test_where_on_a_rows_own_axis(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = own_warmup_axis(tmp_path)
    sweep = load_sweep(str(path))
    assert [r.name for r in sweep.runs(where={"train.warmup_steps": ["4"], "seed": ["0"]})] == [
        "hyla-lr0.001-warmup_steps4-seed0",
        "hyla-lr0.003-warmup_steps4-seed0",
    ]
    at_two = sweep.runs(where={"train.warmup_steps": ["2"]})
    assert {r.row for r in at_two} == {"softmax", "hyla"} and not any("warmup" in r.name for r in at_two)
    argv = ["sweep", str(path), "--root", str(tmp_path / "r"), "--emit-commands"]
    assert main([*argv, "--where", "train.warmup_steps=4"]) == 0
    commands = capsys.readouterr().out.strip().splitlines()
    assert len(commands) == 4 and all("train.warmup_steps=4 " in c and "model.attention=hyla" in c for c in commands)
    assert main([*argv, "--where", "train.warmup_steps=3"]) == 2
    assert "train.warmup_steps values: 2, 4" in capsys.readouterr().err


def test_the_report_chooses_each_rows_point_over_its_own_axes(tmp_path: Path) -> None:
    from tiny import fake_record

    path = own_warmup_axis(tmp_path)
    sweep = load_sweep(str(path))
    records = tmp_path / "sweeps" / "tiny"
    for spec in sweep.runs():
        point = dict(spec.point)
        # hyla is best in distribution at warmup 4 (lr 0.001), softmax at lr 0.003
        on_lr = point["train.lr"] == 0.001
        best = on_lr and point["train.warmup_steps"] == 4 if spec.row == "hyla" else point["train.lr"] == 0.003
        fake_record(records, spec, test=0.95 if best else 0.90 if on_lr else 0.80, ood=0.5 + 0.01 * spec.seed)
    text = sweep_section(sweep, tmp_path / "sweeps", tmp_path / "figures", latents=0)
    assert "| row | seeds done | chosen lr, warmup_steps |" in text
    assert "| hyla | 2 | 0.001, 4 | 95.00 +- 0.00 |" in text
    assert "| softmax | 2 | 0.003, 2 | 95.00 +- 0.00 |" in text
    # every point of each row; softmax shows the warmup its runs have
    assert "| softmax | 0.001 | 2 | 2/2 | 90.00 +- 0.00 |" in text and "| softmax | 0.003 | 4 |" not in text
    assert "| hyla | 0.003 | 4 | 2/2 | 80.00 +- 0.00 |" in text and "| hyla | 0.001 | 2 | 2/2 | 90.00 +- 0.00 |" in text


def test_dry_run_and_emitted_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_sweep(
        tmp_path,
        rows={"softmax": {"model.attention": "softmax"}, "hyla": {"model.attention": "hyla"}},
        grid={},
        seeds=[0],
    )
    root = tmp_path / "r"
    assert main(["sweep", str(path), "--root", str(root), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "tiny: 2 runs, 0 done, 2 to train (cpu)" in out
    assert "softmax-seed0: new at step 0, about" in out and "hyla-seed0: new at step 0, about" in out
    assert "plan: 2 runs in 2 groups (each run alone: --max-stack 1; they differ in model.attention)" in out
    assert not root.exists()

    assert main(["sweep", str(path), "--root", str(root), "--emit-commands"]) == 0
    commands = capsys.readouterr().out.strip().splitlines()
    assert len(commands) == 2 and all(c.startswith("hyla train fuzzy_logic ") for c in commands)
    # an emitted command trains exactly the run the sweep would
    assert main(shlex.split(commands[1])[1:]) == 0
    capsys.readouterr()
    assert run_state(root / "tiny" / "hyla-seed0") == "done"
    assert main(["sweep", str(path), "--root", str(tmp_path / "ref")]) == 0
    assert records(root / "tiny")["hyla-seed0"] == records(tmp_path / "ref" / "tiny")["hyla-seed0"]
    assert main(["sweep", str(path), "--root", str(root), "--dry-run"]) == 0
    assert "hyla-seed0: done" in capsys.readouterr().out
    assert main(["sweep", str(path), "--root", str(tmp_path / "fresh"), "--dry-run", "--jobs", "2"]) == 0
    out = capsys.readouterr().out
    assert "with --jobs 2: about" in out and f"({worker_threads(2)} threads each;" in out


def test_a_busy_machine_is_probed_with_its_idle_cores_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """More probe threads than idle cores measure the fight for the cores, not the run."""
    assert probe_threads(2, cores=2, load=0.0) == 2
    assert probe_threads(2, cores=2, load=1.2) == 1
    assert probe_threads(2, cores=2, load=4.0) == 1  # at least one
    assert probe_threads(4, cores=16, load=3.0) == 4  # enough idle cores: what was wanted
    assert probe_threads(16, cores=16, load=3.0) == 13

    path = write_sweep(tmp_path, rows={"softmax": {"model.attention": "softmax"}}, grid={}, seeds=[0])
    probed: list[int | None] = []

    def fake_estimate(cfg: object, device: str, cache: object, step: int, threads: int | None, to: object) -> float:
        probed.append(threads)
        return 60.0

    monkeypatch.setattr(sweep_estimate, "estimate_seconds", fake_estimate)
    monkeypatch.setattr(sweep_estimate.os, "cpu_count", lambda: 4)
    for load, expected in ((0.0, torch.get_num_threads()), (3.0, 1)):
        monkeypatch.setattr(sweep_estimate.os, "getloadavg", lambda load=load: (load, load, load))
        assert main(["sweep", str(path), "--root", str(tmp_path / "r"), "--dry-run"]) == 0
        assert probed.pop() == min(expected, 4 - round(load))
    capsys.readouterr()


def test_seconds_left_counts_the_steps_and_evaluations_up_to_the_stop() -> None:
    cfg = load_config("fuzzy_logic", ["train.steps=8", "train.eval_every=2"])
    assert seconds_left(cfg, 1.0, 10.0) == 8 + 10 * 4
    assert seconds_left(cfg, 1.0, 10.0, to_step=4) == 4 + 10 * 2
    assert seconds_left(cfg, 1.0, 10.0, from_step=2, to_step=5) == 3 + 10 * 2
    assert seconds_left(cfg, 1.0, 10.0, to_step=100) == seconds_left(cfg, 1.0, 10.0)
    assert seconds_left(cfg, 1.0, 10.0, from_step=4, to_step=4) == 0.0


def test_wall_seconds_starts_each_group_on_the_first_free_worker() -> None:
    assert wall_seconds([3.0, 1.0, 1.0, 1.0], jobs=2) == 3.0
    assert wall_seconds([1.0, 1.0, 1.0], jobs=2) == 2.0
    assert wall_seconds([1.0, 3.0, 1.0, 1.0], jobs=2) == 3.0
    assert wall_seconds([2.0, 2.0], jobs=1) == 4.0


@pytest.mark.slow
def test_submitit_local_launcher_trains_one_job_per_stack_group(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("submitit")
    # two rows x two seeds, the split following the seed: each row's two seeds stack
    path = two_rows_two_seeds(tmp_path)
    root = tmp_path / "r"
    stacks = ["--max-stack", "2"]
    assert main(["sweep", str(path), "--root", str(root), "--launcher", "submitit-local", *stacks]) == 0
    assert "submitted 2 jobs for 4 runs (submitit-local; runs per job: 2, 2)" in capsys.readouterr().out
    assert main(["sweep", str(path), "--root", str(tmp_path / "ref"), *stacks]) == 0
    assert records(root / "tiny") == records(tmp_path / "ref" / "tiny")


def test_slurm_settings_come_from_the_sweep_file_and_the_command_line(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, rows={"hyla": {"model.attention": "hyla"}}, grid={}, seeds=[0])
    spec = yaml.safe_load(path.read_text())
    spec["slurm"] = {"partition": "gpu", "account": "lab", "time": 120, "cpus": 8, "mem_gb": 32}
    path.write_text(yaml.safe_dump(spec))
    sweep = load_sweep(str(path))
    sweep.slurm.update(check_slurm(sweep_cli.parse_slurm(["qos=high", "time=90"]), "--slurm"))
    assert sweep_launch.executor_parameters(sweep.slurm, "cuda") == {
        "timeout_min": 90,
        "gpus_per_node": 1,
        "cpus_per_task": 8,
        "mem_gb": 32,
        "slurm_partition": "gpu",
        "slurm_account": "lab",
        "slurm_qos": "high",
    }
    spec["slurm"] = {"partitio": "gpu"}
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(ValueError, match="slurm: unknown key 'partitio'; allowed keys: partition, account"):
        load_sweep(str(path))
    with pytest.raises(ValueError, match="--slurm: time must be a number >= 0"):
        check_slurm(sweep_cli.parse_slurm(["time=soon"]), "--slurm")


@pytest.mark.slow
def test_a_preempted_job_requeues_and_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    """submitit's local executor, preempted (its timeout/preemption signal) once the run has a checkpoint:
    the job requeues itself and the run ends with the records of an uninterrupted one."""
    submitit = pytest.importorskip("submitit")
    import signal
    import subprocess

    path = write_sweep(
        tmp_path,
        rows={"softmax": {"model.attention": "softmax"}},
        grid={},
        seeds=[0],
        extra={
            "train.steps": "300",
            "train.eval_every": "150",
            "train.checkpoint_every": "20",
            "train.log_every": "20",
        },
    )
    sweep = load_sweep(str(path))
    root = tmp_path / "r" / sweep.name
    executor = submitit.AutoExecutor(folder=str(tmp_path / "jobs"), cluster="local")
    executor.update_parameters(timeout_min=60)
    job = executor.submit(sweep_launch.GroupJob(str(path), str(root), "cpu", []), [s.name for s in sweep.runs()])
    run = root / sweep.runs()[0].name
    hang_guard = time.monotonic() + HANG_GUARD_S  # only ends a hang; the wait is for the first checkpoint
    while not (run / "checkpoints" / "latest").is_file() and time.monotonic() < hang_guard and not job.done():
        time.sleep(0.1)
    assert not job.done(), "the run ended before it could be preempted: give it more steps"
    # what SLURM's preemption or time-limit signal does to a job: submitit's USR2 to the task (the local
    # controller forwards it the same way near its time limit) makes it checkpoint itself and requeue
    controller = job._process.pid
    task = int(subprocess.run(["pgrep", "-P", str(controller)], capture_output=True, text=True).stdout.split()[0])
    os.kill(task, signal.SIGUSR2)
    job.result()
    assert run_state(run) == "done"
    assert "Requeued" in job.stdout() + (job.stderr() or "")
    made_by = [json.loads(line) for line in (run / "made_by.jsonl").read_text().splitlines()]
    # the preempted piece, then the requeued one from the newest checkpoint (every 20 steps) before it
    assert len(made_by) == 2 and 0 < made_by[1]["from_step"] <= made_by[0]["to_step"] < 300
    assert made_by[1]["from_step"] % 20 == 0 and made_by[1]["to_step"] == 300
    assert main(["sweep", str(path), "--root", str(tmp_path / "ref")]) == 0
    assert records(root) == records(tmp_path / "ref" / sweep.name)


def test_parallel_jobs_write_the_records_of_one_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = two_rows_two_seeds(tmp_path)
    stacks = ["--max-stack", "2"]  # each row's seeds one stack: one worker a stack
    monkeypatch.setattr(os, "cpu_count", lambda: 2)  # one thread per worker
    with torch_threads(1):  # the one-job run in this process: the same arithmetic
        assert main(["sweep", str(path), "--root", str(tmp_path / "one"), *stacks]) == 0
    capsys.readouterr()
    assert main(["sweep", str(path), "--root", str(tmp_path / "two"), "--jobs", "2", *stacks]) == 0
    out = capsys.readouterr().out
    assert "2 groups over 2 workers (1 threads each)" in out and "4 runs finished now, 0 left" in out
    finished = [line.removeprefix("finished: ") for line in out.splitlines() if line.startswith("finished")]
    assert len(finished) == 2  # one line a stack, naming its runs
    assert sorted(", ".join(finished).split(", ")) == sorted(run.name for run in (tmp_path / "two" / "tiny").iterdir())
    assert records(tmp_path / "two" / "tiny") == records(tmp_path / "one" / "tiny")
    for line in finished:  # a stack's progress goes to its first run's log
        assert "step 8/8" in (tmp_path / "two" / "tiny" / line.split(", ")[0] / "train.log").read_text()
    for run in (tmp_path / "two" / "tiny").iterdir():
        assert len((run / "made_by.jsonl").read_text().splitlines()) == 1
    assert main(["sweep", str(path), "--jobs", "0", "--dry-run"]) == 2
    assert "--jobs must be >= 1, got 0" in capsys.readouterr().err


def test_sigterm_stops_parallel_jobs_with_checkpoints_and_starts_nothing_new(tmp_path: Path) -> None:
    """SIGTERM to ``hyla sweep --jobs 2``: the two running runs save and stop, the queued two never start,
    the command exits 143 and leaves no worker behind."""
    import signal
    import subprocess
    import sys

    long = {"train.steps": 100000, "train.log_every": 10, "train.eval_every": 100000, "train.checkpoint_every": 100000}
    rows = {"softmax": {"model.attention": "softmax"}, "hyla": {"model.attention": "hyla"}}
    # four runs that do not stack (two rows x two depths), so that two train and two wait
    grid = {"model.num_layers": [1, 2]}
    path = write_sweep(tmp_path, rows=rows, grid=grid, seeds=[0], extra={k: str(v) for k, v in long.items()})
    root = tmp_path / "r"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "hyla", "sweep", str(path), "--root", str(root), "--jobs", "2"]
    # Waits below are for events (two runs training, the sweep exiting), however long a busy machine takes
    # to spawn and import; the bound only ends a sweep that hangs, it does not time anything.
    hang_guard_s = HANG_GUARD_S
    sweep = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        started: list[Path] = []
        give_up = time.monotonic() + hang_guard_s
        while time.monotonic() < give_up:  # until both workers train (each has logged a step) or the sweep ends
            logs = list(root.glob("tiny/*/train.log"))
            started = [log.parent for log in logs if "step " in log.read_text()]
            if len(started) == 2 or sweep.poll() is not None:
                break
            time.sleep(0.2)
        assert len(started) == 2, sweep.communicate() if sweep.poll() is not None else "hung: no two runs training"
        children = subprocess.run(["pgrep", "-P", str(sweep.pid)], capture_output=True, text=True).stdout.split()
        workers = [pid for pid in children if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text()]
        sweep.send_signal(signal.SIGTERM)
        out, err = sweep.communicate(timeout=hang_guard_s)
    finally:
        if sweep.poll() is None:
            sweep.kill()
    assert sweep.returncode == 143, (out, err)
    states = {run.name: run_state(run) for run in (root / "tiny").iterdir()}
    assert sorted(name for name, state in states.items() if state == "stopped") == sorted(r.name for r in started)
    assert all(state == "new" for name, state in states.items() if name not in {r.name for r in started})
    assert not any((root / "tiny" / name / "train.log").exists() for name, st in states.items() if st == "new")
    for run in started:
        made = json.loads((run / "made_by.jsonl").read_text())
        assert 0 < made["to_step"] < long["train.steps"]
    assert len(workers) == 2
    alive = [pid for pid in workers if Path(f"/proc/{pid}").exists()]
    assert not alive, f"workers still running after the sweep exited: {alive}"


def test_interrupted_survives_pickling() -> None:
    import pickle
    import signal

    from hyla.train.loop import Interrupted

    err = pickle.loads(pickle.dumps(Interrupted(signal.SIGTERM)))
    assert isinstance(err, Interrupted) and err.signum == signal.SIGTERM and str(err) == "SIGTERM"


def test_a_piece_that_rounds_otherwise_than_the_last_one_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Resuming on a CPU whose kernels round otherwise is allowed, but the sweep says which variable to set
    to continue alike (a bit-exact retrain of the record then needs the same)."""
    from hyla.ops.clib import source_digest
    from hyla.sweep.groups import rounding_change
    from hyla.train.loop import Trainer

    path = write_sweep(tmp_path, rows={"hyla": {"model.attention": "hyla"}}, grid={}, seeds=[0])
    run = tmp_path / "r" / "tiny" / "hyla-seed0"
    here = {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "kernel_march": "native",
        "kernel_source": source_digest(),
    }
    assert rounding_change(run, here) is None  # nothing recorded yet
    trainer = Trainer(load_sweep(str(path)).configs["hyla-seed0"], run, quiet=True)
    trainer.stop_at_step = 4
    try:
        trainer.run()
    finally:
        trainer.close()
    # an earlier piece of older code recorded neither setting: nothing to compare
    (run / "made_by.jsonl").write_text(json.dumps({"commit": "old", "from_step": 0, "to_step": 4}) + "\n")
    assert rounding_change(run, here) is None
    earlier = {"commit": "old", "from_step": 0, "to_step": 4, **here, "kernel_march": "x86-64-v2"}
    (run / "made_by.jsonl").write_text(json.dumps(earlier) + "\n")
    monkeypatch.delenv("HYLA_CPU_MARCH", raising=False)
    with pytest.warns(
        UserWarning, match=r"kernel_march=x86-64-v2, this one with kernel_march=native; .* HYLA_CPU_MARCH=x86-64-v2$"
    ):
        assert main(["sweep", str(path), "--root", str(tmp_path / "r")]) == 0
    assert run_state(run) == "done"
    assert "ATEN_CPU_CAPABILITY" not in (rounding_change(run, {**here, "kernel_march": "x86-64-v3"}) or "")
    # a piece on another version of the C kernel (which may sum in another order) names the commit to use
    newer = rounding_change(run, {**here, "kernel_march": "x86-64-v2", "kernel_source": "0123456789ab"})
    last_commit = json.loads((run / "made_by.jsonl").read_text().splitlines()[-1])["commit"]
    assert newer is not None and newer.endswith(f"train from a worktree of commit {last_commit}")
    # after a piece with torch's tanh GELU, one with the C kernel's names the setting that keeps torch's
    pieces = (run / "made_by.jsonl").read_text().splitlines()
    last = {**json.loads(pieces[-1]), "gelu": "torch"}
    (run / "made_by.jsonl").write_text("\n".join([*pieces[:-1], json.dumps(last)]) + "\n")
    fast_gelu = rounding_change(run, {**here, "kernel_march": last["kernel_march"], "gelu": "c_kernel"})
    assert fast_gelu is not None and fast_gelu.endswith("set HYLA_FAST_GELU=off")


def test_moe_pieces_name_how_their_experts_were_computed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU piece of an MoE model records ``moe`` (routed or dense); a piece recorded before that key computed
    the experts densely, so a routed piece after it names the setting that keeps the dense form."""
    from hyla.sweep.groups import provenance, rounding_change

    assert "moe" not in provenance("cpu") and provenance("cpu", mixture_of_experts=True)["moe"] == "routed"
    monkeypatch.setenv("HYLA_MOE_DISPATCH", "dense")
    assert provenance("cpu", mixture_of_experts=True)["moe"] == "dense"
    run = tmp_path / "run"
    run.mkdir()
    (run / "made_by.jsonl").write_text(json.dumps({"commit": "old", "device": "cpu (x86_64, 1 threads)"}) + "\n")
    change = rounding_change(run, {"moe": "routed"})
    assert change is not None and change.endswith("set HYLA_MOE_DISPATCH=dense")
    assert rounding_change(run, {"moe": "dense"}) is None
    assert rounding_change(run, {}) is None  # a model without MoE layers records no such key
    (run / "made_by.jsonl").write_text(json.dumps({"commit": "old", "device": "cuda (NVIDIA H100)"}) + "\n")
    assert rounding_change(run, {"moe": "routed"}) is None  # a GPU piece's rounding is another matter
    (run / "made_by.jsonl").write_text(json.dumps({"device": "cpu (x86_64, 1 threads)", "moe": "routed"}) + "\n")
    assert rounding_change(run, {"moe": "dense"}).endswith("set HYLA_MOE_DISPATCH=auto")


def test_a_sweep_trains_each_run_alone_unless_told(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One row's four seeds could stack, but a sweep trains them one after another (a stack trained slower per
    run on a CPU and on an H100), so that each run finishes and lands on its own; ``--max-stack`` stacks."""
    from hyla.train.sweeps import plan_groups

    path = write_sweep(tmp_path, rows={"hyla": {"model.attention": "hyla"}}, grid={}, seeds=[0, 1, 2, 3])
    root = str(tmp_path / "r")
    for jobs in ("1", "2"):
        assert main(["sweep", str(path), "--root", root, "--dry-run", "--jobs", jobs]) == 0
        assert "plan: 4 runs in 4 groups (each run alone: --max-stack 1)" in capsys.readouterr().out
    assert main(["sweep", str(path), "--root", root, "--dry-run", "--max-stack", "3"]) == 0
    assert "plan: 4 runs in 2 groups (stacks of at most 3: --max-stack)" in capsys.readouterr().out
    assert main(["sweep", str(path), "--root", root, "--dry-run", "--max-stack", "0"]) == 2
    assert "--max-stack must be >= 1 (1: each run alone), got 0" in capsys.readouterr().err
    cfgs = list(load_sweep(str(path)).configs.values())
    assert plan_groups(cfgs) == [[0, 1, 2, 3]]  # uncapped, the row is one stack
    assert plan_groups(cfgs, max_stack=3) == [[0, 1, 2], [3]]
    with pytest.raises(ValueError, match="max_stack must be >= 1, got 0"):
        plan_groups(cfgs, max_stack=0)


def test_the_run_nearest_its_end_trains_first_and_a_done_one_not_at_all(tmp_path: Path) -> None:
    """Under a time budget the group with the fewest steps left goes first (ties in sweep order), so a run near
    its end finishes instead of waiting behind new ones; a finished run is left out of the plan."""
    from hyla.sweep.groups import plan_sweep, states_and_pending
    from hyla.train.loop import Trainer

    path = write_sweep(tmp_path, rows={"hyla": {"model.attention": "hyla"}}, grid={}, seeds=[0, 1, 2, 3])
    sweep = load_sweep(str(path))
    root = tmp_path / "r" / sweep.name
    for name, stop_at in (("hyla-seed3", 4), ("hyla-seed1", None)):
        trainer = Trainer(sweep.configs[name], root / name, quiet=True)
        trainer.stop_at_step = stop_at
        try:
            trainer.run()
        finally:
            trainer.close()
    states, pending = states_and_pending(sweep.runs(), root)
    assert states == {"hyla-seed0": "new", "hyla-seed1": "done", "hyla-seed2": "new", "hyla-seed3": "stopped"}
    assert [s.name for s in pending] == ["hyla-seed0", "hyla-seed2", "hyla-seed3"]
    groups = plan_sweep(pending, sweep.configs, states, root)
    assert [[s.name for s in g.specs] for g in groups] == [["hyla-seed3"], ["hyla-seed0", "hyla-seed2"]]
    assert [(g.resume, g.resume_from) for g in groups] == [(True, 4), (False, None)]


def test_each_piece_records_what_can_change_its_numbers(tmp_path: Path) -> None:
    """Provenance per piece: the step's settings (fast path, graph step, TF32, bf16, the cadences), the software
    versions, the CPU with its family and model, and the command line, beside commit, machine and device."""
    import torch

    path = write_sweep(tmp_path, rows={"hyla": {"model.attention": "hyla"}}, grid={}, seeds=[0])
    assert main(["sweep", str(path), "--root", str(tmp_path / "r")]) == 0
    (piece,) = read_jsonl(next((tmp_path / "r" / "tiny").glob("*/made_by.jsonl")))
    settings = piece["settings"]
    assert settings["train.fast"] is False and settings["train.tf32"] is True and settings["train.bf16"] is False
    assert settings["train.eval_every"] == 4 and settings["train.steps"] == 8  # TINY_SWEEP_OVERRIDES
    assert piece["versions"]["torch"] == torch.__version__ and piece["versions"]["cuda"] is None
    assert "(family " in piece["cpu"] or not Path("/proc/cpuinfo").exists()  # Zen 3 and Zen 5 told apart
    assert isinstance(piece["command"], str) and piece["command"]


def test_a_resumed_piece_names_the_settings_it_changed_and_config_yaml_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A piece resumed with other settings (``--override``) records them as ``config_changes``; the run's
    ``config.yaml`` stays as created and its readers see the change."""
    path = write_sweep(tmp_path, rows={"hyla": {"model.attention": "hyla"}}, grid={}, seeds=[0])
    root = tmp_path / "r"
    clock = itertools.count()  # one second per reading: the first piece stops a few steps in (see above)
    monkeypatch.setattr(time, "monotonic", lambda: float(next(clock)))
    assert main(["sweep", str(path), "--root", str(root), "--max-minutes", "0.1"]) == 0
    monkeypatch.undo()
    (run,) = (root / "tiny").iterdir()
    created = (run / "config.yaml").read_bytes()
    assert run_state(run) == "stopped"
    assert main(["sweep", str(path), "--root", str(root), "--override", "train.eval_every=2"]) == 0
    first, second = read_jsonl(run / "made_by.jsonl")
    assert "config_changes" not in first and second["config_changes"] == {"train.eval_every": 2}
    assert (run / "config.yaml").read_bytes() == created
    assert read_run(run).config["train"]["eval_every"] == 2 and run_state(run) == "done"


def test_stop_at_step_stops_each_run_there_on_its_own_schedule_and_a_later_sweep_finishes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_sweep(
        tmp_path,
        rows={"softmax": {"model.attention": "softmax"}, "hyla": {"model.attention": "hyla"}},
        grid={},
        seeds=[0],
    )
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert main(["sweep", str(path), "--root", str(whole)]) == 0
    capsys.readouterr()

    assert main(["sweep", str(path), "--root", str(parts), "--stop-at-step", "4"]) == 0
    out = capsys.readouterr().out
    assert "0 runs finished now, 2 left (stopped at step 4 (--stop-at-step); a sweep without it continues them)" in out
    for name in ("softmax-seed0", "hyla-seed0"):
        assert run_state(parts / "tiny" / name) == "stopped"
        made = read_jsonl(parts / "tiny" / name / "made_by.jsonl")
        assert [(m["from_step"], m["to_step"]) for m in made] == [(0, 4)]
        # the schedule is the 8-step one: the first 4 steps' records are the uninterrupted run's
        cut = [r for r in read_jsonl(whole / "tiny" / name / "metrics.jsonl") if r["step"] <= 4]
        assert read_jsonl(parts / "tiny" / name / "metrics.jsonl") == cut

    # at the step already: nothing trains, nothing is rewritten, and no command is emitted
    before = {p: p.stat().st_mtime_ns for p in (parts / "tiny").glob("*/metrics.jsonl")}
    assert main(["sweep", str(path), "--root", str(parts), "--stop-at-step", "3"]) == 0
    assert "0 of 2 runs are done, 2 at step 3 or past it (--stop-at-step)" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in before} == before
    assert main(["sweep", str(path), "--root", str(parts), "--stop-at-step", "4", "--emit-commands"]) == 0
    assert capsys.readouterr().out.strip() == ""
    assert main(["sweep", str(path), "--root", str(parts), "--stop-at-step", "4", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "tiny: 2 runs, 0 done, 0 to train, 2 at --stop-at-step 4 or past it (cpu)" in out
    assert "estimated: 0.0 min for the 0 runs left" in out
    assert main(["sweep", str(path), "--root", str(parts), "--stop-at-step", "6", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "tiny: 2 runs, 0 done, 2 to train (cpu)" in out and "hyla-seed0: stopped at step 4, about" in out
    assert " min to step 6" in out
    assert main(["sweep", str(path), "--root", str(parts), "--stop-at-step", "6", "--emit-commands"]) == 0
    commands = capsys.readouterr().out.strip().splitlines()
    assert len(commands) == 2 and all(c.endswith("--resume --stop-at-step 6") for c in commands)

    # without it the runs finish, with the records of the uninterrupted sweep
    assert main(["sweep", str(path), "--root", str(parts)]) == 0
    assert "2 runs finished now, 0 left" in capsys.readouterr().out
    assert records(parts / "tiny") == records(whole / "tiny")


@pytest.mark.parametrize(
    "extra",
    [["--stop-at-step", "0"], ["--stop-at-step", "4", "--launcher", "slurm"]],
    ids=["not positive", "not local"],
)
def test_a_bad_stop_at_step_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str]
) -> None:
    path = write_sweep(tmp_path, rows={"softmax": {"model.attention": "softmax"}}, grid={}, seeds=[0])
    assert main(["sweep", str(path), "--root", str(tmp_path / "r"), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hyla sweep: error: --stop-at-step ")
    assert not (tmp_path / "r").exists()
