"""lab/authors/trajectory_sraven.py: our side of the trajectory comparison and its control, at a tiny size."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

SCRIPT = Path(__file__).resolve().parents[2] / "lab" / "authors" / "trajectory_sraven.py"
TINY = ["model.num_layers=1", "model.emb_dim=16", "model.num_heads=2", "model.qk_dim=8", "model.v_dim=8"]


def test_two_backends_of_ours_make_one_trajectory_in_float64(tmp_path: Path) -> None:
    """The control of the comparison: the C kernel and the direct form, from the same weights on the same
    batches, stay together to float64 rounding; the batches and initial weights for their code are written."""
    tiny = [arg for item in [*TINY, "train.batch_size=16"] for arg in ("--set", item)]
    common = [sys.executable, str(SCRIPT), "ours", "--steps", "12", "--float64", "--out", str(tmp_path), *tiny]
    subprocess.run(common, check=True, capture_output=True)
    subprocess.run([*common, "--backend", "direct", "--name", "direct"], check=True, capture_output=True)
    out = tmp_path / "cmp.json"
    args = ["compare", "--out", str(tmp_path), "--a", "ours", "--b", "direct", "--json", str(out)]
    text = subprocess.run([sys.executable, str(SCRIPT), *args], check=True, capture_output=True, text=True).stdout
    assert "first update whose loss differs by more than 1e-06 (relative): none" in text
    cmp = json.loads(out.read_text())
    assert cmp["updates"] == 12 and max(cmp["params_rel_l2_diff"].values()) < 1e-12
    table = subprocess.run(
        [sys.executable, str(SCRIPT), "summary", str(out)], check=True, capture_output=True, text=True
    )
    row = table.stdout.splitlines()[-1].split(" | ")
    assert row[1:3] == ["1-12", "ours vs direct"] and row[4] == f"{cmp['params_rel_l2_diff']['12']:.1e}"
    norms = np.array(cmp["ours"]["param_norm"])
    assert np.all(np.isfinite(cmp["ours"]["loss"])) and abs(norms[-1] - norms[0]) > 1e-6  # the updates move it
    with np.load(tmp_path / "ours_batches.npz") as batches:
        assert batches["x"].shape == (12, 16, 36, 8) and batches["x"].dtype == np.uint8
        assert str(batches["mixer"]) == "linear_hypatt" and bool(batches["float64"])


def test_dropout_masks_are_written_for_their_model(tmp_path: Path) -> None:
    """With --dropout each update's masks go to the file their side reads: every layer as T x T, the last
    layer's answer rows ours and its other rows (whose outputs no loss reads) all kept."""
    tiny = [arg for item in [*TINY, "model.num_layers=2", "train.batch_size=4"] for arg in ("--set", item)]
    cmd = [sys.executable, str(SCRIPT), "ours", "--steps", "3", "--dropout", "--out", str(tmp_path), *tiny]
    subprocess.run(cmd, check=True, capture_output=True)
    with np.load(tmp_path / "ours_batches.npz") as batches:
        keep = batches["keep"]
    assert keep.shape == (3, 2, 36, 36) and keep.dtype == bool
    assert keep[:, -1, :32].all() and not keep[:, -1, 32:].all()  # the last layer drops only in its answer rows
    assert 0.8 < keep[:, 0].mean() < 0.97  # p = 0.1
    assert not np.array_equal(keep[0], keep[1])  # a new draw each update


def test_a_window_from_a_checkpoint_continues_the_run(tmp_path: Path) -> None:
    """--start: from a run's checkpoint (weights, AdamW moments and step, the data stream) the window's
    updates are the run's own next updates, and the AdamW state is written for their side in their layout."""
    from hyla.cli import main
    from tiny import tiny_overrides

    run = tmp_path / "run"
    overrides = tiny_overrides(layers=1, steps=8, every=4, log_every=1, warmup_steps=6)
    assert main(["train", "sraven", *overrides, "--out", str(run), "--quiet"]) == 0
    start = run / "checkpoints" / "step-000000004"
    out = tmp_path / "window"
    cmd = [sys.executable, str(SCRIPT), "ours", "--start", str(start), "--steps", "4", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True)
    lines = map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
    logged = {m["step"]: m for m in lines if m["split"] == "train_batch"}
    with np.load(out / "ours_steps.npz") as window, np.load(out / "ours_batches.npz") as batches:
        assert int(window["start_step"]) == 4 and int(batches["start_step"]) == 4
        # updates 6-8 read the restored AdamW moments and the schedule past warmup's 6th update
        for i, step in enumerate(range(5, 9)):
            np.testing.assert_allclose(window["loss"][i], logged[step]["loss"], rtol=1e-5, err_msg=f"update {step}")
            np.testing.assert_allclose(window["param_norm"][i], logged[step]["param_norm"], rtol=1e-6)
        mu = {k: batches[k] for k in batches.files if k.startswith("mu/")}
        params = {k for k in batches.files if k.startswith("param/")}
        assert {f"param/{k[3:]}" for k in mu} == params and any(np.abs(v).max() > 0 for v in mu.values())
        assert float(batches["peak_lr"]) > 0 and int(batches["warmup_steps"]) == 6
