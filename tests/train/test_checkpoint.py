"""A checkpoint's metric sums: a typed field of ``state.json``, and older checkpoints' in their RNG file."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hyla.cli import main
from hyla.train.run.checkpoint import latest_checkpoint, load_checkpoint
from tiny import tiny_overrides


def args(*extra: str) -> list[str]:
    overrides = tiny_overrides(layers=1, steps=8, every=4, log_every=2, warmup_steps=2)
    return ["fuzzy_logic", *overrides, "train.eval_every=3", *extra, "--quiet"]


def write_the_old_way(ckpt: Path) -> None:
    """Move the sums from ``state.json`` into ``rng.safetensors`` as ``acc_<metric>`` and ``acc__n``, as
    checkpoints were written before ``metric_sums`` existed."""
    state = ckpt / "state.json"
    meta = json.loads(state.read_text())
    sums = meta.pop("metric_sums")
    rng_file = ckpt / "rng.safetensors"
    rng = load_file(str(rng_file))
    rng |= {f"acc_{k}": torch.tensor(v, dtype=torch.float64) for k, v in sums["sums"].items()}
    rng["acc__n"] = torch.tensor(float(sums["steps"]), dtype=torch.float64)
    save_file(rng, str(rng_file))
    meta["sha256"]["rng.safetensors"] = hashlib.sha256(rng_file.read_bytes()).hexdigest()
    state.write_text(json.dumps(meta))


@pytest.mark.float_sensitive
@pytest.mark.parametrize("seeds", [None, "0,1"])
def test_a_checkpoint_with_its_sums_among_the_rng_states_resumes_to_the_same_records(
    tmp_path: Path, seeds: str | None
) -> None:
    flags = [] if seeds is None else ["--seeds", seeds]
    runs = ["."] if seeds is None else [f"seed{s}" for s in seeds.split(",")]
    assert main(["train", *args(*flags), "--out", str(tmp_path / "a")]) == 0
    # step 5: one step after the log at 4, so the checkpoint carries one step's sums
    assert main(["train", *args(*flags), "--out", str(tmp_path / "b"), "--stop-at-step", "5"]) == 0
    for run in runs:
        ckpt = latest_checkpoint(tmp_path / "b" / run)
        state = load_checkpoint(ckpt)
        assert state.metric_steps == 1 and set(state.metric_sums) == {"loss", "r2"}
        assert not any(k.startswith("acc_") for k in state.rng)
        write_the_old_way(ckpt)
        old = load_checkpoint(ckpt)
        assert (old.metric_sums, old.metric_steps) == (state.metric_sums, state.metric_steps)
        assert set(old.rng) == set(state.rng)
    assert main(["train", *args(*flags), "--out", str(tmp_path / "b"), "--resume"]) == 0
    for run in runs:
        whole, resumed = (tmp_path / name / run / "metrics.jsonl" for name in "ab")
        assert whole.read_bytes() == resumed.read_bytes()


def test_a_checkpoint_at_a_log_step_holds_no_sums(tmp_path: Path) -> None:
    assert main(["train", *args(), "--out", str(tmp_path / "a"), "--stop-at-step", "4"]) == 0
    ckpt = latest_checkpoint(tmp_path / "a")
    assert "metric_sums" not in json.loads((ckpt / "state.json").read_text())
    state = load_checkpoint(ckpt)
    assert (state.metric_sums, state.metric_steps) == ({}, 0)
