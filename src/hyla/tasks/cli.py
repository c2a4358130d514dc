"""Export task problems as ``.npz`` for other frameworks (format in the README); ``hyla data`` drives it
(:mod:`hyla.export`, which can also build the task from a training config)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from hyla.tasks.fuzzy_logic import FuzzyLogic
from hyla.tasks.sraven import RULE_NAMES, SRaven

_CHUNK = 65_536


def _save_npz(path: Path, **arrays: np.ndarray) -> None:
    """Write atomically: a temporary file in the same folder, then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".npz")
    os.close(fd)
    try:
        np.savez_compressed(tmp, **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def export_sraven(task: SRaven, split: str, num: int, seed: int) -> dict[str, np.ndarray]:
    """``grid`` (N, G, G, F) as the model sees it, ``rules`` (N, F) per canonical feature, ``perm`` (N, G, F)
    with ``grid[n, r, c, i] == canonical[n, r, c, perm[n, c, i]]``, ``task_id`` (N,), ``rule_names``.

    Drawn in chunks from ``torch.Generator().manual_seed(seed)`` on the CPU: the same arguments give
    the same file."""
    task.check_split(split)
    gen = torch.Generator().manual_seed(seed)
    parts: dict[str, list[np.ndarray]] = {"grid": [], "rules": [], "perm": [], "task_id": []}
    for start in range(0, num, _CHUNK):
        p = task.sample_problems(min(_CHUNK, num - start), split, gen)
        if task.unambiguous_only:
            from hyla.tasks.sraven_ambiguity import resample_ambiguous

            p = resample_ambiguous(task, p, split, gen)
        for k, v in parts.items():
            v.append(p[k].numpy().astype(np.int64))
    out = {k: np.concatenate(v) for k, v in parts.items()}
    out["rule_names"] = np.array(RULE_NAMES)
    return out


def export_fuzzy_logic(task: FuzzyLogic, split: str, num: int, seed: int) -> dict[str, np.ndarray]:
    """``x`` (N, T, L) float32, ``y`` (N, T) float32 (true targets, the last included), ``terms``
    (N, K, L) bool (True: literal x_i, False: 1 - x_i), ``task_id`` (N,)."""
    task.check_split(split)
    gen = torch.Generator().manual_seed(seed)
    parts: dict[str, list[np.ndarray]] = {"x": [], "y": [], "terms": [], "task_id": []}
    for start in range(0, num, _CHUNK):
        batch = task.sample(min(_CHUNK, num - start), split, gen)
        parts["x"].append(batch.inputs[..., : task.num_variables].numpy())
        parts["y"].append(batch.targets.numpy())
        parts["terms"].append(batch.info["terms"].numpy())
        parts["task_id"].append(batch.info["task_id"].numpy().astype(np.int64))
    return {k: np.concatenate(v) for k, v in parts.items()}
