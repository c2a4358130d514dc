"""A new task is one module and one registration: a toy task defined in the tests trains, sweeps,
reports and exports through the CLI without any other change to the library."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

from hyla.cli import main
from hyla.tasks import REGISTRY, register_task
from hyla.train.config import config_from_dict, dump_config, load_config
from toy_task import TOY_FACTS, ToyTask

TINY_MODEL = {
    "attention": "hyla",
    "num_layers": 1,
    "emb_dim": 16,
    "num_heads": 2,
    "qk_dim": 8,
    "v_dim": 8,
    "mlp_dim": 32,
}
TINY_TRAIN = {
    "steps": 4,
    "batch_size": 16,
    "warmup_steps": 2,
    "eval_every": 2,
    "eval_size": 32,
    "eval_batch_size": 32,
    "log_every": 2,
    "checkpoint_every": 2,
}


@pytest.fixture
def toy() -> Iterator[type[ToyTask]]:
    register_task(ToyTask, **TOY_FACTS)
    yield ToyTask
    del REGISTRY[ToyTask.name]  # the other tests see the library's tasks only


@pytest.fixture
def toy_config(toy: type[ToyTask], tmp_path: Path) -> Path:
    path = tmp_path / "toy.yaml"
    values = {"name": "toy", "data": {"task": "toy", "toy_length": 5}, "model": TINY_MODEL, "train": TINY_TRAIN}
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    return path


def test_the_toy_task_keeps_its_own_defaults_beside_the_others(toy: type[ToyTask]) -> None:
    data = config_from_dict({"data": {"task": "toy"}}).data
    assert (data.toy_length, data.toy_dim, data.toy_ood_shift) == (6, 3, 1.0)
    assert config_from_dict({"data": {"task": "fuzzy_logic"}}).data.holdout == 0.7
    assert config_from_dict({"data": {"task": "sraven"}}).data.holdout == 0.25
    with pytest.raises(ValueError, match="toy_dim must be >= 2"):
        from hyla.train.build import build_task

        build_task(config_from_dict({"data": {"task": "toy", "toy_dim": 1}}))


def test_train_sweep_report_and_export_a_new_task(toy_config: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert main(["train", str(toy_config), "--out", str(run), "--quiet"]) == 0
    saved = load_config(str(run / "config.yaml"))
    assert saved.data.task == "toy" and saved.data.toy_length == 5
    assert dump_config(saved) == (run / "config.yaml").read_text()
    final = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert final["step"] == 4 and 0 <= final["acc"] <= 1

    sweep = tmp_path / "toy_sweep.yaml"
    # two seeds of one row train as one stack (the stacked engine on a task it has never seen)
    rows = {"hyla": {"model.attention": "hyla"}}
    spec = {
        "name": "toy_sweep",
        "config": str(toy_config),
        "rows": rows,
        "grid": {"train.lr": [0.001]},
        "seeds": [0, 1],
    }
    sweep.write_text(yaml.safe_dump(spec, sort_keys=False))
    root = tmp_path / "records"
    assert main(["sweep", str(sweep), "--root", str(root)]) == 0
    runs = sorted(p for p in (root / "toy_sweep").iterdir() if (p / "metrics.jsonl").is_file())
    assert [p.name for p in runs] == ["hyla-lr0.001-seed0", "hyla-lr0.001-seed1"]

    out = tmp_path / "report"
    assert main(["report", *map(str, runs), "--out", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert "ood accuracy (%)" in report and "Latent code" not in report  # the toy task has no latent probe

    flags = tmp_path / "flags.npz"
    assert main(["data", "toy", "--split", "ood", "--num", "10", "--toy-length", "5", "--out", str(flags)]) == 0
    arrays = np.load(flags)
    assert arrays["inputs"].shape == (10, 5, 3) and arrays["targets"].shape == (10,)
    assert arrays["inputs"].mean() > 0.5  # the ood shift
    from_config = tmp_path / "config.npz"
    assert (
        main(["data", "toy", "--config", str(toy_config), "--split", "ood", "--num", "10", "--out", str(from_config)])
        == 0
    )
    assert np.array_equal(np.load(from_config)["inputs"], arrays["inputs"])
