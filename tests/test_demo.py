"""`hyla demo` end to end at a tiny size: runs, reuse of finished runs, the report and plots."""

from __future__ import annotations

from pathlib import Path

from hyla.cli import main

TINY = [
    "model.emb_dim=16",
    "model.num_heads=2",
    "model.qk_dim=8",
    "model.v_dim=8",
    "model.mlp_dim=32",
    "train.batch_size=16",
    "train.eval_batch_size=64",
]


def test_demo_trains_each_variant_and_writes_the_report(tmp_path: Path, capsys) -> None:
    out = tmp_path / "demo"
    argv = ["demo", "--out", str(out), "--steps", "6", "--eval-size", "64", "--quiet", *TINY]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    for variant in ("softmax", "linear", "hyla"):
        assert (out / variant / "metrics.jsonl").is_file()
        assert f"| {variant} |" in printed
    report = (out / "report.md").read_text()
    assert "| variant | train R^2 (%) | test R^2 (%) | ood R^2 (%) | unseen_terms R^2 (%) | train loss" in report
    for png in ("learning_curves_r2.png", "training_loss.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a second invocation reuses the finished runs instead of training again
    assert main(argv) == 0
    assert "finished run found" in capsys.readouterr().out
