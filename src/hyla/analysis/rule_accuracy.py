"""Which rules a trained SRAVEN model gets right: answer-slot accuracy by the rule of the slot's feature.

A SRAVEN problem's answer panel has F slots; slot i holds canonical feature ``perm[n, G-1, i]``, whose rule
is ``hyla.tasks.sraven.SRaven.answer_slot_rules``. A problem counts as solved (the task's ``acc``) when
all F slots are right; here each slot is also counted under its rule, so a model that solves, say, the
progressions and not distribute_three shows it. ``hyla analyze rules RUN_DIR [RUN_DIR ...]`` tabulates it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from hyla.tasks.sraven import RULE_NAMES
from hyla.train.run.folder import TrainedRun, load_trained

__all__ = ["answers_of_other_slots", "feature_keeps_its_slot", "rule_accuracy", "rule_accuracy_markdown"]


@torch.no_grad()
def rule_accuracy(
    run: str | Path | TrainedRun, split: str, num: int = 4096, batch_size: int = 512, seed: int = 0
) -> dict[str, Any]:
    """Accuracy of ``num`` problems of ``split`` (``torch.Generator().manual_seed(seed)``, in batches of
    ``batch_size``; the model on the CPU in eval mode), overall and per rule.

    Returns ``acc`` (problems with every slot right), ``slot_acc`` (slots right), ``rule_slot_acc`` and
    ``rule_slots`` (per rule name: the accuracy of the slots of that rule, their count; a rule no slot had
    is left out), ``kept_slot_acc`` / ``kept_slots`` and ``moved_slot_acc`` / ``moved_slots`` (the slots whose
    feature sits in the same slot in every column, ``feature_keeps_its_slot``, and the others; None
    without any), ``misses`` (slots wrong), ``swap_miss_fraction`` (of those, the ones that give another slot's
    answer, ``answers_of_other_slots``) and ``swap_miss_fraction_by_chance`` (what a uniformly drawn wrong value
    would give), the same per rule name (``rule_swap_miss_fraction[_by_chance]``, rules with a miss), and ``run``,
    ``split``, ``num``, ``weights``."""
    if num < 1:
        raise ValueError(f"num={num} must be >= 1")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    run_dir, cfg, task, model, weights, _step = run if isinstance(run, TrainedRun) else load_trained(run)
    if cfg.data.task != "sraven":
        raise ValueError(f"{run_dir}: accuracy by rule is measured for sraven runs, not {cfg.data.task!r} ones")
    task.check_split(split)
    gen = torch.Generator().manual_seed(seed)
    num_rules, f = len(RULE_NAMES), task.num_features
    right_R = torch.zeros(num_rules, dtype=torch.long)
    slots_R = torch.zeros(num_rules, dtype=torch.long)
    misses_R = torch.zeros(num_rules, dtype=torch.long)
    swaps_R = torch.zeros(num_rules, dtype=torch.long)
    by_chance_R = torch.zeros(num_rules, dtype=torch.float64)
    right_kept = kept = 0
    solved = 0
    for start in range(0, num, batch_size):
        batch = task.sample(min(batch_size, num - start), split, gen)
        predicted_BxF = model(batch.inputs, last_positions=f)[:, -f:].argmax(-1)
        right_BxF = predicted_BxF == batch.targets
        rule_BxF = task.answer_slot_rules(batch.info)
        right_R += torch.bincount(rule_BxF[right_BxF], minlength=num_rules)
        slots_R += torch.bincount(rule_BxF.flatten(), minlength=num_rules)
        swapped_BxF, chance_BxF = answers_of_other_slots(predicted_BxF, batch.targets, task.num_values)
        missed_rule = rule_BxF[~right_BxF]
        misses_R += torch.bincount(missed_rule, minlength=num_rules)
        swaps_R += torch.bincount(rule_BxF[swapped_BxF & ~right_BxF], minlength=num_rules)
        by_chance_R += torch.bincount(missed_rule, weights=chance_BxF[~right_BxF].double(), minlength=num_rules)
        kept_BxF = feature_keeps_its_slot(batch.info["perm"])
        right_kept += int((right_BxF & kept_BxF).sum())
        kept += int(kept_BxF.sum())
        solved += int(right_BxF.all(1).sum())
    seen = [r for r in range(num_rules) if slots_R[r] > 0]
    missed = [r for r in range(num_rules) if misses_R[r] > 0]
    moved = int(slots_R.sum()) - kept
    misses = int(misses_R.sum())
    return {
        "run": str(run_dir),
        "split": split,
        "num": num,
        "weights": weights,
        "acc": solved / num,
        "slot_acc": int(right_R.sum()) / int(slots_R.sum()),
        "rule_slot_acc": {RULE_NAMES[r]: int(right_R[r]) / int(slots_R[r]) for r in seen},
        "rule_slots": {RULE_NAMES[r]: int(slots_R[r]) for r in seen},
        "kept_slot_acc": right_kept / kept if kept else None,
        "kept_slots": kept,
        "moved_slot_acc": (int(right_R.sum()) - right_kept) / moved if moved else None,
        "moved_slots": moved,
        "misses": misses,
        "swap_miss_fraction": int(swaps_R.sum()) / misses if misses else None,
        "swap_miss_fraction_by_chance": float(by_chance_R.sum()) / misses if misses else None,
        "rule_swap_miss_fraction": {RULE_NAMES[r]: int(swaps_R[r]) / int(misses_R[r]) for r in missed},
        "rule_swap_miss_fraction_by_chance": {RULE_NAMES[r]: float(by_chance_R[r] / misses_R[r]) for r in missed},
    }


def answers_of_other_slots(predicted_BxF: Tensor, targets_BxF: Tensor, num_values: int) -> tuple[Tensor, Tensor]:
    """(``B x F`` bool: slot i's prediction is the answer of another slot k != i; ``B x F`` float: the chance of
    that for a wrong prediction drawn uniformly from the ``num_values - 1`` values other than slot i's answer,
    that is the number of distinct answers of other slots unlike slot i's, over ``num_values - 1``)."""
    f = targets_BxF.shape[1]
    other_FxF = ~torch.eye(f, dtype=torch.bool, device=targets_BxF.device)
    swapped_BxF = ((predicted_BxF[:, :, None] == targets_BxF[:, None, :]) & other_FxF).any(-1)
    answer_BxFxV = F.one_hot(targets_BxF, num_values).bool()
    others_BxFxV = (other_FxF[None, :, :, None] & answer_BxFxV[:, None, :, :]).any(2) & ~answer_BxFxV
    return swapped_BxF, others_BxFxV.sum(-1) / (num_values - 1)


def feature_keeps_its_slot(perm_BxGxF: Tensor) -> Tensor:
    """``B x F``: whether answer slot i's feature sits in slot i in every column (``perm[:, c, i]`` the same for
    all c), so that no search across the columns' permutations is needed to find it."""
    return (perm_BxGxF == perm_BxGxF[:, -1:]).all(1)


def rule_accuracy_markdown(results: list[dict[str, Any]], names: list[str] | None = None) -> list[str]:
    """Two tables per split, a column per run (``names``, default the run directories' names): a row per rule
    (slot accuracy, %), then all slots, the slots whose feature keeps its slot or not, and whole problems; then,
    per rule, the % of missed slots that give another slot's answer."""
    names = names or [Path(r["run"]).name for r in results]
    lines: list[str] = []
    for split in dict.fromkeys(r["split"] for r in results):
        cols = [(n, r) for n, r in zip(names, results, strict=True) if r["split"] == split]
        nums = sorted({r["num"] for _, r in cols})
        lines += [
            f"Split `{split}` ({', '.join(f'{n:,}' for n in nums)} problems): accuracy (%) of the answer slots "
            "by their feature's rule, of all slots, and of whole problems (all slots right).",
            "",
            "| | " + " | ".join(n for n, _ in cols) + " |",
            "|---|" + "---|" * len(cols),
        ]
        for rule in RULE_NAMES:
            cells = [f"{100 * r['rule_slot_acc'][rule]:.1f}" if rule in r["rule_slot_acc"] else "-" for _, r in cols]
            lines.append(f"| {rule} | " + " | ".join(cells) + " |")
        lines.append("| all slots | " + " | ".join(f"{100 * r['slot_acc']:.1f}" for _, r in cols) + " |")
        for key, label in (("kept", "slots whose feature keeps its slot in every column"), ("moved", "the others")):
            cells = [f"{100 * r[f'{key}_slot_acc']:.1f}" if r[f"{key}_slot_acc"] is not None else "-" for _, r in cols]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("| **problems** | " + " | ".join(f"**{100 * r['acc']:.1f}**" for _, r in cols) + " |")
        lines += [
            "",
            f"Split `{split}`: of the missed answer slots of each rule, the % whose prediction is the answer of "
            "another slot of the same panel (in brackets: that % for a wrong value drawn uniformly).",
            "",
            "| | " + " | ".join(n for n, _ in cols) + " |",
            "|---|" + "---|" * len(cols),
        ]

        def swap_cell(fraction: float | None, chance: float | None) -> str:
            return "-" if fraction is None or chance is None else f"{100 * fraction:.0f} ({100 * chance:.0f})"

        for rule in RULE_NAMES:
            cells = [
                swap_cell(r["rule_swap_miss_fraction"].get(rule), r["rule_swap_miss_fraction_by_chance"].get(rule))
                for _, r in cols
            ]
            lines.append(f"| {rule} | " + " | ".join(cells) + " |")
        cells = [swap_cell(r["swap_miss_fraction"], r["swap_miss_fraction_by_chance"]) for _, r in cols]
        lines.append("| all missed slots | " + " | ".join(cells) + " |")
        lines.append("")
    return lines
