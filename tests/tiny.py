"""Config overrides for tiny, seconds-long runs shared by the training, stacking and analysis tests."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    import torch


#: seconds after which a test gives up on a subprocess or an awaited event: a guard against a hang, never a
#: measure of speed (a busy 2-core machine may take minutes where an idle one takes seconds); tests stop runs on
#: counts (steps), never on this
HANG_GUARD_S = 30 * 60

#: the authors' configs/raven.py shrunk for tests that run their code (lab/authors/authors_sraven_resumable.py);
#: warmup must stay below the schedule (optax needs decay_steps > 0)
AUTHORS_TINY_BATCH = 8
AUTHORS_TINY_MODEL = [
    "--config.model.num_layers=1",
    "--config.model.emb_dim=16",
    "--config.model.mlp_dim=16",
    "--config.model.num_heads=4",
    "--config.model.qk_dim=8",
    "--config.model.v_dim=8",
    f"--config.batch_size={AUTHORS_TINY_BATCH}",
    "--config.warmup_steps=4",
]


def tiny_overrides(
    *,
    layers: int = 1,
    steps: int = 8,
    every: int = 4,
    log_every: int | None = None,
    warmup_steps: int | None = None,
) -> list[str]:
    """A 16-wide model of ``layers`` blocks trained ``steps`` steps of 16 problems, evaluated and
    checkpointed ``every`` steps on 64 problems (logged every ``log_every``, default ``every``).

    The split is fixed and no attention dropout is drawn (the paper configs' split follows the seed and
    they drop latent pairs; tests of those options leave these two overrides out)."""
    overrides = [
        f"model.num_layers={layers}",
        "model.emb_dim=16",
        "model.num_heads=2",
        "model.qk_dim=8",
        "model.v_dim=8",
        "model.mlp_dim=32",
        f"train.steps={steps}",
        f"train.eval_every={every}",
        "train.eval_size=64",
        "train.eval_batch_size=32",
        f"train.log_every={log_every or every}",
        f"train.checkpoint_every={every}",
        "train.batch_size=16",
        "data.split_seed=0",
        "model.attention_dropout=0",
    ]
    return overrides + ([f"train.warmup_steps={warmup_steps}"] if warmup_steps is not None else [])


@contextmanager
def torch_threads(count: int | None = None) -> Iterator[None]:
    """Run the block with torch on ``count`` threads (``None``: leave it), then give back the count it had:
    tests that change it must not leak it to the next test on their xdist worker."""
    import torch

    threads = torch.get_num_threads()
    try:
        if count is not None:
            torch.set_num_threads(count)
        yield
    finally:
        torch.set_num_threads(threads)


def sigterm_after_step(trainer: Any, step: int) -> None:
    """Make ``trainer`` (lone or stacked) receive SIGTERM right after it finishes step ``step``."""
    real_step = trainer.train_step

    def step_then_sigterm() -> None:
        real_step()
        if trainer.step == step:
            os.kill(os.getpid(), signal.SIGTERM)

    trainer.train_step = step_then_sigterm


def triton_device_or_skip() -> torch.device:
    """Where the Triton kernel tests run: CUDA when available, else CPU under the Triton interpreter;
    skips the test otherwise."""
    import importlib.util

    import pytest
    import torch

    from hyla.attention.kernels.triton import interpreter_enabled

    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed (pip install 'hyla[kernels]')")
    if torch.cuda.is_available():
        return torch.device("cuda")
    if not interpreter_enabled():
        pytest.skip("no CUDA device and TRITON_INTERPRET is not set (make test sets it)")
    from hyla.attention.kernels.triton import kernel

    if not kernel.INTERPRETED:
        pytest.skip("the Triton kernel module was imported before TRITON_INTERPRET=1 was set in this process")
    return torch.device("cpu")


def autograd_node_names(t: torch.Tensor) -> set[str]:
    """The names of the autograd nodes that produced ``t`` (which code paths a forward took)."""
    names, stack, seen = set(), [t.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        stack.extend(n for n, _ in node.next_functions)
    return names


#: the tiny size of the sweeps here
TINY_SWEEP_OVERRIDES = tiny_overrides(layers=1, steps=8, every=4, log_every=2, warmup_steps=2)


def write_sweep(tmp_path: Path, *, rows: dict, grid: dict, seeds: list[int], extra: dict | None = None) -> Path:
    overrides = dict(o.split("=", 1) for o in TINY_SWEEP_OVERRIDES)
    spec = {
        "name": "tiny",
        "config": "fuzzy_logic",
        "rows": rows,
        "grid": grid,
        "seeds": seeds,
        # the paper config's split (follows the seed) and dropout: a row's seeds and grid points stack
        "overrides": {
            k: yaml.safe_load(v)
            for k, v in {
                **overrides,
                "data.split_seed": "null",
                "model.attention_dropout": "0.1",
                **(extra or {}),
            }.items()
        },
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def fake_record(root: Path, spec, test: float, ood: float, steps: int = 10) -> None:
    """A finished run's record: its resolved config and a final evaluation with these R^2 values."""
    from hyla.train.config import dump_config, load_config

    run = root / spec.name
    run.mkdir(parents=True)
    cfg = load_config(spec.config, [*spec.overrides, f"train.steps={steps}"])
    (run / "config.yaml").write_text(dump_config(cfg))
    rows = [{"step": steps, "split": s, "r2": v, "loss": 0.1} for s, v in (("test", test), ("ood", ood))]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    made = {"commit": "abc1234", "machine": "m", "device": "cpu", "date": "d", "wall_s": 60.0, "stacked_with": 1}
    (run / "made_by.jsonl").write_text(json.dumps(made) + "\n")


def load_script(path: Path) -> ModuleType:
    """A script of the repository (not a package module) imported by its path, registered under its file name
    (a dataclass in it reads its own module's namespace)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
