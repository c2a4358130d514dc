"""Where ``STACK_RTOL`` (tests/train/test_stacked.py) comes from: how far a tiny run moves, step by step, when only
its arithmetic changes.

Trains the tiny SRAVEN run of the stacked-vs-lone tests (seed 0, ``FEW_STEPS`` but ``--steps`` steps) under
the golden environment (the base), then the same run with ATen's ``default`` code path, and as seed 0 of a
vmap stack of seeds 0 and 3; prints the largest relative deviation from the base of any logged number, per
step. Each run is a fresh process (torch reads the dispatch settings at import).

    .venv/bin/python tests/golden/stack_noise.py /tmp/stack_noise [--steps 8]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]
import run_golden  # noqa: E402

from tiny import tiny_overrides  # noqa: E402


def train(out: Path, steps: int, *extra: str, changes: dict[str, str | None] | None = None) -> None:
    overrides = tiny_overrides(layers=2, steps=steps, every=steps, log_every=1, warmup_steps=2)
    cmd = [sys.executable, "-m", "hyla", "train", "sraven", *overrides, *extra, "--out", str(out), "--quiet"]
    subprocess.run(cmd, env=run_golden.subprocess_env(changes), check=True, stdout=subprocess.DEVNULL)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--steps", type=int, default=8)
    args = p.parse_args()
    train(args.out / "base", args.steps, "seed=0", "name=sraven_seed0")
    train(
        args.out / "aten_default", args.steps, "seed=0", "name=sraven_seed0", changes={"ATEN_CPU_CAPABILITY": "default"}
    )
    train(args.out / "vmap", args.steps, "train.stack_forward=vmap", "--seeds", "0,3")
    base = (args.out / "base" / "metrics.jsonl").read_text()
    others = {
        "ATEN_CPU_CAPABILITY=default, lone": args.out / "aten_default" / "metrics.jsonl",
        "vmap stack (seed 0 of 0,3)": args.out / "vmap" / "seed0" / "metrics.jsonl",
    }
    steps = list(range(1, args.steps + 1))
    print("| against the lone run (golden env) | " + " | ".join(f"step {s}" for s in steps) + " |")
    print("|---|" + "---|" * len(steps))
    for label, path in others.items():
        worst: dict[int, float] = {}
        for step, _, _, dev in run_golden.relative_deviations(path.read_text(), base):
            worst[step] = max(worst.get(step, 0.0), dev)
        print(f"| {label} | " + " | ".join(f"{worst.get(s, 0.0):.1e}" for s in steps) + " |")


if __name__ == "__main__":
    main()
