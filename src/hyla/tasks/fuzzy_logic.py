"""Fuzzy-logic in-context regression (paper-notes section 4).

A *term* is a conjunction over all L literals (``x_i`` or ``1 - x_i``): ``2^L`` terms, term ``t``'s
bit ``i`` set meaning the literal ``x_i``. A *task* is a set of K distinct terms and
``f(x) = max_k min_i literal_{k,i}(x)`` (Zadeh AND = min, NOT = 1 - x, OR = max), ``x ~ U[0,1]^L``.

Splits of the task space (a seeded function of ``split_seed`` alone):

* ``num_unseen_terms`` terms (default 0, as in Table A1) are reserved; every combination containing
  one forms the ``unseen_terms`` split, which exists only then;
* of the remaining combinations a fraction ``holdout`` is ``ood``, chosen so that every
  non-reserved term still appears in some training combination;
* ``train`` and ``test`` draw from the other combinations (``test``: fresh problems of them).

Encoding: token t is ``(x_t, y_t)`` (``input_dim = L + 1``) with the last ``y`` zeroed; the model
predicts it at the last position (``outputs[:, -1, 0]``). ``targets`` are all N true ``y`` values.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch
from torch import Tensor

from hyla.tasks.base import Batch, Task


class FuzzyLogic(Task):
    name = "fuzzy_logic"
    primary_metric = "r2"
    num_output_positions = 1

    def __init__(
        self,
        num_variables: int = 4,
        num_terms: int = 2,
        num_examples: int = 32,
        holdout: float = 0.7,
        split_seed: int = 0,
        num_unseen_terms: int = 0,
    ) -> None:
        if num_variables < 1:
            raise ValueError(f"num_variables must be >= 1, got {num_variables}")
        total_terms = 2**num_variables
        if not 0 <= num_unseen_terms < total_terms:
            raise ValueError(f"num_unseen_terms must be in 0..{total_terms - 1}, got {num_unseen_terms}")
        if not 1 <= num_terms <= total_terms - num_unseen_terms:
            raise ValueError(
                f"num_terms={num_terms} must be in 1..{total_terms - num_unseen_terms} "
                f"(2^num_variables={total_terms} terms minus num_unseen_terms={num_unseen_terms})"
            )
        if num_examples < 2:
            raise ValueError(f"num_examples must be >= 2 (context plus the query), got {num_examples}")
        if not 0 < holdout < 1:
            raise ValueError(f"holdout must be in (0, 1), got {holdout}")
        self.num_variables, self.num_terms, self.num_examples = num_variables, num_terms, num_examples
        self.holdout, self.split_seed, self.num_unseen_terms = holdout, split_seed, num_unseen_terms
        self.input_dim, self.output_dim, self.seq_len = num_variables + 1, 1, num_examples
        # Table A1's compositional split uses every term; the harder unseen-terms split is opt-in
        self.eval_splits = ("test", "ood", "unseen_terms") if num_unseen_terms else ("test", "ood")

        # term t -> literal pattern (True: x_i, False: 1 - x_i)
        bits = (np.arange(total_terms)[:, None] >> np.arange(num_variables)[None, :]) & 1
        self.term_patterns = torch.from_numpy(bits.astype(bool))  # (2^L, L)
        self.combinations = torch.tensor(list(itertools.combinations(range(total_terms), num_terms)))  # (C, K)
        self.task_ids = self._split(np.random.default_rng(split_seed))
        self._device_tables: dict[torch.device, dict[str, Tensor]] = {}

    def _split(self, rng: np.random.Generator) -> dict[str, Tensor]:
        total_terms = 2**self.num_variables
        combos = self.combinations.numpy()
        unseen = rng.permutation(total_terms)[: self.num_unseen_terms]
        has_unseen = np.isin(combos, unseen).any(axis=1)
        seen_ids = np.flatnonzero(~has_unseen)
        seen_terms = np.setdiff1d(np.arange(total_terms), unseen)
        n_ood = round(self.holdout * len(seen_ids))
        if n_ood < 1 or n_ood >= len(seen_ids):
            raise ValueError(
                f"holdout={self.holdout} leaves a split empty ({len(seen_ids)} combinations of seen terms); "
                "choose a holdout strictly between the two"
            )
        if self.num_terms == 1:
            raise ValueError(
                f"holdout={self.holdout} with num_terms=1 would hold out single terms, which then never appear "
                "in training; the compositional split needs num_terms >= 2"
            )
        for _ in range(1000):
            order = rng.permutation(seen_ids)
            ood, train = np.sort(order[:n_ood]), np.sort(order[n_ood:])
            if np.isin(seen_terms, combos[train]).all():
                break
        else:
            raise ValueError(
                f"holdout={self.holdout} is too large: no split found in which every term appears in training"
            )
        ids = {"train": train, "test": train, "ood": ood}
        if self.num_unseen_terms:
            ids["unseen_terms"] = np.flatnonzero(has_unseen)
        self.unseen_terms = torch.from_numpy(np.sort(unseen))
        return {k: torch.from_numpy(v) for k, v in ids.items()}

    def sample(self, batch_size: int, split: str, generator: torch.Generator) -> Batch:
        self.check_split(split)
        dev = generator.device
        if dev not in self._device_tables:  # copy once: no host-to-device transfer in the training step
            self._device_tables[dev] = {
                "patterns": self.term_patterns.to(dev),
                "combinations": self.combinations.to(dev),
                **{k: v.to(dev) for k, v in self.task_ids.items()},
            }
        tables = self._device_tables[dev]
        ids = tables[split]
        pick = torch.randint(len(ids), (batch_size,), generator=generator, device=dev)
        task_id = ids[pick]
        terms_BxKxL = tables["patterns"][tables["combinations"][task_id]]
        x_BxNxL = torch.rand(batch_size, self.num_examples, self.num_variables, generator=generator, device=dev)
        literal_BxNxKxL = torch.where(terms_BxKxL[:, None], x_BxNxL[:, :, None], 1 - x_BxNxL[:, :, None])
        y_BxN = literal_BxNxKxL.amin(dim=-1).amax(dim=-1)
        y_in = y_BxN.clone()
        y_in[:, -1] = 0
        inputs = torch.cat([x_BxNxL, y_in[..., None]], dim=-1)
        return Batch(inputs, y_BxN, {"terms": terms_BxKxL, "task_id": task_id})

    def loss(self, outputs_BxTxO: Tensor, batch: Batch) -> Tensor:
        return (outputs_BxTxO[:, -1, 0] - batch.targets[:, -1]).pow(2).mean()

    def metrics(self, outputs_BxTxO: Tensor, batch: Batch) -> dict[str, Tensor]:
        """``r2`` per sequence: 1 - squared error / population variance of the sequence's N targets."""
        err = (outputs_BxTxO[:, -1, 0] - batch.targets[:, -1]).pow(2)
        var = batch.targets.var(dim=1, unbiased=False).clamp_min(1e-12)
        return {"loss": err, "mse": err, "r2": 1 - err / var}

    def evaluate_terms(self, x_BxNxL: Tensor, terms_BxKxL: Tensor) -> Tensor:
        """Reference evaluation of ``f`` (for tests and exports)."""
        out = torch.zeros(x_BxNxL.shape[:2], dtype=x_BxNxL.dtype)
        for b in range(x_BxNxL.shape[0]):
            for n in range(x_BxNxL.shape[1]):
                out[b, n] = max(
                    min(float(x_BxNxL[b, n, i]) if t[i] else 1 - float(x_BxNxL[b, n, i]) for i in range(t.shape[0]))
                    for t in terms_BxKxL[b]
                )
        return out

    @property
    def num_tasks(self) -> int:
        return math.comb(2**self.num_variables, self.num_terms)
