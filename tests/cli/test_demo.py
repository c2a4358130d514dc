"""`hyla demo` end to end at a tiny size: the first steps of a sweep's seed-0 runs beside their records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from hyla.cli import main
from hyla.demo import DEMO_VARIANTS, rescored_table
from tiny import tiny_overrides

VARIANTS = ("softmax", "linear", "hyla")


def tiny_paper_sweep(tmp_path: Path) -> Path:
    """A sweep shaped like Table A1's (rows x an lr grid x seeds 0-1), at a tiny size, with its records."""
    overrides = dict(o.split("=", 1) for o in tiny_overrides(steps=8, every=4, log_every=1))
    spec = {
        "name": "tiny_paper",
        "config": "fuzzy_logic",
        "rows": {v: {"model.attention": v} for v in VARIANTS},
        "grid": {"train.lr": [0.001, 0.003]},
        "seeds": [0, 1],
        "overrides": {k: yaml.safe_load(v) for k, v in overrides.items()},
    }
    path = tmp_path / "tiny_paper.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    where = ["--where", "train.lr=0.001", "--where", "seed=0"]
    assert main(["sweep", str(path), "--root", str(tmp_path / "records"), *where]) == 0
    return path


@pytest.mark.slow
def test_demo_trains_the_first_steps_and_compares_them_with_the_records(tmp_path: Path, capsys) -> None:
    sweep = tiny_paper_sweep(tmp_path)
    out = tmp_path / "demo"
    argv = ["demo", "--sweep", str(sweep), "--records", str(tmp_path / "records"), "--out", str(out)]
    argv += ["--steps", "4", "--eval-size", "64"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert not (out / "linear").exists()  # softmax and HYLA train; linear is re-scored only (no weights here)
    assert "No trained models under the records given" in (out / "report.md").read_text()
    for variant in DEMO_VARIANTS:
        run = out / variant
        # the record's own config, stopped at step 4 of its 8-step schedule
        assert yaml.safe_load((run / "config.yaml").read_text())["train"]["steps"] == 8
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows if r["split"] == "train_batch"] == [1, 2, 3, 4]
        row = next(line for line in printed.splitlines() if line.startswith(f"| {variant} |"))
        cells = [c.strip() for c in row.split("|")[1:-1]]
        assert cells[2].endswith("/4")  # the four logged training losses compared with the record's
        assert float(cells[3]) < 1e-4  # another thread count here than the record's: rounding only
        assert cells[4].endswith("(step 8)")
    assert "At step 4 on this machine," in printed and "The records end with" in printed
    report = (out / "report.md").read_text()
    assert "stopped\nat step 4 of the 8-step schedule" in report or "at step 4 of the 8-step schedule" in report
    assert (out / "demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a second invocation reuses the stopped runs and their evaluations instead of training again
    assert main(argv) == 0
    again = capsys.readouterr().out
    assert all(
        row.rstrip().endswith("| 0 |")
        for row in again.splitlines()
        if row.startswith("| ") and "---" not in row and "variant" not in row
    )


def test_demo_refuses_steps_beyond_the_records_schedule(tmp_path: Path, capsys) -> None:
    sweep = tiny_paper_sweep(tmp_path)
    argv = ["demo", "--sweep", str(sweep), "--records", str(tmp_path / "records"), "--out", str(tmp_path / "d")]
    assert main([*argv, "--steps", "9"]) == 2
    assert "--steps must be in 1..8" in capsys.readouterr().err
    assert main([*argv, "--variants", "hyla_plus"]) == 2
    assert "--variants: 'hyla_plus' is not a row of tiny_paper; rows: softmax, linear, hyla" in capsys.readouterr().err


def test_part_one_rescores_the_paper_tables_trained_models_on_fresh_problems(tmp_path: Path) -> None:
    """A records root shaped like the paper's (a finished softmax and HYLA run of Table A1's fuzzy logic at its
    first grid point): both are loaded and scored, beside their records' last OOD value; the same problems
    every time, other than the records' own evaluation problems."""
    from hyla.train.config import load_config
    from hyla.train.loop import Trainer
    from hyla.train.sweeps import load_sweep

    sweep = load_sweep("table_a1_fuzzy")
    for row in ("softmax", "hyla"):
        spec = next(s for s in sweep.runs([row]) if s.seed == 0)
        cfg = load_config("fuzzy_logic", [*tiny_overrides(steps=4, every=4), f"model.attention={row}", "seed=0"])
        Trainer(cfg, tmp_path / "table_a1_fuzzy" / spec.name, quiet=True, progress=False).run()
    lines, fresh = rescored_table(tmp_path, 64, 7)
    assert len(lines) == 2 and sorted(fresh["fuzzy_logic"]) == ["hyla", "softmax"]
    assert all(line.startswith("| fuzzy_logic |") and "seed 0" in line for line in lines)
    again = rescored_table(tmp_path, 64, 7)[1]
    assert again == fresh and rescored_table(tmp_path, 64, 8)[1] != fresh  # fresh problems: the seed decides
