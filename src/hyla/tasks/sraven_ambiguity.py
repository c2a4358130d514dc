"""Which SRAVEN problems admit more than one answer panel.

Definition. The model sees the eight context panels but neither the rules nor the feature binding.
A *reading* binds each canonical feature to one slot per column (a permutation per column; column 0
fixed to the identity, since relabeling features changes nothing) and gives each feature a rule of
the task's rule set that fits its complete rows and the visible part of its last row. A problem is
*ambiguous* if some reading predicts an answer panel different from the true one (a feature whose
fitting rules disagree counts too). The true binding and rules are always a reading.

``criterion="paper"`` reproduces the narrower count of the paper's public checker: a problem is
ambiguous if under some binding *every* feature has a fitting rule with an answer different from
the true one (only then does the paper's code count it). The measured fractions of the
two differ by two orders of magnitude.

Computation: a feature's predictions depend only on the slot triple it binds ``(i_0, ..., i_{G-1})``,
so the set of predicted answers is tabulated once per triple (``F^G`` triples, a bitmask over
values) and every reading (``(F!)^(G-1)``) is then a lookup.
"""

from __future__ import annotations

import itertools
import math
from typing import Protocol

import torch
from torch import Tensor


class SRaven(Protocol):
    """What the checker needs of ``hyla.tasks.sraven.SRaven`` (a protocol: sraven imports this module)."""

    grid_size: int
    num_features: int
    num_values: int
    rule_ids: Tensor

    def sample_problems(self, batch_size: int, split: str, generator: torch.Generator) -> dict[str, Tensor]: ...


_MAX_READINGS = 200_000


def _answer_masks(task: SRaven, grid_BxGxGxF: Tensor) -> Tensor:
    """Bitmask ``B x F^G`` of answers predicted by some fitting rule, per slot triple."""
    _, g, _, f = grid_BxGxGxF.shape
    v = task.num_values
    triples = torch.tensor(list(itertools.product(range(f), repeat=g)), device=grid_BxGxGxF.device)  # (P, G)
    cols = torch.arange(g, device=grid_BxGxGxF.device)
    # rows_BxPxGxG[b, p, r, c] = grid[b, r, c, triples[p, c]]
    rows = grid_BxGxGxF[:, :, cols[None, :].expand(len(triples), -1), triples].permute(0, 2, 1, 3)
    full, last = rows[:, :, : g - 1], rows[:, :, g - 1, : g - 1]  # complete rows; visible part of last row
    masks = torch.zeros(rows.shape[:2], dtype=torch.long, device=rows.device)
    rule_ids = set(task.rule_ids.tolist())

    def add(fits: Tensor, answer: Tensor) -> None:
        nonlocal masks
        masks = masks | torch.where(fits, torch.ones_like(answer) << answer, torch.zeros_like(answer))

    c_full = torch.arange(g, device=rows.device)
    for rule_id, step in ((0, 0), (1, 1), (2, 2), (3, -1), (4, -2)):
        if rule_id in rule_ids:
            ok_full = ((full - full[..., :1] - step * c_full) % v == 0).all(-1).all(-1)
            ok_last = ((last - last[..., :1] - step * c_full[: g - 1]) % v == 0).all(-1)
            add(ok_full & ok_last, (last[..., 0] + step * (g - 1)) % v)
    if 5 in rule_ids:
        ok = (full[..., -1] == full[..., :-1].sum(-1) % v).all(-1)
        add(ok, last.sum(-1) % v)
    if 6 in rule_ids:
        ok = (full[..., -1] == (2 * full[..., 0] - full[..., :-1].sum(-1)) % v).all(-1)
        add(ok, (2 * last[..., 0] - last.sum(-1)) % v)
    if 7 in rule_ids:
        bits_full = (torch.ones_like(full) << full).sum(-1)  # distinct values sum to a G-bit mask
        distinct_full = (torch.ones_like(full) << full).unsqueeze(-1) & (torch.ones_like(full) << full).unsqueeze(-2)
        distinct_full = (distinct_full != 0).sum((-1, -2)) == g  # only the diagonal matches
        same_set = (bits_full == bits_full[..., :1]).all(-1) & distinct_full.all(-1)
        bits_last = torch.ones_like(last) << last
        last_distinct = (bits_last.unsqueeze(-1) & bits_last.unsqueeze(-2) != 0).sum((-1, -2)) == g - 1
        last_bits = bits_last.sum(-1)
        inside = (last_bits & bits_full[..., 0]) == last_bits
        missing = bits_full[..., 0] & ~last_bits
        fits = same_set & last_distinct & inside
        masks = masks | torch.where(fits, missing, torch.zeros_like(missing))
    return masks


