"""``hyla demo``: softmax vs linear vs HYLA on fuzzy logic, on a laptop CPU in under 10 minutes.

Reduced versus the paper (configs/fuzzy_logic.yaml): fewer steps (``--steps``, default 3000 instead of
50,000) and smaller evaluation sets (4,096 problems per split instead of 51,200); the model, data,
optimizer and split are the paper's. Re-running resumes unfinished runs and reuses finished ones.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import torch

from hyla.analysis.plots import learning_curves
from hyla.analysis.runs import load_run
from hyla.train.checkpoint import latest_checkpoint, load_checkpoint
from hyla.train.config import load_config
from hyla.train.loop import Trainer

DEMO_VARIANTS = ("softmax", "linear", "hyla")


def demo_overrides(steps: int, eval_size: int) -> list[str]:
    return [
        f"train.steps={steps}",
        f"train.eval_every={max(steps // 10, 1)}",
        f"train.checkpoint_every={max(steps // 4, 1)}",
        f"train.eval_size={eval_size}",
        "train.log_every=50",
    ]


def train_variant(variant: str, out: Path, overrides: list[str], quiet: bool) -> float:
    """Train (or resume, or reuse) one variant; returns the wall time spent now."""
    cfg = load_config("fuzzy_logic", [f"model.attention={variant}", f"name=demo_{variant}", *overrides])
    run_dir = out / variant
    resume = False
    ckpt = latest_checkpoint(run_dir) if run_dir.exists() else None
    if ckpt is not None:
        saved = load_checkpoint(ckpt)
        same = {k: v for k, v in saved.config.items() if k != "model"} == {
            k: v for k, v in cfg.to_dict().items() if k != "model"
        } and saved.config["model"]["attention"] == variant
        if same and saved.step >= cfg.train.steps:
            print(f"{variant}: finished run found in {run_dir}, reusing it")
            return 0.0
        resume = same
    if not resume and run_dir.exists():
        shutil.rmtree(run_dir)  # a demo run of another configuration: start it afresh
    t0 = time.perf_counter()
    trainer = Trainer(cfg, run_dir, resume=resume, quiet=quiet)
    try:
        trainer.run()
    finally:
        trainer.close()
    return time.perf_counter() - t0


def write_report(out: Path, variants: list[str], wall: dict[str, float]) -> str:
    runs = [load_run(out / v) for v in variants]
    splits = [s for s in ("train", "test", "ood", "unseen_terms") if runs[0].final(s)]
    header = "| variant | " + " | ".join(f"{s} R^2 (%)" for s in splits) + " | train loss | wall (s) |"
    lines = [header, "|" + "---|" * (len(splits) + 3)]
    for v, run in zip(variants, runs):
        cells = []
        for s in splits:
            final = run.final(s)
            cells.append(f"{100 * final['r2']:.1f}" if final else "-")
        train = run.final("train")
        loss = f"{train['loss']:.4f}" if train else "-"
        lines.append(f"| {v} | " + " | ".join(cells) + f" | {loss} | {wall.get(v, 0):.0f} |")
    table = "\n".join(lines)
    learning_curves(runs, "r2", ["train", "test", "ood"], out / "learning_curves_r2.png", "fuzzy logic: R^2")
    learning_curves(runs, "loss", ["train_batch"], out / "training_loss.png", "training loss (batch mean)")
    steps = runs[0].config["train"]["steps"]
    unseen_note = (
        " `unseen_terms` = combinations of terms never trained on (the paper: no model solves it)."
        if "unseen_terms" in splits
        else ""
    )
    report = f"""# hyla demo: softmax vs linear vs HYLA on fuzzy logic

Command: `hyla demo --out {out}` (`make demo`). Device: CPU, {torch.get_num_threads()} threads.

Setting: the paper's fuzzy-logic model and data as the authors' code ran them (configs/fuzzy_logic.yaml:
L=4 variables, K=2 terms, N=32 examples, 70% of the combinations of 12 terms held out, 2 layers, emb
128, 8 heads, qk/v 16, attention dropout 0.1) trained for {steps} steps instead of 50,000, evaluated on
{runs[0].config["train"]["eval_size"]} problems per split instead of 16,000; one seed (the paper: three).

{table}

R^2 per sequence (1 - squared error / variance of the sequence's targets), averaged over problems;
`ood` = held-out term combinations.{unseen_note} "wall" is this
invocation's training time (0 = reused from an earlier run).

![R^2 learning curves](learning_curves_r2.png)

![training loss](training_loss.png)
"""
    (out / "report.md").write_text(report)
    return table


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    overrides = demo_overrides(args.steps, args.eval_size) + list(args.overrides)
    wall: dict[str, float] = {}
    t0 = time.perf_counter()
    for v in variants:
        wall[v] = train_variant(v, out, overrides, args.quiet)
    table = write_report(out, variants, wall)
    print(f"\n{table}\n\nreport: {out / 'report.md'} (total {time.perf_counter() - t0:.0f} s)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="softmax vs linear vs HYLA on fuzzy logic (CPU, minutes)")
    p.add_argument("--out", default="runs/demo")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--eval-size", type=int, default=4096)
    p.add_argument("--variants", default=",".join(DEMO_VARIANTS))
    p.add_argument("--quiet", action="store_true")
    p.add_argument("overrides", nargs="*", metavar="key.sub=value", help="extra config overrides")
    p.set_defaults(func=run)
