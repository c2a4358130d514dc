"""Symbolic Raven progressive matrices (SRAVEN; paper-notes section 3).

A problem is a ``G x G`` grid of panels (G = ``grid_size`` = 3), each panel F features with values in
``0..V-1`` (mod-V arithmetic). Each *canonical* feature f follows one rule along every row:

====  ================  =====================================================================
 id   name              row (c_0, ..., c_{G-1}) of one feature
====  ================  =====================================================================
 0    constant          one random value per row, repeated
 1-4  progression±1/±2  random start, then start + d * column
 5    addition          random c_0..c_{G-2}, last = their sum
 6    subtraction       random c_0..c_{G-2}, last = c_0 - c_1 - ... - c_{G-2}
 7    distribute_three  G distinct values shared by all rows, each row a random permutation
====  ================  =====================================================================

(addition/subtraction need ``grid_size >= 3``; distribute_three needs ``num_values >= grid_size``.)

A *task* is the multiset of F rules (``C(8+F-1, F)`` = 330 tasks for F=4); canonical feature f
gets the f-th rule of the sorted multiset (as in the paper's code). A fraction ``holdout`` of the
tasks (``int(holdout * num_tasks)`` = 82) is the ``ood`` split, chosen by ``split_seed`` alone; the
others are ``train`` and ``test`` (fresh problems of the training tasks). ``holdout=0`` drops ``ood``.
``heldout_draw`` says how the seed picks them: ``numpy`` (ours: a numpy permutation) or ``authors`` (the
tasks the authors' JAX code holds out for that seed, tabulated for seeds 0-9 in
``sraven_authors_heldout.json``: the same split as their run of that seed).

Feature permutation: for each problem and column c the F feature slots are permuted by ``perm[c]``,
shared by the rows of that column: ``grid[r, c, i] = canonical[r, c, perm[c, i]]``.

Encoding (``seq_len = G*G*F`` = 36, ``input_dim = V``): token ``(r*G + c)*F + i`` holds panel
``(r, c)``'s slot ``i`` one-hot over V (panels row-major, slots in the model's permuted order); the
last F tokens (the answer panel ``(G-1, G-1)``) are all-zero query tokens. The model's outputs at
those F positions are the answer logits; ``targets = grid[:, G-1, G-1]`` (slot order).

Sampling. Every rule's rows come from one small table of rows (504 rows for the defaults): a
problem's feature picks G row indices (independent rows for rules 0-6; for distribute_three a shared
value set plus one permutation per row). All randomness is one ``torch.rand`` float64 call on the
generator's device, turned into indices by ``floor(u * n)`` (uniform to within ``n * 2**-53``).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
_STEPS = {1: 1, 2: 2, 3: -1, 4: -2}
#: most rows the row table may hold (addition's V^(G-1), distribute_three's V!/(V-G)!)
MAX_TABLE_ROWS = 1 << 22
#: permutations of F slots are drawn from a table up to this size, by argsort above it
_PERM_TABLE_LIMIT = 50_000
#: entries of the table of all G-tuples of column permutations (F=4, G=3: 24^3 x 36)
_SLOT_TABLE_LIMIT = 1 << 20


def _rule_rows(rule: int, v: int, g: int) -> tuple[np.ndarray, int, int]:
    """(rows, shared, per_row) of one rule: a row index is ``s * per_row + p`` with ``s`` drawn once
    per feature from ``range(shared)`` and ``p`` once per row from ``range(per_row)``."""
    col = np.arange(g)
    if rule == 0:
        return np.repeat(np.arange(v)[:, None], g, axis=1), 1, v
    if rule in _STEPS:
        return (np.arange(v)[:, None] + _STEPS[rule] * col[None]) % v, 1, v
    if rule in (5, 6):
        lead = np.array(list(itertools.product(range(v), repeat=g - 1))).reshape(-1, g - 1)
        last = lead.sum(1) if rule == 5 else 2 * lead[:, 0] - lead.sum(1)
        return np.concatenate([lead, (last % v)[:, None]], axis=1), 1, len(lead)
    sets = np.array(list(itertools.combinations(range(v), g)))  # (S, G) sorted value sets
    perms = np.array(list(itertools.permutations(range(g))))  # (G!, G)
    return sets[:, perms].reshape(-1, g), len(sets), len(perms)


def _rows_count(rule: int, v: int, g: int) -> int:
    if rule in (5, 6):
        return v ** (g - 1)
    if rule == 7:
        return math.perm(v, g)
    return v


@dataclass
class SRavenOptions:
    """The ``data.*`` options of ``data.task=sraven`` and the defaults of ``SRaven``."""

    holdout: float = field(default=0.25, metadata={"help": "fraction of rule combinations held out (ood)"})
    num_features: int = 4
    num_values: int = 8
    grid_size: int = 3
    unambiguous_only: bool = field(default=False, metadata={"help": "resample ambiguous problems"})
    heldout_draw: str = field(
        default="numpy",
        metadata={"help": "which tasks the seed holds out: numpy (ours) | authors (their code's set; seeds 0-9)"},
    )


@dataclass
class SRavenExportOptions(SRavenOptions):
    """``hyla data sraven`` flags: the config's options and a subset of the rules."""

    rules: str | None = field(
        default=None, metadata={"help": f"comma-separated subset of: {','.join(RULE_NAMES)} (default: all)"}
    )


