"""A toy task defined outside ``hyla.tasks``: which of two features has the larger mean over the sequence.

It shows what a new task is: one module (this one: the task, its options dataclass and what the rest of the
library asks about it, ``TOY_FACTS``) and one registration (``register_task(ToyTask, **TOY_FACTS)``; in the
library, one call in ``hyla/tasks/__init__.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from hyla.tasks.base import Batch, Task


@dataclass
class ToyOptions:
    """The ``data.*`` options of ``data.task=toy`` (names of their own: the data section holds every task's)."""

    toy_length: int = field(default=6, metadata={"help": "tokens per problem"})
    toy_dim: int = 3
    toy_ood_shift: float = field(default=1.0, metadata={"help": "added to the ood inputs"})


_DEFAULTS = ToyOptions()


class ToyTask(Task):
    """Label 1 where feature 0 has a larger mean over the tokens than feature 1; ``ood`` shifts every input."""

    name = "toy"
    options = ToyOptions
    primary_metric = "acc"
    eval_splits = ("test", "ood")
    num_output_positions = 1

    def __init__(
        self,
        toy_length: int = _DEFAULTS.toy_length,
        toy_dim: int = _DEFAULTS.toy_dim,
        toy_ood_shift: float = _DEFAULTS.toy_ood_shift,
        split_seed: int = 0,
    ) -> None:
        if toy_dim < 2:
            raise ValueError(f"toy_dim must be >= 2, got {toy_dim}")
        self.seq_len, self.input_dim, self.output_dim = toy_length, toy_dim, 2
        self.ood_shift = toy_ood_shift

    def sample(self, batch_size: int, split: str, generator: torch.Generator) -> Batch:
        self.check_split(split)
        size = (batch_size, self.seq_len, self.input_dim)
        inputs_BxTxD = torch.randn(size, generator=generator, device=generator.device)
        if split == "ood":
            inputs_BxTxD += self.ood_shift
        targets_B = (inputs_BxTxD[..., 0].mean(1) > inputs_BxTxD[..., 1].mean(1)).long()
        return Batch(inputs_BxTxD, targets_B)

    def loss(self, outputs_BxTxO: Tensor, batch: Batch) -> Tensor:
        return F.cross_entropy(outputs_BxTxO[:, -1], batch.targets)

    def metrics(self, outputs_BxTxO: Tensor, batch: Batch) -> dict[str, Tensor]:
        logits_BxO = outputs_BxTxO[:, -1]
        loss = F.cross_entropy(logits_BxO, batch.targets, reduction="none")
        return {"loss": loss, "acc": (logits_BxO.argmax(-1) == batch.targets).float()}


#: its registry entry's facts (``hyla.tasks.entry.TaskEntry``): exported by ``hyla data toy``; no paper column,
#: no latent-code probe
TOY_FACTS: dict[str, Any] = {"export_help": "toy problems: inputs, targets"}
