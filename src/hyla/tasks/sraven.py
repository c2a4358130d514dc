"""Symbolic Raven progressive matrices (SRAVEN; paper-notes section 3).

A problem is a ``G x G`` grid of panels (G = ``grid_size`` = 3), each panel F features with values in
``0..V-1`` (mod-V arithmetic). Each *canonical* feature f follows one rule along every row:

====  ================  =====================================================================
 id   name              row (c_0, ..., c_{G-1})
====  ================  =====================================================================
 0    constant          one random value per row
 1-4  progression±1/±2  random start, then start + d * column
 5    addition          random c_0..c_{G-2}, last = their sum
 6    subtraction       random c_0..c_{G-2}, last = c_0 - c_1 - ... - c_{G-2}
 7    distribute_three  G distinct values shared by all rows, each row a random permutation
====  ================  =====================================================================

A *task* is the multiset of F rules (``C(8+F-1, F)`` = 330 tasks for F=4); canonical feature f
gets the f-th rule of the sorted multiset (as in the paper's code). A fraction ``holdout`` of the
tasks (``int(holdout * num_tasks)`` = 82) is the OOD split, chosen by ``split_seed`` alone.

Feature permutation: for each problem and column c the F feature slots are permuted by ``perm[c]``,
shared by the rows of that column: ``grid[r, c, i] = canonical[r, c, perm[c, i]]``.

Encoding (``seq_len = G*G*F`` = 36): the ``G*G - 1`` context panels row-major, each as F tokens
in slot order (token ``(r*G + c)*F + i`` holds ``grid[r, c, i]`` one-hot over V), then F all-zero
query tokens for the answer panel ``grid[G-1, G-1]``; ``input_dim = V``. The model's outputs at the
last F positions are the answer logits; ``targets = grid[:, G-1, G-1]`` (slot order).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from hyla.tasks.base import Batch, Task

RULE_NAMES: tuple[str, ...] = (
    "constant",
    "progression+1",
    "progression+2",
    "progression-1",
    "progression-2",
    "addition",
    "subtraction",
    "distribute_three",
)


class SRaven(Task):
    name = "sraven"
    primary_metric = "acc"
    eval_splits = ("test", "ood")

    def __init__(
        self,
        num_features: int = 4,
        num_values: int = 8,
        grid_size: int = 3,
        holdout: float = 0.25,
        rules: list[str] | tuple[str, ...] | None = None,
        split_seed: int = 0,
        permute_features: bool = True,
        unambiguous_only: bool = False,
    ) -> None:
        rules = tuple(RULE_NAMES if rules is None else rules)
        unknown = [r for r in rules if r not in RULE_NAMES]
        if unknown or not rules or len(set(rules)) != len(rules):
            raise ValueError(f"rules={list(rules)} must be distinct names from: {', '.join(RULE_NAMES)}")
        if num_features < 1:
            raise ValueError(f"num_features must be >= 1, got {num_features}")
        if num_values < 2:
            raise ValueError(f"num_values must be >= 2, got {num_values}")
        if grid_size < 2:
            raise ValueError(f"grid_size must be >= 2, got {grid_size}")
        if "distribute_three" in rules and num_values < grid_size:
            raise ValueError(
                f"num_values={num_values} is too small for distribute_three, which needs grid_size={grid_size} "
                "distinct values per row; raise num_values or drop the rule"
            )
        if not 0 <= holdout < 1:
            raise ValueError(f"holdout must be in [0, 1), got {holdout}")
        self.num_features, self.num_values, self.grid_size = num_features, num_values, grid_size
        self.holdout, self.split_seed, self.permute_features = holdout, split_seed, permute_features
        self.unambiguous_only = unambiguous_only
        self.rule_names = rules
        self.rule_ids = torch.tensor([RULE_NAMES.index(r) for r in rules])
        self.input_dim, self.output_dim = num_values, num_values
        self.seq_len = grid_size * grid_size * num_features
        self.num_output_positions = num_features

        # tasks: sorted multisets of rule ids (global ids, so names stay meaningful with a subset)
        tasks = list(itertools.combinations_with_replacement(self.rule_ids.tolist(), num_features))
        self.tasks = torch.tensor(tasks)  # (num_tasks, F)
        num_ood = int(holdout * len(tasks))
        if holdout > 0 and num_ood == 0:
            raise ValueError(f"holdout={holdout} holds out no task of {len(tasks)}; raise it or use 0")
        if num_ood >= len(tasks):
            raise ValueError(f"holdout={holdout} leaves no training task of {len(tasks)}")
        order = torch.from_numpy(np.random.default_rng(split_seed).permutation(len(tasks)))
        self.task_ids = {"train": order[num_ood:].sort().values, "ood": order[:num_ood].sort().values}
        self.task_ids["test"] = self.task_ids["train"]
        # small random permutations are drawn as an index into a table (much faster than argsort)
        self._feature_perms = _permutation_table(num_features)
        self._row_perms = _permutation_table(grid_size)
        self._symbol_tuples = _ordered_subsets(num_values, grid_size) if num_values >= grid_size else None
        self._device_cache: dict[torch.device, dict[str, Tensor | None]] = {}

    def _tables(self, device: torch.device) -> dict[str, Tensor | None]:
        if device not in self._device_cache:
            self._device_cache[device] = {
                "tasks": self.tasks.to(device),
                "one_hot": torch.eye(self.num_values + 1, self.num_values, device=device),
                "steps": torch.tensor([0, 1, 2, -1, -2, 0, 0, 0], dtype=torch.int16, device=device),
                "feature_perms": None if self._feature_perms is None else self._feature_perms.to(device),
                "row_perms": None if self._row_perms is None else self._row_perms.to(device),
                "symbols": None if self._symbol_tuples is None else self._symbol_tuples.to(device),
                **{f"ids_{k}": v.to(device) for k, v in self.task_ids.items()},
            }
        return self._device_cache[device]

    @property
    def num_tasks(self) -> int:
        return math.comb(len(self.rule_names) + self.num_features - 1, self.num_features)

    # ------------------------------------------------------------------ generation
    def canonical_grids(self, rules_BxF: Tensor, generator: torch.Generator) -> Tensor:
        """Grids ``B x G x G x F`` (rows, columns, canonical features) following ``rules_BxF``.

        Rules 0-4 share one formula, ``(first + step * column) mod V`` with a per-feature step (0 for
        constant); addition/subtraction complete random leading columns; distribute_three gathers
        from G distinct symbols. Values are int16 until the end (half the memory traffic of int64).
        """
        dev = generator.device
        b, f, g, v = rules_BxF.shape[0], self.num_features, self.grid_size, self.num_values
        tables = self._tables(dev)
        draws = torch.randint(v, (b, g, g, f), generator=generator, device=dev, dtype=torch.int16)
        step_BxF = tables["steps"][rules_BxF]
        col = torch.arange(g, device=dev, dtype=torch.int16)[None, None, :, None]
        grid = (draws[:, :, :1] + step_BxF[:, None, None] * col).remainder_(v)  # rules 0-4
        lead = draws[:, :, : g - 1]
        sign = torch.where(rules_BxF == 6, -1, 1).to(torch.int16)[:, None, None]
        last = (lead[:, :, :1] + sign * lead[:, :, 1:].sum(2, keepdim=True, dtype=torch.int16)).remainder_(v)
        arith = torch.cat([lead, last], dim=2)
        grid = torch.where(((rules_BxF == 5) | (rules_BxF == 6))[:, None, None], arith, grid)
        if g <= v:  # distribute_three: G distinct values per feature, a permutation of them per row
            symbols_BxGxF = _random_rows(
                tables["symbols"],
                (b, f),
                generator,
                lambda: torch.rand(b, f, v, generator=generator, device=dev).argsort(-1)[..., :g],
            ).permute(0, 2, 1)
            row_perm_BxGxGxF = _random_rows(
                tables["row_perms"],
                (b, g, f),
                generator,
                lambda: torch.rand(b, g, f, g, generator=generator, device=dev).argsort(-1),
            ).permute(0, 1, 3, 2)
            dist = torch.gather(symbols_BxGxF[:, None].expand(-1, g, -1, -1), 2, row_perm_BxGxGxF).to(torch.int16)
            grid = torch.where((rules_BxF == 7)[:, None, None], dist, grid)
        return grid.long()

    def sample_problems(self, batch_size: int, split: str, generator: torch.Generator) -> dict[str, Tensor]:
        """``grid`` (model's view), ``canonical``, ``rules``, ``perm``, ``task_id`` for fresh problems."""
        self.check_split(split)
        dev = generator.device
        tables = self._tables(dev)
        ids = tables[f"ids_{split}"]
        task_id = ids[torch.randint(len(ids), (batch_size,), generator=generator, device=dev)]
        rules = tables["tasks"][task_id]
        canonical = self.canonical_grids(rules, generator)
        g, f = self.grid_size, self.num_features
        if self.permute_features:
            perm = _random_rows(
                tables["feature_perms"],
                (batch_size, g),
                generator,
                lambda: torch.rand(batch_size, g, f, generator=generator, device=dev).argsort(-1),
            )
        else:
            perm = torch.arange(f, device=dev).expand(batch_size, g, f)
        grid = torch.gather(canonical, 3, perm[:, None].expand(-1, g, -1, -1))
        return {"grid": grid, "canonical": canonical, "rules": rules, "perm": perm, "task_id": task_id}

    def sample(self, batch_size: int, split: str, generator: torch.Generator) -> Batch:
        p = self.sample_problems(batch_size, split, generator)
        if self.unambiguous_only:
            from hyla.tasks.sraven_ambiguity import resample_ambiguous

            p = resample_ambiguous(self, p, split, generator)
        return self.encode(p)

    def encode(self, p: dict[str, Tensor]) -> Batch:
        grid = p["grid"]
        b, g, f, v = grid.shape[0], self.grid_size, self.num_features, self.num_values
        values_BxT = grid.reshape(b, g * g * f).clone()
        values_BxT[:, (g * g - 1) * f :] = v  # query tokens: the all-zero row of the table below
        inputs = F.embedding(values_BxT, self._tables(grid.device)["one_hot"])  # one lookup: fastest one-hot
        info = {k: p[k] for k in ("grid", "rules", "perm", "task_id")}
        return Batch(inputs, grid[:, g - 1, g - 1], info)

    # ------------------------------------------------------------------ objective
    def loss(self, outputs_BxTxO: Tensor, batch: Batch) -> Tensor:
        logits = outputs_BxTxO[:, -self.num_features :]
        return F.cross_entropy(logits.reshape(-1, self.num_values), batch.targets.reshape(-1))

    def metrics(self, outputs_BxTxO: Tensor, batch: Batch) -> dict[str, Tensor]:
        logits = outputs_BxTxO[:, -self.num_features :]
        correct = logits.argmax(-1) == batch.targets
        ce = F.cross_entropy(logits.transpose(1, 2), batch.targets, reduction="none").mean(1)
        return {"loss": ce, "acc": correct.all(1).float(), "feature_acc": correct.float().mean(1)}


_TABLE_LIMIT = 50_000


def _permutation_table(n: int) -> Tensor | None:
    """All permutations of ``range(n)`` (n! x n), or None when too many to tabulate."""
    if math.factorial(n) > _TABLE_LIMIT:
        return None
    return torch.tensor(list(itertools.permutations(range(n))))


def _ordered_subsets(v: int, g: int) -> Tensor | None:
    """All ordered g-tuples of distinct values below v, or None when too many."""
    if math.perm(v, g) > _TABLE_LIMIT:
        return None
    return torch.tensor(list(itertools.permutations(range(v), g)))


def _random_rows(table: Tensor | None, shape: tuple[int, ...], generator: torch.Generator, fallback) -> Tensor:
    """Uniform rows of ``table`` (shape + row), or ``fallback()`` when there is no table."""
    if table is None:
        return fallback()
    idx = torch.randint(len(table), shape, generator=generator, device=generator.device)
    return table[idx]
