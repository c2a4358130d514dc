"""The interface every task implements: fresh problems on demand, a loss and per-problem metrics."""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor


@dataclass
class Batch:
    """One batch of problems, all tensors on the generator's device.

    ``inputs`` is ``B x T x input_dim`` (float) as the model reads it; ``targets`` is task-specific;
    ``info`` holds the ground truth behind each problem (rules, terms, ...) for analysis.
    """

    inputs: Tensor
    targets: Tensor
    info: dict[str, Tensor] = field(default_factory=dict)

    def to(self, device: torch.device | str) -> Batch:
        return Batch(self.inputs.to(device), self.targets.to(device), {k: v.to(device) for k, v in self.info.items()})


class Task(ABC):
    """A stream of problems. ``sample`` must be deterministic given the generator's state.

    A task samples, scores and states its sizes; what the rest of the code asks about it (its paper column,
    its ``hyla data`` flags, its latent-code probe...) is its registry entry's (``hyla.tasks.entry.TaskEntry``),
    so that this interface stays what any task must implement."""

    #: its ``data.task`` name
    name: ClassVar[str]
    #: the dataclass of its ``data.*`` config keys: the one place their defaults live
    options: ClassVar[type]
    input_dim: int
    output_dim: int
    seq_len: int
    #: evaluation splits besides ``train`` (e.g. ``("test", "ood")``)
    eval_splits: tuple[str, ...]
    #: the metric that summarizes a split: ``"acc"`` or ``"r2"`` (higher is better), ``"ppl"`` (lower)
    primary_metric: str
    #: ``loss``/``metrics`` read only the last P positions of the outputs (None: all); the trainer
    #: then asks the model for those positions only, which skips most of the last layer's work
    num_output_positions: int | None = None
    #: inputs are token ids (the model embeds a vocabulary), not vectors
    token_inputs: bool = False

    @classmethod
    def from_options(cls, options: Any, split_seed: int, run_dir: Path | None = None) -> Task:
        """The task of a config: its options dataclass (the ``data.*`` keys) as constructor arguments."""
        return cls(**dataclasses.asdict(options), split_seed=split_seed)

    @property
    def splits(self) -> tuple[str, ...]:
        return ("train", *self.eval_splits)

    def model_sizes(self) -> dict[str, Any]:
        """The model config fields this task fixes (its input and output sizes)."""
        return {"input_dim": self.input_dim, "output_dim": self.output_dim, "vocab_size": None}

    def describe(self) -> str:
        """One line on the data, for a run's start message ("" when the config says it all)."""
        return ""

    @abstractmethod
    def sample(self, batch_size: int, split: str, generator: torch.Generator) -> Batch:
        """``batch_size`` fresh problems of ``split`` drawn with ``generator`` (on its device)."""

    @abstractmethod
    def loss(self, outputs_BxTxO: Tensor, batch: Batch) -> Tensor:
        """Scalar training loss (mean over the batch)."""

    @abstractmethod
    def metrics(self, outputs_BxTxO: Tensor, batch: Batch) -> dict[str, Tensor]:
        """Per-problem metrics, each a ``(B,)`` tensor, including ``"loss"`` and ``primary_metric``."""

    def summarize(self, means: dict[str, float]) -> dict[str, float]:
        """A split's (or a log interval's) metrics from the means of ``metrics`` over its problems."""
        return means

    def export_chunk(self, num: int, split: str, generator: torch.Generator) -> dict[str, np.ndarray]:
        """``num`` problems for ``hyla data``: by default the model's ``inputs``, the ``targets`` and ``info``."""
        batch = self.sample(num, split, generator)
        return {"inputs": batch.inputs.numpy(), "targets": batch.targets.numpy()} | {
            k: v.numpy() for k, v in batch.info.items()
        }

    def constant_arrays(self) -> dict[str, np.ndarray]:
        """Arrays that name the ids in exports and latent codes (e.g. ``rule_names``)."""
        return {}

    def latent_arrays(self, codes_BxLxHxTxT: Tensor, batch: Batch) -> dict[str, np.ndarray]:
        """The latent code ``a[h, q, k]`` at the (query, key) pairs that matter and their labels
        (``hyla.analysis.latents``); ``codes_BxLxHxTxT`` holds every layer, head and pair."""
        raise NotImplementedError(f"{self.name} has no latent-code analysis")

    def ambiguous_fraction(self, num: int, seed: int, criterion: str) -> float:
        """Fraction of ``num`` training problems (generator seed ``seed``) with another valid answer."""
        raise NotImplementedError(f"{self.name} has no ambiguity check")

    def check_split(self, split: str) -> None:
        if split not in self.splits:
            raise ValueError(f"split={split!r} is not valid for {self.name}; allowed values: {', '.join(self.splits)}")