_DEFAULTS = SRavenOptions()
HELDOUT_DRAWS = ("numpy", "authors")
AUTHORS_HELDOUT = Path(__file__).with_name("sraven_authors_heldout.json")


def authors_heldout(split_seed: int) -> list[int]:
    """The tasks the authors' code holds out (its ``ood`` split) for ``split_seed``, from the tabulated draws."""
    seeds = json.loads(AUTHORS_HELDOUT.read_text())["seeds"]
    if str(split_seed) not in seeds:
        raise ValueError(
            f"heldout_draw='authors' knows the authors' held-out tasks for split seeds {', '.join(seeds)}; "
            f"got split seed {split_seed} (use heldout_draw='numpy', or add the seed to {AUTHORS_HELDOUT.name})"
        )
    return seeds[str(split_seed)]


class SRaven(Task):
    """SRAVEN problems on demand; see the module docstring for rules, splits and encoding."""

    name = "sraven"
    options = SRavenOptions
    primary_metric = "acc"

    def __init__(
        self,
        num_features: int = _DEFAULTS.num_features,
        num_values: int = _DEFAULTS.num_values,
        grid_size: int = _DEFAULTS.grid_size,
        holdout: float = _DEFAULTS.holdout,
        rules: Sequence[str] | None = None,
        split_seed: int = 0,
        permute_features: bool = True,
        unambiguous_only: bool = _DEFAULTS.unambiguous_only,
        heldout_draw: str = _DEFAULTS.heldout_draw,
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
        if grid_size < 3 and {"addition", "subtraction"} & set(rules):
            raise ValueError(
                f"grid_size={grid_size} is too small for addition/subtraction (two operands and a result per row); "
                "use grid_size >= 3 or drop those rules"
            )
        if "distribute_three" in rules and num_values < grid_size:
            raise ValueError(
                f"num_values={num_values} is too small for distribute_three, which needs grid_size={grid_size} "
                "distinct values per row; raise num_values or drop the rule"
            )
        if not 0 <= holdout < 1:
            raise ValueError(f"holdout must be in [0, 1), got {holdout}")
        if heldout_draw not in HELDOUT_DRAWS:
            raise ValueError(f"heldout_draw must be one of {', '.join(HELDOUT_DRAWS)}, got {heldout_draw!r}")
        authors_setting = (num_features, num_values, holdout, tuple(rules)) == (4, 8, 0.25, RULE_NAMES)
        if heldout_draw == "authors" and not authors_setting:
            raise ValueError(
                "heldout_draw='authors' needs the authors' task space (num_features=4, num_values=8, holdout=0.25, "
                f"all rules); got num_features={num_features}, num_values={num_values}, holdout={holdout}, "
                f"rules={list(rules)}"
            )
        ids = [RULE_NAMES.index(r) for r in rules]
        table_rows = sum(_rows_count(i, num_values, grid_size) for i in ids)
        if table_rows > MAX_TABLE_ROWS:
            raise ValueError(
                f"num_values={num_values}, grid_size={grid_size}: the row table would hold {table_rows:,} rows "
                f"(limit {MAX_TABLE_ROWS:,}); lower num_values or grid_size"
            )
        self.num_features, self.num_values, self.grid_size = num_features, num_values, grid_size
        self.holdout, self.split_seed, self.permute_features = holdout, split_seed, permute_features
        self.unambiguous_only = unambiguous_only
        if unambiguous_only:
            from hyla.tasks.sraven_ambiguity import _MAX_READINGS

            if math.factorial(num_features) ** (grid_size - 1) > _MAX_READINGS:
                raise ValueError(
                    f"unambiguous_only=True needs the ambiguity check, which enumerates (num_features!)^(grid_size-1) "
                    f"feature bindings: too many for num_features={num_features}, grid_size={grid_size}"
                )
        self.rule_names = rules
        self.rule_ids = torch.tensor(ids)
        self.input_dim, self.output_dim = num_values, num_values
        self.seq_len = grid_size * grid_size * num_features
        self.num_output_positions = num_features

        # tasks: sorted multisets of rule ids (global ids, so names stay meaningful with a subset)
        tasks = list(itertools.combinations_with_replacement(ids, num_features))
        self.tasks = torch.tensor(tasks)  # (num_tasks, F)
        num_ood = int(holdout * len(tasks))
        if holdout > 0 and num_ood == 0:
            raise ValueError(f"holdout={holdout} holds out no task of {len(tasks)}; raise it or use 0")
        self.heldout_draw = heldout_draw
        if heldout_draw == "authors":  # their held-out tasks first, then the rest: the same cut below
            held = authors_heldout(split_seed)
            order = torch.tensor(held + sorted(set(range(len(tasks))) - set(held)))
        else:
            order = torch.from_numpy(np.random.default_rng(split_seed).permutation(len(tasks)))
        self.task_ids = {"train": order[num_ood:].sort().values, "test": order[num_ood:].sort().values}
        if num_ood:
            self.task_ids["ood"] = order[:num_ood].sort().values
        self.eval_splits = ("test", "ood") if num_ood else ("test",)

        # the row table and, per global rule id, where its rows start and how they are drawn
        parts, offset = [], 0
        draw_params = torch.zeros(len(RULE_NAMES), 4, dtype=torch.float64)  # rule, offset, shared, per_row
        for i in ids:
            rows, shared, per_row = _rule_rows(i, num_values, grid_size)
            draw_params[i] = torch.tensor([i, offset, shared, per_row], dtype=torch.float64)
            parts.append(rows)
            offset += len(rows)
        self.row_table = torch.from_numpy(np.concatenate(parts)).long()  # (num_rows, G)
        # per split, one row per task: [task id, (rule, offset, shared, per_row) per feature]: one lookup
        self._split_draw = {
            k: torch.cat([v[:, None].double(), draw_params[self.tasks[v]].flatten(1)], dim=1)
            for k, v in self.task_ids.items()
        }
        # feature permutations: one per column, drawn as a row of a table when small enough
        n_perms = math.factorial(num_features)
        self._feature_perms = (
            torch.tensor(list(itertools.permutations(range(num_features)))) if n_perms <= _PERM_TABLE_LIMIT else None
        )
        # ... and, for the default sizes, the G column permutations as one draw: row k of `_perm_slots` is
        # the G x F permutations, then for each token (r, c, i) the offset perm[c, i]*G*G + r*G + c of its
        # value in the problem's canonical F x G x G block
        self._perm_slots: Tensor | None = None
        if self._feature_perms is not None and n_perms**grid_size * self.seq_len <= _SLOT_TABLE_LIMIT:
            combos = torch.cartesian_prod(*[torch.arange(n_perms)] * grid_size).reshape(-1, grid_size)
            perms_KxGxF = self._feature_perms[combos]
            r = torch.arange(grid_size)[None, :, None, None]
            c = torch.arange(grid_size)[None, None, :, None]
            slots = perms_KxGxF[:, None] * grid_size**2 + r * grid_size + c  # (K, G_r, G_c, F)
            self._perm_slots = torch.cat([perms_KxGxF.flatten(1), slots.flatten(1)], dim=1)
        self._device_cache: dict[torch.device, dict[str, Tensor]] = {}

    @property
    def num_tasks(self) -> int:
        return len(self.tasks)

    def _tables(self, device: torch.device) -> dict[str, Tensor]:
        """Lookup tables on ``device``, copied once (no host-to-device copy per batch)."""
        if device not in self._device_cache:
            t = {
                "row_table": self.row_table,
                "one_hot": torch.eye(self.num_values),
                **{f"draw_{k}": v for k, v in self._split_draw.items()},
            }
            if self._feature_perms is not None:
                t["feature_perms"] = self._feature_perms
            if self._perm_slots is not None:
                t["perm_slots"] = self._perm_slots
            self._device_cache[device] = {k: v.to(device) for k, v in t.items()}
        return self._device_cache[device]

    # ------------------------------------------------------------------ generation
    def _draw(self, batch_size: int, split: str, generator: torch.Generator) -> dict[str, Tensor]:
        """Task ids, rules, the rows each canonical feature takes and the feature permutation.

        ``rows[b, f, r]`` indexes ``row_table``: row r of canonical feature f. ``slots`` (when the
        table of permutation tuples exists) holds, per token, the offset of its value in the
        problem's canonical ``F x G x G`` block. Few, batch-wide ops: this runs every training step."""
        self.check_split(split)
        dev = generator.device
        tb = self._tables(dev)
        b, f, g = batch_size, self.num_features, self.grid_size
        draw_table = tb[f"draw_{split}"]
        use_tuples = self.permute_features and "perm_slots" in tb
        n_perm = 1 if use_tuples else g if self.permute_features and "feature_perms" in tb else 0
        u = torch.rand(b, 1 + n_perm + f * (g + 1), generator=generator, device=dev, dtype=torch.float64)
        draw = draw_table.index_select(0, u[:, 0].mul(len(draw_table)).long())
        rule_BxF, offset_BxF, shared_BxF, per_row_BxF = draw[:, 1:].view(b, f, 4).unbind(-1)
        u_feat = u[:, 1 + n_perm :].view(b, f, g + 1)
        start_BxF = (u_feat[..., 0] * shared_BxF).floor_().mul_(per_row_BxF).add_(offset_BxF)  # shared: the set
        rows_BxFxG = (u_feat[..., 1:] * per_row_BxF[..., None]).floor_().add_(start_BxF[..., None]).long()
        out = {"task_id": draw[:, 0].long(), "rules": rule_BxF.long(), "rows": rows_BxFxG}
        if use_tuples:
            perm_slots = tb["perm_slots"].index_select(0, u[:, 1].mul(len(tb["perm_slots"])).long())
            out["perm"], out["slots"] = perm_slots[:, : g * f].view(b, g, f), perm_slots[:, g * f :]
        elif n_perm:
            out["perm"] = tb["feature_perms"][(u[:, 1 : 1 + g] * len(tb["feature_perms"])).long()]
        elif self.permute_features:  # too many permutations to tabulate: argsort of uniforms
            out["perm"] = torch.rand(b, g, f, generator=generator, device=dev).argsort(-1)
        else:
            out["perm"] = torch.arange(f, device=dev).expand(b, g, f)
        return out

    def _canonical(self, rows_BxFxG: Tensor) -> Tensor:
        """Canonical values ``B x F x G x G`` (feature, row, column)."""
        b, f, g = rows_BxFxG.shape
        return self._tables(rows_BxFxG.device)["row_table"].index_select(0, rows_BxFxG.flatten()).view(b, f, g, g)

    def _grid(self, draw: dict[str, Tensor]) -> Tensor:
        """Model's-view grid ``B x G x G x F``: ``grid[b, r, c, i] = canonical[b, perm[b, c, i], r, c]``."""
        canonical_BxFxGxG = self._canonical(draw["rows"])
        b, f, g, _ = canonical_BxFxGxG.shape
        if "slots" in draw:  # one contiguous gather, the fastest way on CPU
            return torch.gather(canonical_BxFxGxG.view(b, -1), 1, draw["slots"]).view(b, g, g, f)
        perm = draw["perm"][:, None].expand(b, g, g, f)
        return torch.gather(canonical_BxFxGxG.permute(0, 2, 3, 1), 3, perm)

    def sample_problems(self, batch_size: int, split: str, generator: torch.Generator) -> dict[str, Tensor]:
        """``grid`` (model's view), ``canonical`` (``B x G x G x F``), ``rules``, ``perm``, ``task_id``.

        The same generator state gives the same problems as ``sample``."""
        d = self._draw(batch_size, split, generator)
        return {
            "grid": self._grid(d),
            "canonical": self._canonical(d["rows"]).permute(0, 2, 3, 1),
            "rules": d["rules"],
            "perm": d["perm"],
            "task_id": d["task_id"],
        }

    def sample(self, batch_size: int, split: str, generator: torch.Generator) -> Batch:
        if self.unambiguous_only:
            from hyla.tasks.sraven_ambiguity import resample_ambiguous

            p = resample_ambiguous(self, self.sample_problems(batch_size, split, generator), split, generator)
            return self.encode(p)
        d = self._draw(batch_size, split, generator)
        return self.encode({"grid": self._grid(d), **d})

    def encode(self, problems: dict[str, Tensor]) -> Batch:
        """Model inputs from ``grid`` (see module docstring); ``info`` keeps grid, rules, perm, task_id."""
        grid = problems["grid"]
        b, f = grid.shape[0], self.num_features
        inputs = F.embedding(grid.view(b, self.seq_len), self._tables(grid.device)["one_hot"])  # fastest one-hot
        inputs[:, -f:] = 0  # query tokens
        info = {k: problems[k] for k in ("grid", "rules", "perm", "task_id")}
        return Batch(inputs, grid[:, -1, -1], info)

    # ------------------------------------------------------------------ objective
    def loss(self, outputs_BxTxO: Tensor, batch: Batch) -> Tensor:
        logits = outputs_BxTxO[:, -self.num_features :]
        return F.cross_entropy(logits.reshape(-1, self.num_values), batch.targets.reshape(-1))

    def metrics(self, outputs_BxTxO: Tensor, batch: Batch) -> dict[str, Tensor]:
        """``acc`` (all F answer features right), ``feature_acc`` (fraction right), ``loss`` (mean CE)."""
        logits = outputs_BxTxO[:, -self.num_features :]
        correct = logits.argmax(-1) == batch.targets
        ce = F.cross_entropy(logits.transpose(1, 2), batch.targets, reduction="none").mean(1)
        return {"loss": ce, "acc": correct.all(1).float(), "feature_acc": correct.float().mean(1)}

    # ------------------------------------------------------------------ outside views
    def export_chunk(self, num: int, split: str, generator: torch.Generator) -> dict[str, np.ndarray]:
        """``grid`` (N, G, G, F) as the model sees it, ``rules`` (N, F) per canonical feature, ``perm``
        (N, G, F) with ``grid[n, r, c, i] == canonical[n, r, c, perm[n, c, i]]``, ``task_id`` (N,)."""
        p = self.sample_problems(num, split, generator)
        if self.unambiguous_only:
            from hyla.tasks.sraven_ambiguity import resample_ambiguous

            p = resample_ambiguous(self, p, split, generator)
        return {k: p[k].numpy().astype(np.int64) for k in ("grid", "rules", "perm", "task_id")}

    def constant_arrays(self) -> dict[str, np.ndarray]:
        return {"rule_names": np.array(RULE_NAMES)}

    @staticmethod
    def answer_slot_rules(info: dict[str, Tensor]) -> Tensor:
        """``B x F``: the rule of each answer slot i, that of its canonical feature ``perm[:, G-1, i]``."""
        return info["rules"].gather(1, info["perm"][:, -1])

    def latent_arrays(self, codes_BxLxHxTxT: Tensor, batch: Batch) -> dict[str, np.ndarray]:
        """For answer slot i (see ``hyla.analysis.latents``): ``codes`` (B, F, layers, G-1, H) at the
        slot's query and the same canonical feature's keys in the last row; its rule ``query_rule`` (B, F);
        ``rules``, ``perm``, ``task_id``; the tokens ``query_tokens`` (B, F), ``key_tokens`` (B, F, G-1)."""
        perm, rules = batch.info["perm"], batch.info["rules"]
        q_tok, k_tok = sraven_pairs(perm, self.num_features, self.grid_size)
        b_idx = torch.arange(len(q_tok))[:, None, None]
        # codes[b, :, :, q, k] for q = q_tok[b, i], k = k_tok[b, i, c] -> (B, F, G-1, L, H)
        sel = codes_BxLxHxTxT.permute(0, 3, 4, 1, 2)[b_idx, q_tok[..., None], k_tok]
        return {
            "codes": sel.permute(0, 1, 3, 2, 4).numpy().astype(np.float32),  # (B, F, L, G-1, H)
            "query_rule": self.answer_slot_rules(batch.info).numpy(),
            "rules": rules.numpy(),
            "perm": perm.numpy(),
            "task_id": batch.info["task_id"].numpy(),
            "query_tokens": q_tok.numpy(),
            "key_tokens": k_tok.numpy(),
        }

    def ambiguous_fraction(self, num: int, seed: int, criterion: str) -> float:
        """Fraction of ``num`` training problems (generator seed ``seed``) that ``criterion`` flags."""
        from hyla.tasks.sraven_ambiguity import is_ambiguous

        grid = self.sample_problems(num, "train", torch.Generator().manual_seed(seed))["grid"]
        return is_ambiguous(self, grid, criterion=criterion).float().mean().item()


# ---------------------------------------------------------------------- what its registry entry states
def from_export_options(values: dict[str, Any], split_seed: int) -> SRaven:
    """The task of ``hyla data sraven`` flags (``SRavenExportOptions``): ``rules`` is comma-separated there."""
    text = values["rules"]
    rules = None if text is None else [r.strip() for r in text.split(",") if r.strip()]
    return SRaven(**{**values, "rules": rules}, split_seed=split_seed)


def matches_paper_setting(config: dict[str, Any]) -> bool:
    """Table A1: holdout 0.25, F=4, V=8, G=3, 4 layers of width 128 with 16 heads, 20M problems."""
    data, model, train = config["data"], config["model"], config["train"]
    return (
        data["holdout"] == 0.25
        and data["num_features"] == 4
        and data["num_values"] == 8
        and data.get("grid_size", 3) == 3
        and model["num_layers"] == 4
        and model["emb_dim"] == 128
        and model["num_heads"] == 16
        and train["steps"] * train["batch_size"] == 156250 * 128
    )


def sraven_pairs(perm_NxGxF: Tensor, num_features: int, grid_size: int = 3) -> tuple[Tensor, Tensor]:
    """Query tokens ``(N, F)`` and relevant key tokens ``(N, F, G-1)`` for every answer slot: the slot's
    query token and the tokens of the same canonical feature in the visible panels of the last row."""
    n, g, f = perm_NxGxF.shape[0], grid_size, num_features
    last = g - 1
    feature_of_slot = perm_NxGxF[:, last]  # (N, F): canonical feature j of answer slot i
    queries = (g * g - 1) * f + torch.arange(f).expand(n, f)
    inverse = perm_NxGxF.argsort(-1)  # inverse[n, c, j] = slot of canonical feature j in column c
    slots = [inverse[:, c].gather(1, feature_of_slot) for c in range(g - 1)]  # (N, F) each
    keys = torch.stack([(last * g + c) * f + slot for c, slot in enumerate(slots)], dim=-1)
    return queries, keys


def decode_inputs(inputs_BxTxV: Tensor, num_features: int, grid_size: int = 3) -> Tensor:
    """Context panels ``B x (G*G-1) x F`` back from encoded inputs (inverse of the encoding)."""
    b = inputs_BxTxV.shape[0]
    context = inputs_BxTxV[:, : (grid_size * grid_size - 1) * num_features]
    return context.argmax(-1).reshape(b, grid_size * grid_size - 1, num_features)
