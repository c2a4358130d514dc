"""lab/lm/lm_tokens.py reads the study's sweep records: tokens per evaluation, the HYLA - linear gap, the best rate."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

from hyla.cli import main

LAB = Path(__file__).resolve().parents[1]
SCRIPT = LAB / "lm" / "lm_tokens.py"


def write_corpus(root: Path) -> Path:
    root.mkdir()
    for i in range(40):
        (root / f"f{i}.py").write_text("\n".join(f"def f{i}_{j}(x):\n    return x + {j}" for j in range(30)))
    return root


def test_the_table_and_the_best_rate_come_from_the_records(tmp_path: Path) -> None:
    tiny = {
        "data.corpus": str(write_corpus(tmp_path / "corpus")),
        "data.vocab_size": 300,
        "data.seq_len": 16,
        "data.val_fraction": 0.1,
        "model.num_layers": 1,
        "model.emb_dim": 16,
        "model.num_heads": 2,
        "model.qk_dim": 16,
        "model.v_dim": 16,
        "model.mlp_dim": 32,
        "train.steps": 4,
        "train.batch_size": 4,
        "train.eval_every": 2,
        "train.checkpoint_every": 2,
        "train.eval_size": 8,
        "train.eval_batch_size": 8,
        "train.warmup_steps": 1,
    }
    runs = tmp_path / "runs"

    def sweep(name: str, grid: dict[str, list[float]], *options: str, seed: int = 0) -> dict[str, list[float]]:
        """Train the sweep ``name`` (rows hyla and linear) at ``seed`` and return each run's validation
        perplexities."""
        rows = {"hyla": {"model.attention": "hyla"}, "linear": {"model.attention": "linear"}}
        spec = {"name": name, "config": "lm_tiny", "overrides": tiny, "rows": rows, "grid": grid, "seeds": [0, 1]}
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(spec))
        where = ["--where", f"seed={seed}"]
        assert main(["sweep", str(tmp_path / f"{name}.yaml"), "--root", str(runs), *where, *options]) == 0
        finals = {}
        for run in (runs / name).glob(f"*-seed{seed}"):
            rows_ = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            finals[run.name] = [r["ppl"] for r in rows_ if r["split"] == "val"]
        return finals

    def script(*args: str) -> str:
        command = [sys.executable, str(SCRIPT), "--runs", str(runs), *args]
        return subprocess.run(command, check=True, capture_output=True, text=True).stdout

    rates = sweep("lm_lr_count", {"train.lr": [0.01, 0.001]})
    best = min((0.01, 0.001), key=lambda lr: rates[f"hyla-lr{lr}-seed0"][-1])
    assert float(script("--best", "lm_lr_count", "hyla")) == best
    curves = sweep("lm_tokens_tiny", {})
    assert len(curves) == 2 and all(len(v) == 2 for v in curves.values())
    # 2 steps x 4 sequences x 16 tokens = 128 tokens an evaluation
    script("--out", str(tmp_path / "out"), "--tokens", "128,256")
    table = (tmp_path / "out.md").read_text()
    assert (tmp_path / "out.png").stat().st_size > 0
    hyla, linear = curves["hyla-seed0"], curves["linear-seed0"]
    assert f"| lm_tokens_tiny | hyla | none | 0.002 | {hyla[0]:.2f} | {hyla[1]:.2f} | finished |" in table
    assert f"| lm_tokens_tiny | linear | none | 0.002 | {linear[0]:.2f} | {linear[1]:.2f} | finished |" in table
    gap = f"HYLA - linear: {hyla[0] - linear[0]:+.2f} at 128, {hyla[1] - linear[1]:+.2f} at 256"
    assert gap in table
    ahead = sum(h < lin for h, lin in zip(hyla, linear))
    widest = max((h - lin for h, lin in zip(hyla, linear)), key=abs)
    assert f"over all 2 shared evaluations HYLA{'' if ahead else ' is'} ahead at {ahead}" in table
    assert f"the widest gap {widest:+.2f} at" in table

    assert "Over seeds" not in table  # one seed so far

    # seed 1 to half the steps: the second table has each row over both seeds where both reached, and the gap
    # seed by seed
    seed1 = sweep("lm_tokens_tiny", {}, "--stop-at-step", "2", seed=1)
    assert all(len(v) == 1 for v in seed1.values())
    script("--out", str(tmp_path / "out"), "--tokens", "128,256")
    table = (tmp_path / "out.md").read_text()
    assert f"| lm_tokens_tiny | hyla | none | 0.002 | {hyla[0]:.2f} | {hyla[1]:.2f} | finished |" in table
    h1, l1 = seed1["hyla-seed1"], seed1["linear-seed1"]
    for row, (seed0, one) in {"hyla": (hyla, h1), "linear": (linear, l1)}.items():
        mean, sd = statistics.fmean([seed0[0], one[0]]), statistics.stdev([seed0[0], one[0]])
        assert f"| lm_tokens_tiny | {row} | 0.002 | 0, 1 | {mean:.2f} +- {sd / 2**0.5:.2f} |  |" in table
    per_seed = f"{hyla[0] - linear[0]:+.2f} (seed 0), {h1[0] - l1[0]:+.2f} (seed 1)"
    assert f"- lm_tokens_tiny, HYLA - linear at 128: {per_seed}" in table
    assert "HYLA - linear at 256" not in table  # seed 1 did not reach it
