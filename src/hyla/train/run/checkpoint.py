"""Checkpoints that are written atomically, carry their files' checksums and load without unpickling code.

Layout of a run directory::

    checkpoints/step-000500/model.safetensors   weights
    checkpoints/step-000500/optimizer.pt        optimizer state (tensors and numbers: weights_only load)
    checkpoints/step-000500/rng.safetensors     the random streams: the data generator of each process
                                                ("data_rank0", ...) and torch's default generators
                                                ("torch_cpu", on CUDA "torch_cuda"; a run's dropout draws
                                                from its device's, a stacked run's own generator in its
                                                place)
    checkpoints/step-000500/state.json          "step", "config", "extra" (the writing job's
                                                "world_size"), "metric_sums" (each training metric's sum
                                                over the steps since the last log, and "steps": how many;
                                                absent when none) and "sha256": {file: hex digest} of
                                                each file above
    checkpoints/latest                          name of the newest complete checkpoint
    model.safetensors                           the final weights of a finished run (model only)
    model.safetensors.sha256                    their sha256, as ``sha256sum`` writes it (``sha256sum -c`` it)

A checkpoint directory is written under a temporary name (``checkpoints/.step-000500.tmp``) and renamed
when complete; ``latest`` is replaced atomically afterwards, so a crash or a full disk at any moment leaves
the previous checkpoint intact. What a crash leaves of such writes is removed by the next checkpoint's
write. Loading checks the recorded sums: a damaged file is a ``ChecksumError`` naming it and, for a
checkpoint, the newest older one that is intact. Records written before the checksums existed load unchecked.
Files and folders are created with the process's umask. Checkpoints written before ``metric_sums`` existed
kept those sums in ``rng.safetensors`` (``acc_<metric>``, ``acc__n`` their steps); they load into the same fields.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load, save

from hyla.textio import naming, write_failure, write_file, write_text_atomic

#: the files of a checkpoint whose sums ``state.json`` records (``state.json`` itself holds them)
CHECKPOINT_FILES = ("model.safetensors", "optimizer.pt", "rng.safetensors")
#: the key of those sums in ``state.json``
SUMS = "sha256"


class CheckpointError(RuntimeError, ValueError):
    """A checkpoint (or a run's final weights) is missing, unreadable, damaged, or belongs to another
    configuration. A ``ValueError`` too: the user's files, so the commands print it as one line."""


class ChecksumError(CheckpointError):
    """A record file's sha256 differs from the one recorded when it was written: the file is damaged."""


class DeviceChangeWarning(UserWarning):
    """A checkpoint resumed on another device type than it was made on: its random streams begin anew."""


def restore_generator(gen: torch.Generator, saved: torch.Tensor, fresh_seed: int, what: str) -> None:
    """Put a checkpoint's generator state ``saved`` (uint8) into ``gen``. A state saved on another device type (a
    CPU generator's is 5,056 bytes, a CUDA one's 16) cannot go on here: ``gen`` then begins anew from
    ``fresh_seed``, which the caller fixes by the run and the step so that every such resume draws alike, and a
    ``DeviceChangeWarning`` names ``what``."""
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
    """One run's checkpoint: what a resume needs to continue as if never stopped."""

    step: int
    config: dict[str, Any]
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    rng: dict[str, torch.Tensor]
    extra: dict[str, Any]
    #: each training metric's sum over the ``metric_steps`` steps since the last log, which the next log
    #: averages: a run stopped between two logs logs what it would have logged uninterrupted
    metric_sums: dict[str, float] = field(default_factory=dict)
    metric_steps: int = 0


#: the prefix of the metric sums' keys in the ``rng`` of checkpoints older than ``metric_sums``; ``acc__n``: steps
_LEGACY_SUMS = "acc_"


def _legacy_metric_sums(rng: dict[str, torch.Tensor]) -> tuple[dict[str, float], int]:
    """The metric sums an older checkpoint kept among its random streams, taken out of ``rng``."""
    keys = [k for k in rng if k.startswith(_LEGACY_SUMS)]
    sums = {k.removeprefix(_LEGACY_SUMS): float(rng.pop(k).item()) for k in keys}
    return sums, int(sums.pop("_n", 0.0))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _weights_bytes(model: dict[str, torch.Tensor]) -> bytes:
    # clone: safetensors refuses tensors that share memory (tied embeddings); loading re-ties them
    return save({k: v.detach().cpu().clone().contiguous() for k, v in model.items()})


def _torch_bytes(obj: Any) -> bytes:
    # through a buffer, not a path: torch writes a path in C++, whose full-disk error is a RuntimeError without
    # the errno; the bytes then go through write_file, whose OSError names the file
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _step_dirs(root: Path) -> list[Path]:
    """The complete checkpoints under ``root`` (``checkpoints/``), oldest first."""
    return sorted(p for p in root.glob("step-*") if p.is_dir()) if root.is_dir() else []


def remove_interrupted_writes(run_dir: Path) -> None:
    """Delete what writes cut off by a crash left in ``run_dir``: ``checkpoints/.step-*`` folders (``.tmp``,
    or the random suffix of older versions), ``checkpoints/.latest.tmp`` and the final weights' temporaries.
    Only the trainer writes these, so none belongs to a live write of another process."""
    root = Path(run_dir) / "checkpoints"
    leftovers = [*root.glob(".step-*"), root / ".latest.tmp"] if root.is_dir() else []
    leftovers += [Path(run_dir) / f".{name}.tmp" for name in ("model.safetensors", "model.safetensors.sha256")]
    for path in leftovers:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def save_checkpoint(run_dir: Path, state: TrainingState, keep: int = 2) -> Path:
    """Write ``state`` as the newest checkpoint of ``run_dir``; keep the ``keep`` newest."""
    root = Path(run_dir) / "checkpoints"
    with naming(root):
        root.mkdir(parents=True, exist_ok=True)
    remove_interrupted_writes(run_dir)
    name = f"step-{state.step:09d}"
    final = root / name
    tmp = root / f".{name}.tmp"  # one writer per run directory: a fixed name, left over only by a crash
    try:
        with naming(tmp):
            tmp.mkdir()  # the umask's mode (tempfile.mkdtemp's 0700 would ignore it)
        files = {
            "model.safetensors": _weights_bytes(state.model),
            "optimizer.pt": _torch_bytes(state.optimizer),
            "rng.safetensors": save({k: v.contiguous().cpu() for k, v in state.rng.items()}),
        }
        for file, data in files.items():
            write_file(tmp / file, data)
        meta = {"step": state.step, "config": state.config, "extra": state.extra}
        if state.metric_steps:
            meta["metric_sums"] = {"sums": state.metric_sums, "steps": state.metric_steps}
        write_file(tmp / "state.json", json.dumps({**meta, SUMS: {f: sha256(d) for f, d in files.items()}}))
        if final.exists():
            shutil.rmtree(final)
        with naming(final):
            os.replace(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    write_text_atomic(root / "latest", name)
    for old in _step_dirs(root)[:-keep]:
        if old.name != name:
            shutil.rmtree(old, ignore_errors=True)
    return final


def checkpoint_intact(path: Path) -> bool | None:
    """Whether every file of the checkpoint ``path`` has the sha256 its ``state.json`` recorded; None for one
    written before the sums were (nothing to check)."""
    try:
        sums = json.loads((Path(path) / "state.json").read_text()).get(SUMS)
        if not isinstance(sums, dict):
            return None
        return all(sha256((Path(path) / file).read_bytes()) == digest for file, digest in sums.items())
    except (OSError, ValueError, AttributeError):
        return False


def resume_advice(root: Path, below: str | None = None) -> str:
    """What to resume from: the newest checkpoint under ``root`` (``checkpoints/``) older than ``below`` (a
    step folder's name; None: any) whose files are intact, and how (``--resume`` takes ``latest``'s)."""
    pointer = root / "latest"
    for older in reversed(_step_dirs(root)):
        if below is not None and older.name >= below:
            continue
        intact = checkpoint_intact(older)
        if intact is False:
            continue
        how = f"to resume from it, point {pointer} at it (echo {older.name} > {pointer}) and pass --resume"
        if intact:
            return f"{root.name}/{older.name} is intact: {how}"
        return f"{root.name}/{older.name} was written without checksums, so may be intact: {how}"
    older = "no older checkpoint" if below is not None else "no checkpoint"
    return f"{older} of the run is intact: restore the file, or start a fresh run in another --out directory"


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint (``checkpoints/latest`` names it), None without one. A ``latest`` that is
    gone while step folders remain, or that names none, is a ``CheckpointError`` saying which to resume."""
    root = Path(run_dir) / "checkpoints"
    pointer = root / "latest"
    if not pointer.is_file():
        if not _step_dirs(root):
            return None
        raise CheckpointError(
            f"{pointer} is missing, but {root} holds {', '.join(p.name for p in _step_dirs(root))}; "
            + resume_advice(root)
        )
    path = root / pointer.read_text().strip()
    if not path.is_dir():
        raise CheckpointError(f"{pointer} names {path.name}, which does not exist; " + resume_advice(root))
    return path


def checkpoint_step(run_dir: Path) -> int | None:
    """The step of ``run_dir``'s newest checkpoint (from its name, ``step-000000500``), None without one."""
    ckpt = latest_checkpoint(run_dir)
    return None if ckpt is None else int(ckpt.name.removeprefix("step-"))


def load_checkpoint(path: Path) -> TrainingState:
    """Read a checkpoint directory and check its files' sums (when it has them); any damage raises
    ``CheckpointError`` (``ChecksumError`` for a file whose sum differs) naming the file and the
    newest older checkpoint that is intact."""
    path = Path(path)
    try:
        meta = json.loads((path / "state.json").read_text())
        raw = {file: (path / file).read_bytes() for file in CHECKPOINT_FILES}
        model, rng = load(raw["model.safetensors"]), load(raw["rng.safetensors"])
        optimizer = torch.load(io.BytesIO(raw["optimizer.pt"]), map_location="cpu", weights_only=True)
        step, config = meta["step"], meta["config"]
        if "metric_sums" in meta:
            metric_sums, metric_steps = dict(meta["metric_sums"]["sums"]), int(meta["metric_sums"]["steps"])
        else:
            metric_sums, metric_steps = _legacy_metric_sums(rng)
    except Exception as err:  # whatever the damage, the user's file: one line naming it
        raise CheckpointError(
            f"checkpoint {path} is unreadable ({type(err).__name__}: {err}); "
            + resume_advice(path.parent, below=path.name)
        ) from err
    sums = meta.get(SUMS)
    for file, data in raw.items():
        if isinstance(sums, dict) and file in sums and sha256(data) != sums[file]:
            raise ChecksumError(
                f"{path / file}: its sha256 differs from the one {path.name}/state.json recorded (the file is "
                "damaged); " + resume_advice(path.parent, below=path.name)
            )
    return TrainingState(step, config, model, optimizer, rng, meta.get("extra", {}), metric_sums, metric_steps)


def checkpoint_write_failure(
    err: OSError, run_dirs: list[Path], fresh: str = "start the run again in a fresh --out", resume: str = "--resume"
) -> str:
    """One line for a write of the runs ``run_dirs`` that failed (a full or read-only disk): what failed, and
    what is intact (the atomic writes leave every earlier checkpoint so) and how to go on (``fresh``: with no
    checkpoint yet; else continue with ``resume``)."""
    try:
        steps = sorted({checkpoint_step(Path(r)) or 0 for r in run_dirs})
    except CheckpointError:
        steps = []
    if steps == [0]:
        kept = f"no checkpoint was written yet: once the disk is fixed, {fresh}"
    elif len(steps) == 1:
        kept = (
            f"the records up to step {steps[0]} (the last checkpoint) are intact: once the disk is fixed (space "
            f"freed, write permission given), continue with {resume}"
        )
    else:
        kept = (
            f"the records up to each run's last checkpoint are intact: once the disk is fixed, continue with {resume}"
        )
    # a write that names no file (one not made by hyla.textio's writers) happened in a run directory
    where = "" if err.filename is not None else f" writing in {', '.join(str(r) for r in run_dirs)}"
    return f"{write_failure(err)}{where}; {kept}"


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


def sums_file(path: Path) -> Path:
    """Where ``save_weights`` records the sha256 of the weights ``path``: ``path.sha256``."""
    return path.with_name(path.name + ".sha256")


def save_weights(path: Path, model: dict[str, torch.Tensor]) -> None:
    """Write a model's weights to ``path`` (safetensors) atomically, and their sha256 beside them
    (``sums_file``, as ``sha256sum`` writes it): a crash leaves the old file or none."""
    path = Path(path)
    data = _weights_bytes(model)
    sums = sums_file(path)
    with naming(sums):
        sums.unlink(missing_ok=True)  # first: old sums never stand beside new weights
    write_text_atomic(path, data)
    write_text_atomic(sums, f"{sha256(data)}  {path.name}\n")


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    """The weights ``save_weights`` wrote, their sha256 checked where it was recorded; an unreadable file
    raises ``CheckpointError`` naming it, a damaged one ``ChecksumError``."""
    path = Path(path)
    try:
        data = path.read_bytes()
        weights = load(data)
    except Exception as err:  # whatever the damage, the user's file: one line naming it
        raise CheckpointError(f"{path} is unreadable ({type(err).__name__}: {err})") from err
    sums = sums_file(path)
    if sums.is_file():
        try:
            recorded = sums.read_text().split()
        except (OSError, UnicodeDecodeError) as err:
            raise CheckpointError(f"{sums} is unreadable ({err}); restore it, or delete it to load unchecked") from err
        if not recorded or recorded[0] != sha256(data):
            raise ChecksumError(
                f"{path}: its sha256 differs from the one {sums.name} recorded when it was written (the file is "
                "damaged); restore it from a copy"
            )
    return weights
