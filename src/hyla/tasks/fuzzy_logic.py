"""Fuzzy-logic in-context regression (paper-notes section 4).

A *term* is a conjunction over all L literals (``x_i`` or ``1 - x_i``): ``2^L`` terms; term ``t``'s
bit ``i`` set means the literal ``x_i``. A *task* is a set of K distinct terms (a combination, id =
its index in ``itertools.combinations(range(2^L), K)``) and
``f(x) = max_k min_i literal_{k,i}(x)`` (Zadeh AND = min, NOT = 1 - x, OR = max), ``x ~ U[0,1]^L``.

Splits of the task space, a function of ``split_seed`` alone (never of the data seed):

* ``unseen_terms``: ``num_unseen_terms`` terms are reserved; every combination holding at least one
  of them forms this split (the paper's harder split: terms never trained on); ``num_unseen_terms=0``
  (the default) drops it;
* ``ood``: of the combinations of the other ("seen") terms, ``int(holdout * count)`` are held out;
* ``train`` and ``test`` draw from the rest (``test``: fresh problems of the training combinations).

With ``split_style="cover"`` (the default) every seen term appears in some training combination: the
split first puts a random cover of the seen terms (shuffled, cut into groups of K, the last group
topped up) into training, then fills the training set with random other combinations; a ``holdout``
leaving fewer training combinations than a cover needs raises ``ValueError``.

``split_style="authors"`` is the universe of the paper's code (``hyla/data/logic.py``,
``frac_ood_conj=0.25`` -> ``num_unseen_terms=4``): the reserved terms are the *last* ones in product
order over ``{0,1}^L`` (``x_1`` and ``x_2`` both positive for L=4), not random ones; the held-out
combinations are the first ``int(holdout * count)`` of a random permutation, with no cover (a seen
term may never be trained on); and ``unseen_terms`` holds only combinations of reserved terms alone
(their loader "ood": 6 pairs for L=4, K=2).

Encoding: token t is ``(x_t, y_t)`` (``input_dim = L + 1``) with the last ``y`` zeroed; the model
predicts it at the last position (``outputs[:, -1, 0]``). ``targets`` are all N true ``y`` values.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from hyla.tasks.base import Batch, Task

#: sequences whose N targets have a variance below this get it raised to it in ``r2``
R2_MIN_VARIANCE = 1e-12
#: how the task space is split (module docstring)
SPLIT_STYLES: tuple[str, ...] = ("cover", "authors")


@dataclass
class FuzzyLogicOptions:
    """The ``data.*`` options of ``data.task=fuzzy_logic`` and the defaults of ``FuzzyLogic``: the
    paper's setting (Table A1, Fig. 2C: L=4, K=2, N=32, 70% of the term combinations held out) on the
    cover split; the authors' code's universe (``split_style=authors``, 4 unseen terms) is
    ``hyla/configs/fuzzy_logic.yaml``."""

    holdout: float = field(default=0.7, metadata={"help": "fraction of term combinations held out (ood)"})
    num_variables: int = 4
    num_terms: int = 2
    num_examples: int = 32
    # terms never trained on (split unseen_terms if > 0); 0 also keeps the key's value in the records
    # of other tasks' runs, which spell every data.* key (data_config_class)
    num_unseen_terms: int = field(default=0, metadata={"help": "terms reserved for the unseen_terms split"})
    split_style: str = field(default="cover", metadata={"help": f"{' | '.join(SPLIT_STYLES)} (module docstring)"})

    def validate(self) -> None:
        if self.split_style not in SPLIT_STYLES:
            allowed = ", ".join(SPLIT_STYLES)
            raise ValueError(f"data.split_style={self.split_style!r} is not valid; allowed values: {allowed}")


_DEFAULTS = FuzzyLogicOptions()


class FuzzyLogic(Task):
    """Fuzzy-logic regression sequences on demand; see the module docstring for splits and encoding."""

    name = "fuzzy_logic"
    options = FuzzyLogicOptions
    primary_metric = "r2"

    num_output_positions = 1

    def __init__(
        self,
        num_variables: int = _DEFAULTS.num_variables,
        num_terms: int = _DEFAULTS.num_terms,
        num_examples: int = _DEFAULTS.num_examples,
        holdout: float = _DEFAULTS.holdout,
        split_seed: int = 0,
        num_unseen_terms: int = _DEFAULTS.num_unseen_terms,
        split_style: str = _DEFAULTS.split_style,
    ) -> None:
        if split_style not in SPLIT_STYLES:
            raise ValueError(f"split_style={split_style!r} is not valid; allowed values: {', '.join(SPLIT_STYLES)}")
        if not 1 <= num_variables <= 16:
            raise ValueError(f"num_variables must be in 1..16, got {num_variables}")
        total_terms = 2**num_variables
        if not 0 <= num_unseen_terms < total_terms:
            raise ValueError(f"num_unseen_terms must be in 0..{total_terms - 1}, got {num_unseen_terms}")
        seen = total_terms - num_unseen_terms
        if not 1 <= num_terms <= seen:
            raise ValueError(
                f"num_terms={num_terms} must be in 1..{seen} "
                f"(2^num_variables={total_terms} terms minus num_unseen_terms={num_unseen_terms})"
            )
        if math.comb(total_terms, num_terms) > 1_000_000:
            raise ValueError(
                f"num_variables={num_variables}, num_terms={num_terms}: {math.comb(total_terms, num_terms):,} "
                "combinations are too many to tabulate (limit 1,000,000)"
            )
        if num_examples < 2:
            raise ValueError(f"num_examples must be >= 2 (context plus the query), got {num_examples}")
        if not 0 < holdout < 1:
            raise ValueError(f"holdout must be in (0, 1), got {holdout}")
        self.num_variables, self.num_terms, self.num_examples = num_variables, num_terms, num_examples
        self.holdout, self.split_seed, self.num_unseen_terms = holdout, split_seed, num_unseen_terms
        self.split_style = split_style
        self.input_dim, self.output_dim, self.seq_len = num_variables + 1, 1, num_examples
        self.eval_splits = ("test", "ood", "unseen_terms") if num_unseen_terms else ("test", "ood")

        # term t -> literal pattern (True: x_i, False: 1 - x_i)
        bits = (np.arange(total_terms)[:, None] >> np.arange(num_variables)[None, :]) & 1
        self.term_patterns = torch.from_numpy(bits.astype(bool))  # (2^L, L)
        self.combinations = torch.tensor(list(itertools.combinations(range(total_terms), num_terms)))  # (C, K)
        split = self._split if split_style == "cover" else self._authors_split
        self.unseen_terms, self.task_ids = split(np.random.default_rng(split_seed))
        self._device_tables: dict[torch.device, dict[str, Tensor]] = {}

    @property
    def num_tasks(self) -> int:
        return len(self.combinations)

    def _split(self, rng: np.random.Generator) -> tuple[Tensor, dict[str, Tensor]]:
        """(reserved terms, combination ids per split): see the module docstring."""
        total_terms, k = 2**self.num_variables, self.num_terms
        combos = self.combinations.numpy()
        unseen = np.sort(rng.permutation(total_terms)[: self.num_unseen_terms])
        has_unseen = np.isin(combos, unseen).any(axis=1)
        seen_ids = np.flatnonzero(~has_unseen)
        seen_terms = np.setdiff1d(np.arange(total_terms), unseen)
        n_ood = int(self.holdout * len(seen_ids))
        n_cover = math.ceil(len(seen_terms) / k)
        if n_ood < 1 or len(seen_ids) - n_ood < n_cover:
            raise ValueError(
                f"holdout={self.holdout} leaves {n_ood} held-out and {len(seen_ids) - n_ood} training combinations "
                f"of {len(seen_ids)}; training needs >= {n_cover} to contain each of the {len(seen_terms)} seen "
                "terms and ood >= 1: choose another holdout"
            )
        # a random cover of the seen terms: shuffled, cut into groups of K, the last topped up
        shuffled = rng.permutation(seen_terms)
        index_of = {tuple(c): i for i, c in enumerate(combos.tolist())}
        cover = set()
        for start in range(0, len(shuffled), k):
            group = list(shuffled[start : start + k])
            others = [t for t in shuffled if t not in group]
            group += list(rng.choice(others, size=k - len(group), replace=False)) if len(group) < k else []
            cover.add(index_of[tuple(sorted(int(t) for t in group))])
        rest = rng.permutation(np.setdiff1d(seen_ids, sorted(cover)))
        n_train = len(seen_ids) - n_ood
        train = np.sort(np.concatenate([sorted(cover), rest[: n_train - len(cover)]])).astype(np.int64)
        ood = np.sort(rest[n_train - len(cover) :]).astype(np.int64)
        ids = {"train": train, "test": train, "ood": ood}
        if self.num_unseen_terms:
            ids["unseen_terms"] = np.flatnonzero(has_unseen)
        return torch.from_numpy(unseen), {name: torch.from_numpy(v) for name, v in ids.items()}

    def _authors_split(self, rng: np.random.Generator) -> tuple[Tensor, dict[str, Tensor]]:
        """(reserved terms, combination ids per split) as the paper's code splits: see the module docstring."""
        total_terms, combos = 2**self.num_variables, self.combinations.numpy()
        # product order over {0,1}^L reads bit i of our term id as its (i+1)-th digit, most significant first
        digits = (np.arange(total_terms)[:, None] >> np.arange(self.num_variables)[None, :]) & 1
        product_rank = digits @ (2 ** np.arange(self.num_variables - 1, -1, -1))
        unseen = np.sort(np.argsort(product_rank)[total_terms - self.num_unseen_terms :])
        in_unseen = np.isin(combos, unseen)
        seen_ids = np.flatnonzero(~in_unseen.any(axis=1))
        n_ood = int(self.holdout * len(seen_ids))
        if not 1 <= n_ood < len(seen_ids):
            raise ValueError(
                f"holdout={self.holdout} leaves {n_ood} held-out and {len(seen_ids) - n_ood} training combinations "
                f"of {len(seen_ids)}; both need >= 1: choose another holdout"
            )
        order = rng.permutation(seen_ids)
        ids = {"train": np.sort(order[n_ood:]), "ood": np.sort(order[:n_ood])}
        ids["test"] = ids["train"]
        if self.num_unseen_terms:
            only_unseen = np.flatnonzero(in_unseen.all(axis=1))
            if len(only_unseen) == 0:
                raise ValueError(
                    f"num_unseen_terms={self.num_unseen_terms} < num_terms={self.num_terms}: no combination of "
                    "reserved terms alone for the unseen_terms split (split_style=authors)"
                )
            ids["unseen_terms"] = only_unseen
        return torch.from_numpy(unseen), {k: torch.from_numpy(v.astype(np.int64)) for k, v in ids.items()}

    def _tables(self, device: torch.device) -> dict[str, Tensor]:
        """Per split: combination ids and their literal patterns ``(n, K, L)``, copied to ``device`` once."""
        if device not in self._device_tables:
            t = {}
            for split, ids in self.task_ids.items():
                t[f"ids_{split}"] = ids.to(device)
                t[f"terms_{split}"] = self.term_patterns[self.combinations[ids]].to(device)
            self._device_tables[device] = t
        return self._device_tables[device]

    def sample(self, batch_size: int, split: str, generator: torch.Generator) -> Batch:
        self.check_split(split)
        dev = generator.device
        tables = self._tables(dev)
        ids = tables[f"ids_{split}"]
        pick = torch.randint(len(ids), (batch_size,), generator=generator, device=dev)
        terms_BxKxL = tables[f"terms_{split}"][pick]
        # x is drawn in place inside the inputs (the y column's draw is overwritten): no concatenation
        inputs_BxNxD = torch.rand(batch_size, self.num_examples, self.input_dim, generator=generator, device=dev)
        x_BxNxL = inputs_BxNxD[..., :-1]
        literal_BxNxKxL = torch.where(terms_BxKxL[:, None], x_BxNxL[:, :, None], 1 - x_BxNxL[:, :, None])
        y_BxN = literal_BxNxKxL.amin(dim=-1).amax(dim=-1)
        inputs_BxNxD[..., -1] = y_BxN
        inputs_BxNxD[:, -1, -1] = 0
        return Batch(inputs_BxNxD, y_BxN, {"terms": terms_BxKxL, "task_id": ids[pick]})

    def loss(self, outputs_BxTxO: Tensor, batch: Batch) -> Tensor:
        return (outputs_BxTxO[:, -1, 0] - batch.targets[:, -1]).pow(2).mean()

    def metrics(self, outputs_BxTxO: Tensor, batch: Batch) -> dict[str, Tensor]:
        """``r2`` per sequence: 1 - squared error / population variance of that sequence's N targets
        (the error of always predicting the sequence mean; floored at ``R2_MIN_VARIANCE``);
        ``mse`` = ``loss`` = the squared error of the last prediction."""
        err = (outputs_BxTxO[:, -1, 0] - batch.targets[:, -1]).pow(2)
        var = batch.targets.var(dim=1, unbiased=False).clamp_min(R2_MIN_VARIANCE)
        return {"loss": err, "mse": err, "r2": 1 - err / var}

    # ------------------------------------------------------------------ outside views
    def export_chunk(self, num: int, split: str, generator: torch.Generator) -> dict[str, np.ndarray]:
        """``x`` (N, T, L) float32, ``y`` (N, T) float32 (true targets, the last included), ``terms``
        (N, K, L) bool (True: literal x_i, False: 1 - x_i), ``task_id`` (N,)."""
        batch = self.sample(num, split, generator)
        return {
            "x": batch.inputs[..., : self.num_variables].numpy(),
            "y": batch.targets.numpy(),
            "terms": batch.info["terms"].numpy(),
            "task_id": batch.info["task_id"].numpy().astype(np.int64),
        }

    def latent_arrays(self, codes_BxLxHxTxT: Tensor, batch: Batch) -> dict[str, np.ndarray]:
        """``codes`` (B, layers, N-1, H) of the last query (whose y is predicted) with every context
        key; its labels ``terms`` (B, K, L); ``task_id``."""
        t = codes_BxLxHxTxT.shape[-1]
        return {
            "codes": codes_BxLxHxTxT[:, :, :, t - 1, : t - 1].permute(0, 1, 3, 2).numpy().astype(np.float32),
            "terms": batch.info["terms"].numpy(),
            "task_id": batch.info["task_id"].numpy(),
        }


def matches_paper_setting(config: dict[str, Any]) -> bool:
    """Table A1: holdout 0.7, L=4, K=2, N=32 (unseen terms only the authors' way), 2 layers of width
    128 with 8 heads (the registry entry's ``matches_paper_setting``)."""
    data, model = config["data"], config["model"]
    return (
        data["holdout"] == 0.7
        and data["num_variables"] == 4
        and data["num_terms"] == 2
        and data["num_examples"] == 32
        and (not data.get("num_unseen_terms") or data.get("split_style") == "authors")
        and model["num_layers"] == 2
        and model["emb_dim"] == 128
        and model["num_heads"] == 8
    )
