"""lab/next_seeds.py: a point earns seeds 1-2 when its seed 0 beats, by test R^2 (never by OOD), the seed 0 of the
point the report chose (among equally seeded points, the better test mean); a bad row is one line naming the rows."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hyla.train.sweeps import load_sweep
from tiny import fake_record, load_script

SCRIPT = Path(__file__).resolve().parents[1] / "next_seeds.py"


def test_only_points_whose_seed_0_beats_the_incumbent_by_test_get_a_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep_file = tmp_path / "grid.yaml"
    rows = {
        "hyla_softmax": {"model.attention": "hyla_softmax"},
        "linear": {"model.attention": "linear"},
        "hyla": {"model.attention": "hyla"},
    }
    grid = {"train.lr": [0.001, 0.003], "train.weight_decay": [0.1, 0.03]}
    sweep_file.write_text(
        yaml.safe_dump({"name": "grid", "config": "fuzzy_logic", "rows": rows, "grid": grid, "seeds": [0, 1, 2]})
    )
    sweep = load_sweep(str(sweep_file))
    records = tmp_path / "runs" / "grid"
    for spec in sweep.runs():
        lr, wd = dict(spec.point)["train.lr"], dict(spec.point)["train.weight_decay"]
        if spec.row == "hyla":
            # two points at three seeds: the later one in sweep order has the better test mean and is chosen, so a
            # seed 0 between the two seed 0s earns nothing
            if (lr, wd) in ((0.001, 0.1), (0.003, 0.1)):
                fake_record(records, spec, test=(0.90 if lr == 0.001 else 0.93) + spec.seed / 1000, ood=0.5)
            elif spec.seed == 0 and (lr, wd) == (0.001, 0.03):
                fake_record(records, spec, test=0.92, ood=0.5)
            continue
        if (lr, wd) == (0.001, 0.1):  # the incumbent: three seeds
            fake_record(records, spec, test=0.90 + spec.seed / 1000, ood=0.5)
        elif spec.seed == 0 and (lr, wd) == (0.003, 0.1):
            fake_record(records, spec, test=0.95, ood=0.1)  # beats it in-distribution, worse OOD: still chosen
        elif spec.seed == 0 and (lr, wd) == (0.001, 0.03):
            fake_record(records, spec, test=0.85, ood=0.99)  # better OOD only: never
    script = load_script(SCRIPT)
    assert (
        script.main(
            ["--sweep", str(sweep_file), "--rows", "hyla_softmax,linear,hyla", "--root", str(tmp_path / "runs")]
        )
        == 0
    )
    commands = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]
    assert commands == [
        "hyla sweep grid --only hyla_softmax --where train.lr=0.003 --where train.weight_decay=0.1 --where seed=1,2",
        "hyla sweep grid --only linear --where train.lr=0.003 --where train.weight_decay=0.1 --where seed=1,2",
    ]
    assert script.main(["--sweep", str(sweep_file), "--rows", "hyla_plus", "--root", str(tmp_path / "runs")]) == 2
    assert capsys.readouterr().err.strip() == "--rows: hyla_plus not in grid; its rows: hyla, hyla_softmax, linear"