CRITERIA: tuple[str, ...] = ("any_panel", "paper")


def is_ambiguous(task: SRaven, grid_BxGxGxF: Tensor, chunk: int = 4096, criterion: str = "any_panel") -> Tensor:
    """Bool ``(B,)``: True where a reading predicts an answer panel other than the true one
    (``criterion="any_panel"``), or where every feature can be read with a different answer
    (``criterion="paper"``)."""
    if criterion not in CRITERIA:
        raise ValueError(f"criterion={criterion!r} is not valid; allowed values: {', '.join(CRITERIA)}")
    g, f = task.grid_size, task.num_features
    if math.factorial(f) ** (g - 1) > _MAX_READINGS:
        raise ValueError(
            f"the ambiguity check enumerates (num_features!)^(grid_size-1) readings; too many for "
            f"num_features={f}, grid_size={g}"
        )
    perms = torch.tensor(list(itertools.permutations(range(f))), device=grid_BxGxGxF.device)
    bindings = torch.tensor(list(itertools.product(range(len(perms)), repeat=g - 1)), device=grid_BxGxGxF.device)
    # slot of feature j in column c, per reading: (R, G, F), column 0 identity
    slots = torch.cat([torch.arange(f, device=perms.device).expand(len(bindings), 1, f), perms[bindings]], dim=1)
    triple_index = (slots * (f ** torch.arange(g - 1, -1, -1, device=perms.device))[None, :, None]).sum(1)  # (R, F)
    answer_slot = slots[:, g - 1]  # (R, F): where feature j's answer sits
    out = []
    for start in range(0, grid_BxGxGxF.shape[0], chunk):
        grid = grid_BxGxGxF[start : start + chunk]
        masks = _answer_masks(task, grid)  # (b, P)
        per_feature = masks[:, triple_index]  # (b, R, F)
        valid = (per_feature != 0).all(-1)  # every feature has a fitting rule
        truth = grid[:, g - 1, g - 1]  # (b, F) by slot
        true_bits = (torch.ones_like(truth) << truth).gather(1, answer_slot.flatten()[None].expand(len(grid), -1))
        true_bits = true_bits.view(len(grid), *answer_slot.shape)
        if criterion == "any_panel":
            out.append((valid & (per_feature != true_bits).any(-1)).any(-1))
        else:
            out.append(((per_feature & ~true_bits) != 0).all(-1).any(-1))
    return torch.cat(out)


def resample_ambiguous(
    task: SRaven, problems: dict[str, Tensor], split: str, generator: torch.Generator, max_rounds: int = 100
) -> dict[str, Tensor]:
    """Replace ambiguous problems by fresh ones from the same generator (deterministic)."""
    problems = dict(problems)
    for _ in range(max_rounds):
        bad = is_ambiguous(task, problems["grid"]).nonzero().flatten()
        if len(bad) == 0:
            return problems
        fresh = task.sample_problems(len(bad), split, generator)
        for k in problems:
            problems[k] = problems[k].clone()
            problems[k][bad] = fresh[k]
    raise RuntimeError(f"still ambiguous problems after {max_rounds} rounds of resampling")
