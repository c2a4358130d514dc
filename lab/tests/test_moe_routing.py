"""lab/moe_routing.py: each expert's share of the routed pairs, read through the hook point, is the share the MoE
layer's own load-balancing bookkeeping counts; bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import hyla
from hyla.cli import main
from hyla.models.transformer import MoE
from tiny import load_script, tiny_overrides

SCRIPT = Path(__file__).resolve().parents[1] / "moe_routing.py"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny finished HYLA + MoE run where the script looks for Table A1's."""
    root = tmp_path_factory.mktemp("runs")
    run = root / "table_a1_fuzzy" / "hyla_moe-lr0.001-weight_decay0.1-seed0"
    overrides = tiny_overrides(layers=2, steps=8, every=4, warmup_steps=2)
    assert main(["train", "fuzzy_logic_moe", *overrides, "model.attention=hyla", "--out", str(run), "--quiet"]) == 0
    return root


def test_shares_are_the_layers_own_routed_fractions(runs: Path, tmp_path: Path) -> None:
    script = load_script(SCRIPT)
    assert script.main(["--root", str(runs), "--problems", "24", "--seed", "3", "--out", str(tmp_path)]) == 0
    found = json.loads((tmp_path / "routing.json").read_text())["runs"]
    run_dir = runs / "table_a1_fuzzy" / "hyla_moe-lr0.001-weight_decay0.1-seed0"
    entry = found[run_dir.name]
    trained = hyla.load(run_dir)
    layers = [m for m in trained.model.modules() if isinstance(m, MoE)]
    assert len(layers) == 2
    for split in ("test", "ood"):
        batch = trained.task.sample(24, split, torch.Generator().manual_seed(3))
        with torch.no_grad():
            trained.model(batch.inputs, last_positions=trained.task.num_output_positions)
        for layer, measured in zip(layers, entry[split], strict=True):
            share_E = torch.tensor(measured["share_by_expert"], dtype=torch.float64)
            prob_E = torch.tensor(measured["mean_prob_by_expert"], dtype=torch.float64)
            assert share_E.shape == (5,) and share_E.sum().item() == pytest.approx(1.0)
            # aux_loss = E * sum_e f_e * P_e, with f_e the layer's routed fraction: the script's counts must match it
            expected = 5 * (share_E * prob_E).sum().item()
            assert layer.aux_loss.item() == pytest.approx(expected, rel=1e-5)
            assert 1 / 5 <= measured["top1"] <= 1
    assert "| hyla_moe-lr0.001-weight_decay0.1-seed0 |" in (tmp_path / "README.md").read_text()


def test_bad_input_is_one_line(runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = load_script(SCRIPT)
    assert script.main(["--root", str(runs), "--problems", "0", "--out", str(tmp_path)]) == 2
    assert "--problems" in capsys.readouterr().err
    assert script.main(["--root", str(tmp_path), "--out", str(tmp_path)]) == 1
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert not (tmp_path / "routing.json").exists()
