"""`hyla report --paper`: selection by in-distribution validation, agreement with the paper, rows not run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from hyla.analysis.paper_report import agreement, paper_report
from hyla.analysis.selection import sweep_results
from hyla.analysis.stats import first_reaching
from hyla.cli import main
from hyla.train.sweeps import load_sweep
from tiny import fake_record


def tiny_table_a1(tmp_path: Path, rows: dict[str, dict[str, str]]) -> Path:
    """A Table A1 sweep file (the report looks up the paper's values) over lr {1e-3, 3e-3} x seeds 0-2."""
    sweep_file = tmp_path / "table_a1_tiny.yaml"
    spec = {"name": "table_a1_tiny", "config": "fuzzy_logic", "rows": rows, "grid": {"train.lr": [0.001, 0.003]}}
    sweep_file.write_text(yaml.safe_dump({**spec, "seeds": [0, 1, 2]}))
    return sweep_file


def test_rows_are_chosen_by_in_distribution_validation_never_by_ood(tmp_path: Path) -> None:
    sweep_file = tiny_table_a1(tmp_path, {"hyla": {"model.attention": "hyla"}, "linear": {"model.attention": "linear"}})
    sweep = load_sweep(str(sweep_file))
    records = tmp_path / "sweeps" / "table_a1_tiny"
    for spec in sweep.runs(["hyla"]):
        better_id = dict(spec.point)["train.lr"] == 0.003  # higher test R^2, lower OOD R^2
        fake_record(records, spec, test=0.95 if better_id else 0.90, ood=0.70 + 0.01 * spec.seed if better_id else 0.85)
    text = paper_report(tmp_path / "out", tmp_path / "sweeps", [str(sweep_file)])
    hyla_row = next(line for line in text.splitlines() if line.startswith("| hyla | 3 |"))
    cells = [c.strip() for c in hyla_row.split("|")[1:-1]]
    assert cells[2] == "0.003" and cells[3] == "95.00 +- 0.00" and cells[4] == "71.00 +- 0.58"
    assert cells[5] == "81.13 +- 7.77" and cells[6] == "yes (-10.1)"  # 2 combined s.e. = 15.6
    assert "| linear | 0 | not run yet | - | - | 59.89 +- 5.22 | - |" in text
    assert "| hyla | 0.001 | 3/3 | 90.00 +- 0.00 | 85.00 +- 0.00 |" in text
    assert "Commits: abc1234." in text and "wall time so far: 0.10 h" in text
    assert (tmp_path / "out" / "paper" / "table_a1_tiny_ood.png").read_bytes()[:4] == b"\x89PNG"


def test_a_grid_point_with_fewer_finished_seeds_does_not_win_on_one_seed(tmp_path: Path) -> None:
    sweep_file = tiny_table_a1(tmp_path, {"hyla": {"model.attention": "hyla"}})
    records = tmp_path / "sweeps" / "table_a1_tiny"
    for spec in load_sweep(str(sweep_file)).runs(["hyla"]):
        if dict(spec.point)["train.lr"] == 0.001:
            fake_record(records, spec, test=0.90, ood=0.80)
        elif spec.seed == 0:  # one lucky seed at the other point, higher in-distribution
            fake_record(records, spec, test=0.99, ood=0.50)
    text = paper_report(tmp_path / "out", tmp_path / "sweeps", [str(sweep_file)])
    assert "| hyla | 3 | 0.001 | 90.00 +- 0.00 | 80.00 +- 0.00 |" in text
    assert "| hyla | 0.003 | 1/3 | 99.00 | 50.00 |" in text


def test_the_paper_value_is_read_at_each_point_from_its_config_not_from_the_sweep_name(tmp_path: Path) -> None:
    fuzzy = {r.row: r.paper for r in sweep_results(load_sweep("table_a1_fuzzy"), tmp_path).rows}
    assert fuzzy["hyla"] == (81.13, 7.77) and fuzzy["softmax_moe"] == (63.83, 6.07)
    assert {r.row: r.paper for r in sweep_results(load_sweep("table_a1_sraven"), tmp_path).rows}["hyla_moe"] == (
        66.94,
        3.94,
    )
    figure = sweep_results(load_sweep("fig2c_fuzzy"), tmp_path)
    assert {(dict(p)["data.holdout"], dict(p)["data.num_examples"]) for _, p in figure.paper} == {(0.7, 32)}
    assert figure.paper[("hyla", (("data.holdout", 0.7), ("data.num_examples", 32)))] == (81.13, 7.77)
    assert all(r.paper is None for r in figure.rows)  # not run: its points do not share one paper value
    mine = tmp_path / "mine.yaml"  # any name; off Table A1's setting (held-out 0.5) the paper has no number
    rows = {"hyla": {"model.attention": "hyla"}, "odd": {"model.attention": "hyla", "data.holdout": 0.5}}
    mine.write_text(yaml.safe_dump({"name": "mine", "config": "fuzzy_logic", "rows": rows, "seeds": [0]}))
    assert [r.paper for r in sweep_results(load_sweep(str(mine)), tmp_path).rows] == [(81.13, 7.77), None]


def test_agreement() -> None:
    assert agreement((60.0, 1.0), (63.28, 2.31), 3).startswith("yes")
    assert agreement((50.0, 1.0), (63.28, 2.31), 3) == "no (-13.3)"
    assert agreement((50.0, float("nan")), (63.28, 2.31), 1) == "n/a (1 seed)"


def test_report_paper_cli_on_empty_records(tmp_path: Path) -> None:
    assert main(["report", "--paper", "--out", str(tmp_path), "--sweep-root", str(tmp_path / "none")]) == 0
    text = (tmp_path / "paper.md").read_text()
    assert "## table_a1_fuzzy" in text and "## table_a1_sraven" in text and "## fig2c_fuzzy" in text
    assert "0 of 144 runs finished" in text and "## init_fuzzy" not in text  # a follow-up shows once it has records
    (tmp_path / "none" / "init_fuzzy").mkdir(parents=True)
    assert main(["report", "--paper", "--out", str(tmp_path), "--sweep-root", str(tmp_path / "none")]) == 0
    assert "## init_fuzzy" in (tmp_path / "paper.md").read_text()
    assert main(["report", "--out", str(tmp_path)]) == 2


def _trained_tiny_sweep(tmp_path: Path, config: str) -> Path:
    """A finished tiny ``table_a1_tiny`` sweep of ``config`` (softmax and HYLA, 2 layers, 4 steps), records in
    ``tmp_path / "sweeps"``; its sweep file."""
    from tiny import tiny_overrides

    overrides = dict(o.split("=", 1) for o in tiny_overrides(layers=2, steps=4, every=4))
    spec = {
        "name": "table_a1_tiny",
        "config": config,
        "rows": {"softmax": {"model.attention": "softmax"}, "hyla": {"model.attention": "hyla"}},
        "grid": {"train.lr": [0.001]},
        "seeds": [0],
        "overrides": {k: yaml.safe_load(v) for k, v in overrides.items()},
    }
    sweep_file = tmp_path / "table_a1_tiny.yaml"
    sweep_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    assert main(["sweep", str(sweep_file), "--root", str(tmp_path / "sweeps")]) == 0
    return sweep_file


@pytest.mark.slow
def test_trained_runs_get_the_latent_code_section(tmp_path: Path, quick_tsne: None) -> None:
    """Finished runs that kept their weights: the paper report probes their latent code per layer
    (Fig. 5F) and draws their codes per rule (Fig. 5B/5E), HYLA beside softmax."""
    sweep_file = _trained_tiny_sweep(tmp_path, "sraven")
    for row in ("softmax", "hyla"):
        run = tmp_path / "sweeps" / "table_a1_tiny" / f"{row}-lr0.001-seed0"
        assert (run / "model.safetensors").is_file()
    text = paper_report(tmp_path / "out", tmp_path / "sweeps", [str(sweep_file)], latents=64)
    section = text[text.index("### The latent code of the trained models") :]
    assert "| configuration | run | layer 0 | layer 1 | all | chance |" in section
    for row in ("softmax", "hyla"):
        assert f"| {row} | {row}-lr0.001-seed0 |" in section
    figures = re.findall(r"!\[[^]]*\]\(([^)]+)\)", section)
    assert figures and all((tmp_path / "out" / f).read_bytes()[:4] == b"\x89PNG" for f in figures)
    # the sweep's name leads every figure's name: two sweeps' sections never overwrite each other's pictures
    assert all(Path(f).name.startswith("table_a1_tiny_") for f in figures)
    assert "not computed (needs >= 3 runs; 2 here)" in section and "nan" not in section
    # Fig. 5B/5E: training and held-out tasks' codes, softmax beside HYLA in one table row per picture
    table = [line for line in section.splitlines() if line.startswith("| training tasks (ID)") or "(OOD)" in line]
    assert len(table) == 6 and all(line.count("![") == 2 for line in table)


def test_trained_fuzzy_runs_get_the_term_probe_on_held_out_combinations(tmp_path: Path) -> None:
    """Fuzzy logic's latent section: the term probe fit on training combinations, scored on them and on
    held-out ones, per layer, with its figure."""
    sweep_file = _trained_tiny_sweep(tmp_path, "fuzzy_logic")
    text = paper_report(tmp_path / "out", tmp_path / "sweeps", [str(sweep_file)], latents=64)
    section = text[text.index("### The latent code of the trained models") :]
    assert "| term probe R^2 (ID) | term probe R^2 (OOD) |" in section
    assert "| configuration | run | layer 0 | layer 1 | all |" in section
    rows = [line for line in section.splitlines() if line.startswith(("| softmax |", "| hyla |"))]
    assert len(rows) == 4 and "nan" not in section  # both runs, in both tables
    figures = re.findall(r"!\[[^]]*\]\(([^)]+)\)", section)
    assert [Path(f).name for f in figures] == ["table_a1_tiny_term_probe_by_layer.png"]
    assert (tmp_path / "out" / figures[0]).read_bytes()[:4] == b"\x89PNG"


def test_grid_points_in_progress_compare_at_matched_updates(tmp_path: Path) -> None:
    """A row with an unfinished run gets a table of every one of its runs at 10k, 20k, 30k updates (and each
    50k an unfinished run passed), seed by seed, with the updates an unfinished run has reached."""
    sweep_file = tiny_table_a1(tmp_path, {"hyla": {"model.attention": "hyla"}, "linear": {"model.attention": "linear"}})
    records = tmp_path / "sweeps" / "table_a1_tiny"
    for spec in load_sweep(str(sweep_file)).runs():
        lr, finished = dict(spec.point)["train.lr"], spec.row == "linear" or dict(spec.point)["train.lr"] == 0.001
        if spec.seed != 0:
            continue
        fake_record(records, spec, test=0.5, ood=0.4, steps=60_000 if finished else 156_250)
        run = records / spec.name
        evals = [(s, 0.1 * s / 10_000 + (lr == 0.003) * 0.05) for s in (10_000, 20_000, 30_000, 50_000)]
        lines = [
            {"step": s, "split": split, "r2": v - 0.01 * (split == "ood")}
            for s, v in evals
            for split in ("test", "ood")
        ]
        final = (run / "metrics.jsonl").read_text() if finished else ""  # an unfinished run has no final line
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines) + final)
        if not finished:
            (run / "checkpoints" / "step-000051234").mkdir(parents=True)
            (run / "checkpoints" / "latest").write_text("step-000051234")
    text = paper_report(tmp_path / "out", tmp_path / "sweeps", [str(sweep_file)])
    assert "| row | lr | seed | updates reached | 10,000 | 20,000 | 30,000 | 50,000 |" in text
    assert "| hyla | 0.001 | 0 | finished | 10.0 / 9.0 | 20.0 / 19.0 | 30.0 / 29.0 | 50.0 / 49.0 |" in text
    assert "| hyla | 0.003 | 0 | 51,234 | 15.0 / 14.0 | 25.0 / 24.0 | 35.0 / 34.0 | 55.0 / 54.0 |" in text
    assert "| linear | 0.001 | 0 |" not in text  # a row whose runs are all finished has its final table only
    assert "Leaving the plateau" not in text  # fuzzy logic has no plateau level (PaperColumn.past_plateau)


