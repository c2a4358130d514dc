"""Summarize ``benchmarks/speed/ab_speed.sh``: OUT/<side>/*_r<round>.json -> markdown tables on stdout.

    python benchmarks/speed/ab_speed.py OUT [OLD_REF] [SIDE ...]   # sides: old new (default), or old VAR=V ...

Each cell is the median over rounds in ms per step; ``new/old`` below 1.00 means the new code is faster.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any


def rounds(out: Path, side: str, name: str) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((out / side).glob(f"{name}_r*.json"))]


def median_at(runs: list[dict[str, Any]], *path: str) -> float:
    """The median over ``runs`` of the value at ``path`` (keys into each run's JSON)."""
    values = []
    for run in runs:
        node: Any = run
        for key in path:
            node = node[key]
        values.append(float(node))
    return statistics.median(values)


def row(label: str, variant: str, old: float, new: float) -> str:
    return f"| {label} | {variant} | {old:.1f} | {new:.1f} | {new / old:.2f} |"


def main() -> None:
    out, old_ref = Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "old"
    sides = sys.argv[3:] or ["old", "new"]
    lines = [f"Old: {old_ref}; new: the working tree. Medians over rounds; new/old < 1 is faster.", ""]
    lines += paper_step(out, sides)
    training = ["| training step (ms) | variant | old | new | new/old |", "|---|---|---|---|---|"]
    for task in ("fuzzy", "sraven"):
        old, new = rounds(out, "old", f"train_{task}"), rounds(out, "new", f"train_{task}")
        for variant in new[0]["variants"] if old and new else []:
            v = ("variants", variant)
            lone_old, lone_new = median_at(old, *v, "lone_ms_per_step"), median_at(new, *v, "lone_ms_per_step")
            training.append(row(f"{task}: lone run", variant, lone_old, lone_new))
            stack_new = median_at(new, *v, "stacked_ms_per_step")
            loop_old = median_at(old, *v, "other_stack_forwards", "loop", "stacked_ms_per_step")
            training.append(row(f"{task}: 3 runs stacked, `loop`", variant, loop_old, stack_new))
            mode = old[0]["variants"][variant]["stack_forward"]
            default_old = median_at(old, *v, "stacked_ms_per_step")
            training.append(row(f"{task}: 3 runs stacked, old default `{mode}`", variant, default_old, stack_new))
    if len(training) > 2:  # the one-thread-step suite times no training
        lines += [*training, ""]
    model = ["| model step (ms) | variant | old | new | new/old |", "|---|---|---|---|---|"]
    for task in ("sraven", "fuzzy"):
        for name, label in ((f"step_{task}", task), (f"pair_{task}", f"{task}, two at once")):
            old, new = rounds(out, "old", name), rounds(out, "new", name)
            for variant in new[0]["variants"] if old and new else []:
                v = ("variants", variant, "ms_per_step")
                model.append(row(label, variant, median_at(old, *v), median_at(new, *v)))
    if len(model) > 2:  # the paper-step suite times no model step
        lines += model
    lines += profiles(out)
    print("\n".join(lines))


def paper_step(out: Path, sides: list[str]) -> list[str]:
    """The paper-step suite (``paper_<task>_r<round>.json``, one lone run of ``hyla bench train`` each): ms a step
    per side, the median of the rounds' medians with each round's beside it, and each later side over the first."""
    first, later = sides[0], sides[1:]
    head = ["paper step (ms)", "variant", *sides, *(f"{side}/{first}" for side in later)]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for task in ("sraven", "fuzzy"):
        per_side = {side: rounds(out, side, f"paper_{task}") for side in sides}
        for variant in per_side[first][0]["variants"] if all(per_side.values()) else []:
            ms = {s: [float(r["variants"][variant]["lone_ms_per_step"]) for r in runs] for s, runs in per_side.items()}
            median = {side: statistics.median(values) for side, values in ms.items()}
            cells = [f"{median[s]:.1f} ({' / '.join(f'{v:.1f}' for v in ms[s])})" for s in sides]
            ratios = [f"{median[s] / median[first]:.2f}" for s in later]
            lines.append("| " + " | ".join([task, variant, *cells, *ratios]) + " |")
    return [*lines, ""] if len(lines) > 2 else []


def profiles(out: Path, top: int = 8) -> list[str]:
    """Per profiled task and variant (``profile_<task>_<variant>.json``, written by ``benchmarks/speed/profile_step.py``
    on both sides), the ops with the most self CPU time, old beside new, in ms per step."""
    lines: list[str] = []
    for new_file in sorted((out / "new").glob("profile_*.json")):
        old_file = out / "old" / new_file.name
        if not old_file.exists():
            continue
        sides = {side: json.loads(f.read_text()) for side, f in (("old", old_file), ("new", new_file))}
        ms = {side: {op["op"]: op["ms_per_step"] for op in d["ops"]} for side, d in sides.items()}
        names = list(dict.fromkeys([op["op"] for d in sides.values() for op in d["ops"][:top]]))
        names.sort(key=lambda n: -max(ms["old"].get(n, 0.0), ms["new"].get(n, 0.0)))
        title = f"Profile, {sides['new']['task']} {sides['new']['variant']}"
        lines += ["", f"{title} (self CPU ms per step; '-': not among that side's top ops)", ""]
        lines += ["| op | old | new |", "|---|---|---|"]
        for n in names:
            cells = [f"{ms[s][n]:.1f}" if n in ms[s] else "-" for s in ("old", "new")]
            lines.append(f"| `{n}` | {cells[0]} | {cells[1]} |")
    return lines


if __name__ == "__main__":
    main()
