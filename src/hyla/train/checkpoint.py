"""Checkpoints that are written atomically and load without unpickling code.

Layout of a run directory::

    checkpoints/step-000500/model.safetensors   weights
    checkpoints/step-000500/optimizer.pt        optimizer state (tensors and numbers: weights_only load)
    checkpoints/step-000500/rng.safetensors     data-stream generator(s) and torch RNG states
    checkpoints/step-000500/state.json          step, config, metric accumulators, world size
    checkpoints/latest                          name of the newest complete checkpoint
    model.safetensors                           the final weights of a finished run (model only)

A checkpoint directory is written under a temporary name and renamed when complete; ``latest`` is
replaced atomically afterwards, so a crash at any moment leaves the previous checkpoint intact.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from hyla.textio import write_text_atomic


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable, or belongs to another configuration."""


class DeviceChangeWarning(UserWarning):
    """A checkpoint resumed on another device type than it was made on: its random streams begin anew."""


def restore_generator(gen: torch.Generator, saved: torch.Tensor, fresh_seed: int, what: str) -> None:
    """Put a checkpoint's generator state ``saved`` (uint8) into ``gen``. A state saved on another device type (a
    CPU generator's is 5,056 bytes, a CUDA one's 16) cannot go on here: ``gen`` then begins anew from
    ``fresh_seed``, which the caller fixes by the run and the step so that every such resume draws alike, and a
    :class:`DeviceChangeWarning` names ``what``."""
    if saved.numel() == gen.get_state().numel():
        gen.set_state(saved)
        return
    gen.manual_seed(fresh_seed)
    warnings.warn(
        f"{what} was saved on another device type than {gen.device.type}; it is drawn anew from here (seeded by "
        "the run and the step), so the run does not retrace what the checkpoint's device would have trained",
        DeviceChangeWarning,
        stacklevel=3,
    )


@dataclass
class TrainingState:
    step: int
    config: dict[str, Any]
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    rng: dict[str, torch.Tensor]
    extra: dict[str, Any]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(run_dir: Path, state: TrainingState, keep: int = 2) -> Path:
    """Write ``state`` as the newest checkpoint of ``run_dir``; keep the ``keep`` newest."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{state.step:09d}"
    final = root / name
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{name}."))
    try:
        save_weights(tmp / "model.safetensors", state.model)
        torch.save(state.optimizer, tmp / "optimizer.pt")
        save_file({k: v.contiguous().cpu() for k, v in state.rng.items()}, str(tmp / "rng.safetensors"))
        (tmp / "state.json").write_text(json.dumps({"step": state.step, "config": state.config, "extra": state.extra}))
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    write_text_atomic(root / "latest", name)
    for old in sorted(p for p in root.glob("step-*") if p.is_dir())[:-keep]:
        if old.name != name:
            shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    pointer = Path(run_dir) / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    path = pointer.parent / pointer.read_text().strip()
    if not path.is_dir():
        raise CheckpointError(f"{pointer} names {path.name}, which does not exist: the run directory is damaged")
    return path


def checkpoint_step(run_dir: Path) -> int | None:
    """The step of ``run_dir``'s newest checkpoint (from its name, ``step-000000500``), None without one."""
    ckpt = latest_checkpoint(run_dir)
    return None if ckpt is None else int(ckpt.name.removeprefix("step-"))


def load_checkpoint(path: Path) -> TrainingState:
    """Read a checkpoint directory; any damage raises :class:`CheckpointError` naming the file."""
    path = Path(path)
    try:
        meta = json.loads((path / "state.json").read_text())
        model = load_file(str(path / "model.safetensors"))
        rng = load_file(str(path / "rng.safetensors"))
        optimizer = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)
    except (OSError, ValueError, RuntimeError, KeyError, EOFError, Exception) as err:
        raise CheckpointError(
            f"checkpoint {path} is unreadable ({type(err).__name__}: {err}); "
            "restore it, or start a fresh run in another --out directory"
        ) from err
    return TrainingState(meta["step"], meta["config"], model, optimizer, rng, meta.get("extra", {}))


def config_differences(saved: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two config dicts."""
    diffs = []
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key, "<missing>"), current.get(key, "<missing>")
        if isinstance(a, dict) and isinstance(b, dict):
            diffs += config_differences(a, b, f"{prefix}{key}.")
        elif a != b:
            diffs.append(f"{prefix}{key}: checkpoint has {a!r}, now {b!r}")
    return diffs


def save_weights(path: Path, model: dict[str, torch.Tensor]) -> None:
    """Write a model's weights to ``path`` (safetensors) atomically: a crash leaves the old file or none."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    # clone: safetensors refuses tensors that share memory (tied embeddings); loading re-ties them
    save_file({k: v.detach().cpu().clone().contiguous() for k, v in model.items()}, str(tmp))
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    """The weights :func:`save_weights` wrote; an unreadable file raises :class:`CheckpointError` naming it."""
    try:
        return load_file(str(path))
    except Exception as err:
        raise CheckpointError(f"{path} is unreadable ({type(err).__name__}: {err})") from err