def test_sraven_runs_say_when_they_left_the_plateau(tmp_path: Path) -> None:
    """Each grid point of a SRAVEN sweep lists the first evaluation at which each run reached the task's level
    past the plateau (40% OOD accuracy), in any order of the log, and where the others stand."""
    sweep_file = tmp_path / "table_a1_tiny.yaml"
    spec = {"name": "table_a1_tiny", "config": "sraven", "rows": {"hyla": {"model.attention": "hyla"}}}
    sweep_file.write_text(yaml.safe_dump({**spec, "grid": {"train.lr": [0.001, 0.0003]}, "seeds": [0, 1, 2]}))
    records = tmp_path / "sweeps" / "table_a1_tiny"
    curves = {  # (lr, seed) -> OOD accuracy at each evaluation; seed 1 is in progress, the others finished
        (0.0003, 0): [(10_000, 0.30), (30_000, 0.41), (20_000, 0.45), (40_000, float("nan"))],
        (0.0003, 1): [(10_000, 0.20), (20_000, 0.38)],
        (0.001, 0): [(10_000, 0.15), (20_000, 0.28)],
        (0.001, 1): [],  # started, not evaluated yet
    }
    for run_spec in load_sweep(str(sweep_file)).runs():
        curve = curves.get((dict(run_spec.point)["train.lr"], run_spec.seed))
        if curve is None:
            continue
        fake_record(records, run_spec, test=0.5, ood=0.5, steps=156_250 if run_spec.seed else max(curve)[0])
        lines = [{"step": s, "split": split, "acc": v} for s, v in curve for split in ("test", "ood")]
        (records / run_spec.name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    text = paper_report(tmp_path / "out", tmp_path / "sweeps", [str(sweep_file)], latents=0)
    assert "each run's OOD accuracy reached 40%" in text
    assert "| hyla | 0.0003 | 1 of 2 | 0: 20,000 | 1: 38.0 at 20,000 |" in text
    assert "| hyla | 0.001 | 0 of 2 | - | 0: 28.0 at the end; 1: no evaluation yet |" in text


def test_first_reaching_takes_the_earliest_step_at_or_above_the_level() -> None:
    curve = [(30, 0.5), (10, 0.2), (20, 0.4), (40, float("nan"))]
    assert first_reaching(curve, 0.4) == 20
    assert first_reaching(curve, 0.2) == 10
    assert first_reaching(curve, 0.6) is None
    assert first_reaching([], 0.0) is None


def test_a_row_says_among_how_many_points_it_was_chosen_and_which_seeds_trained_on_a_gpu(tmp_path: Path) -> None:
    """The choice compares only the points with the row's most finished seeds; a point with fewer (here one
    seed with a higher test R^2) is counted apart, and the table says both."""
    from hyla.analysis.paper_report import points_cell
    from hyla.analysis.selection import sweep_results

    rows_spec = {name: {"model.attention": name} for name in ("hyla", "linear", "softmax")}
    sweep_file = tiny_table_a1(tmp_path, rows_spec)
    sweep = load_sweep(str(sweep_file))
    records = tmp_path / "sweeps" / "table_a1_tiny"
    for spec in sweep.runs(["hyla"]):
        fake_record(records, spec, test=0.9, ood=0.8)
    for spec in sweep.runs(["linear"]):
        if dict(spec.point)["train.lr"] == 0.001:
            fake_record(records, spec, test=0.9, ood=0.6)
    for spec in sweep.runs(["softmax"]):
        if dict(spec.point)["train.lr"] == 0.001 or spec.seed == 0:
            fake_record(records, spec, test=0.99 if dict(spec.point)["train.lr"] == 0.003 else 0.9, ood=0.5)
    gpu_piece = {"commit": "abc1234", "machine": "m", "device": "NVIDIA H200", "date": "d", "wall_s": 6.0}
    hyla_seed1 = next(s for s in sweep.runs(["hyla"]) if s.seed == 1 and dict(s.point)["train.lr"] == 0.001)
    with (records / hyla_seed1.name / "made_by.jsonl").open("a") as f:
        f.write(json.dumps(gpu_piece) + "\n")
    rows = {r.row: r for r in sweep_results(sweep, tmp_path / "sweeps").rows}
    counts = {name: (r.points_compared, r.points_with_fewer_seeds, r.points_planned) for name, r in rows.items()}
    assert counts == {"hyla": (2, 0, 2), "linear": (1, 0, 2), "softmax": (1, 1, 2)}
    assert (dict(rows["softmax"].point)["train.lr"], rows["softmax"].seeds) == (0.001, 3)
    assert [points_cell(rows[name]) for name in ("hyla", "linear", "softmax")] == [
        "2 of 2 points",
        "1 of 2 points",
        "1 of 2 points (1 more with fewer seeds)",
    ]
    chosen_lr = dict(rows["hyla"].point)["train.lr"]
    assert rows["hyla"].partly_gpu == (1 if chosen_lr == 0.001 else 0) and rows["linear"].partly_gpu == 0


def test_a_sweep_across_keys_chooses_once_per_setting_and_draws_the_figure_with_the_paper_at_its_setting(
    tmp_path: Path,
) -> None:
    """Fig. 2C's shape: rows shown across the held-out fraction (never chosen among its values), the learning
    rate chosen at each; the paper's Table A1 value only at Table A1's setting (held-out 0.7, N = 32)."""
    from hyla.analysis.selection import sweep_results

    sweep_file = tmp_path / "fig_tiny.yaml"
    spec = {
        "name": "fig_tiny",
        "config": "fuzzy_logic",
        "rows": {"hyla": {"model.attention": "hyla"}, "linear": {"model.attention": "linear"}},
        "grid": {"data.holdout": [0.3, 0.7], "train.lr": [0.001, 0.003]},
        "across": ["data.holdout"],
        "seeds": [0, 1],
    }
    sweep_file.write_text(yaml.safe_dump(spec))
    sweep = load_sweep(str(sweep_file))
    records = tmp_path / "sweeps" / "fig_tiny"
    for s in sweep.runs(["hyla"]):
        point = dict(s.point)
        # in-distribution prefers lr 3e-3 at held-out 0.3 and 1e-3 at 0.7; OOD is higher at the other point
        better = (point["train.lr"] == 0.003) == (point["data.holdout"] == 0.3)
        ood = (0.5 if better else 0.9) - 0.2 * point["data.holdout"] + 0.01 * s.seed
        fake_record(records, s, test=0.95 if better else 0.90, ood=ood)
    rows = [
        (r.row, dict(r.across), dict(r.point).get("train.lr"), r.ood, r.paper)
        for r in sweep_results(sweep, records.parent).rows
    ]
    assert rows[0][:3] == ("hyla", {"data.holdout": 0.3}, 0.003) and rows[0][4] is None
    assert rows[1][:3] == ("hyla", {"data.holdout": 0.7}, 0.001) and rows[1][4] == (81.13, 7.77)
    assert rows[0][3][0] == pytest.approx(44.5) and rows[1][3][0] == pytest.approx(36.5)
    assert [r[0] for r in rows] == ["hyla", "hyla", "linear"] and rows[2][3] is None

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**spec, "across": ["train.steps"]}))
    with pytest.raises(ValueError, match="across must list keys of the sweep's grid"):
        load_sweep(str(bad))

    text = paper_report(tmp_path / "out", tmp_path / "sweeps", [str(sweep_file)], latents=0)
    assert "| hyla | 2 | 0.3, 0.003 | 95.00 +- 0.00 | 44.50 +- 0.50 | - | - | 2 of 2 points |" in text
    assert (
        "| hyla | 2 | 0.7, 0.001 | 95.00 +- 0.00 | 36.50 +- 0.50 | 81.13 +- 7.77 | no (-44.6) | 2 of 2 points |" in text
    )
    figure = tmp_path / "out" / "paper" / "fig_tiny_holdout.png"
    assert figure.read_bytes()[:4] == b"\x89PNG" and "(paper/fig_tiny_holdout.png)" in text
