"""What share of a paper run's time its evaluations take: one thread, one process, back to back.

    python benchmarks/speed/eval_share.py sraven --variants hyla,softmax --steps 40

For each variant: the mean time of ``--steps`` training steps of the paper config, the time of one
evaluation (``train.eval_size`` problems of every split, as the run does every ``train.eval_every``
steps), and the share ``eval / (eval_every * step + eval)`` of the run's time. Both are timed in the
same process right after each other, so a machine shared with other work slows both alike; the share
is what to read from a busy machine.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from hyla.train.config import load_config
from hyla.train.loop import Trainer


def measure(config: str, variant: str, steps: int) -> dict[str, float]:
    cfg = load_config(config, [f"model.attention={variant}"])
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(cfg, Path(tmp) / "run", quiet=True)
        try:
            trainer.train_step()  # warm-up: first-call allocations and kernel builds
            t0 = time.perf_counter()
            for _ in range(steps):
                trainer.train_step()
            step_s = (time.perf_counter() - t0) / steps
            t0 = time.perf_counter()
            trainer.evaluate()
            eval_s = time.perf_counter() - t0
        finally:
            trainer.close()
    every = cfg.train.eval_every
    return {"step_s": step_s, "eval_s": eval_s, "eval_every": every, "share": eval_s / (every * step_s + eval_s)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config", help="a paper config, e.g. sraven or fuzzy_logic")
    p.add_argument("--variants", default="hyla,softmax")
    p.add_argument("--steps", type=int, default=40)
    args = p.parse_args()
    torch.set_num_threads(1)
    print(f"{args.config}, 1 thread, torch {torch.__version__}")
    print("| variant | step (s) | evaluation (s) | evaluated every | share of the run's time |")
    print("|---|---|---|---|---|")
    for variant in args.variants.split(","):
        m = measure(args.config, variant, args.steps)
        print(
            f"| {variant} | {m['step_s']:.3f} | {m['eval_s']:.1f} | {m['eval_every']:,} steps "
            f"| {100 * m['share']:.1f}% |",
            flush=True,
        )


if __name__ == "__main__":
    main()
