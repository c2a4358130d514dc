"""Export task problems as ``.npz`` for other frameworks (format in the README); ``hyla data`` drives it
(``hyla.export``, which can also build the task from a training config). Each task says what a
problem's arrays are (``export_chunk``)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from hyla.tasks.base import Task

#: problems drawn per call (memory stays bounded for any ``num``)
CHUNK = 65_536


def save_npz(path: Path, **arrays: np.ndarray) -> None:
    """Write atomically: a temporary file in the same folder, then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".npz")
    os.close(fd)
    umask = os.umask(0)  # mkstemp makes it 0600: the file gets the mode any other file of this process would
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    try:
        np.savez_compressed(tmp, **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def export_problems(task: Task, split: str, num: int, seed: int) -> dict[str, np.ndarray]:
    """``num`` problems of ``split`` as the task's export arrays, plus its ``constant_arrays``.

    Drawn in chunks from ``torch.Generator().manual_seed(seed)`` on the CPU: the same arguments give
    the same file."""
    task.check_split(split)
    gen = torch.Generator().manual_seed(seed)
    parts: dict[str, list[np.ndarray]] = {}
    for start in range(0, num, CHUNK):
        for k, v in task.export_chunk(min(CHUNK, num - start), split, gen).items():
            parts.setdefault(k, []).append(v)
    return {k: np.concatenate(v) for k, v in parts.items()} | task.constant_arrays()
