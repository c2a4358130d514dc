"""A finished run keeps its final weights (``model.safetensors``) and one call loads the trained model."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from hyla.cli import main
from hyla.train.build import build_model
from hyla.train.run.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint
from hyla.train.run.folder import FINAL_WEIGHTS, load_trained
from tiny import tiny_overrides


def test_a_finished_run_keeps_its_weights_and_loads_without_checkpoints(tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = ["train", "sraven", *tiny_overrides(steps=6, every=3), "--out", str(run), "--quiet"]
    assert main([*args, "--stop-at-step", "3"]) == 0
    assert not (run / FINAL_WEIGHTS).exists()  # stopped early: only checkpoints
    stopped = load_trained(run)
    assert stopped.weights == "checkpoint at step 3" and stopped.step == 3  # names the weights the model holds
    for name, tensor in stopped.model.state_dict().items():
        assert torch.equal(tensor, load_checkpoint(latest_checkpoint(run)).model[name]), name
    assert main([*args, "--resume"]) == 0
    final = load_checkpoint(latest_checkpoint(run))
    assert final.step == 6 and (run / FINAL_WEIGHTS).is_file()
    shutil.rmtree(run / "checkpoints")  # what a finished sweep record keeps
    path, cfg, task, model, weights, step = load_trained(run)
    assert weights == "final" and path == run and step == 6
    assert not model.training and cfg.train.steps == 6
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, final.model[name]), name
    # the loaded model is the trained one: its outputs are not those of a fresh model of the same seed
    x = task.sample(4, "test", torch.Generator().manual_seed(0)).inputs
    assert not torch.allclose(model(x), build_model(cfg, task).eval()(x))


def test_loading_a_folder_without_weights_names_what_is_missing(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert main(["train", "sraven", *tiny_overrides(steps=2, every=2), "--out", str(run), "--quiet"]) == 0
    shutil.rmtree(run / "checkpoints")
    (run / FINAL_WEIGHTS).unlink()
    with pytest.raises(ValueError, match="neither final weights"):
        load_trained(run)
    (run / FINAL_WEIGHTS).write_bytes(b"torn")
    with pytest.raises(CheckpointError, match=r"model\.safetensors is unreadable"):
        load_trained(run)
