"""lab/authors/side_by_side_sraven.py reads the authors' SRAVEN log and our metrics onto the same steps."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "lab" / "authors" / "side_by_side_sraven.py"


def test_bins_and_evaluations_line_up(tmp_path: Path) -> None:
    theirs = tmp_path / "authors" / "sraven-hyla-seed0"
    theirs.mkdir(parents=True)
    lines = ["[INFO  10:00:00] step: 0 \t"]
    for updates in range(0, 2001, 250):  # their loop logs after `updates` updates as step updates + 1
        loss, acc = 2.0 - updates / 10_000, updates / 20_000
        lines.append(f"[INFO  10:00:00] step: {updates + 1} \t train_acc: {acc:.4f} \t train_loss: {loss:.4f}")
        if updates % 1000 == 0:
            lines.append(f"[INFO  10:00:00] step: {updates + 1} \t test_acc: {acc + 0.1:.4f} \t test_loss: 1.0")
            lines.append(f"[INFO  10:00:00] step: {updates + 1} \t ood_acc: {acc + 0.2:.4f} \t ood_loss: 1.0")
    (theirs / "event.log").write_text("\n".join(lines) + "\n")
    ours = tmp_path / "ours"
    ours.mkdir()
    records = [{"step": s, "split": "train_batch", "acc": 0.0, "loss": 3.0 - s / 10_000} for s in range(250, 3001, 250)]
    records += [{"step": 1000, "split": split, "acc": 0.5, "loss": 1.0} for split in ("test", "ood")]
    (ours / "config.yaml").write_text("seed: 0\n")  # a run directory, as read_run reads it
    (ours / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    out = tmp_path / "curves.json"
    args = ["--authors-logs", str(tmp_path / "authors"), "--ours-run", str(ours), "--out", str(out)]
    text = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=True).stdout
    rows = {
        line.split(" | ")[0].strip("| "): line.strip("| ").split(" | ")[1:]
        for line in text.splitlines()
        if line[:2] == "| "
    }
    # their logged step is the number of updates made: bin 1-1000 holds their lines 1, 251, 501, 751 (made
    # after loop indices 0..750), ours 250..1000; bin 2001-3000 is past their last update (2,001)
    for bin_, their_index, our_step in (("1-1000", 375, 625), ("1001-2000", 1375, 1625)):
        loss, acc, grad_norm, param_norm = (cell.split(" / ") for cell in rows[bin_])
        assert [float(v) for v in loss] == pytest.approx(
            [2.0 - their_index / 10_000, 3.0 - our_step / 10_000], abs=6e-4
        )
        assert [float(v) for v in acc] == pytest.approx([100 * their_index / 20_000, 0.0], abs=0.051)
        assert grad_norm == ["-", "-"] and param_norm == ["-", "-"]  # neither log has them here
    assert "2001-3000" not in rows
    # their evaluation logged as step 1001 (after loop index 1000) is listed beside ours after 1,000 updates
    assert "| 1000 | 15.0 | 50.0 | 25.0 | 50.0 |" in text
    assert "| 2000 | 20.0 | - | 30.0 | - |" in text
    saved = json.loads(out.read_text())
    assert saved["meta"]["authors_updates"] == 2001 and max(p["step"] for p in saved["ours"]) == 2000
    assert out.with_suffix(".png").stat().st_size > 0


def test_summary_gives_mean_and_standard_error_over_seeds(tmp_path: Path) -> None:
    for seed, (theirs, ours) in enumerate(((0.2, 0.1), (0.3, 0.2), (0.1, None))):
        curves = {
            # their evaluation at the schedule's end is logged at its length, not as k + 1
            "authors": [{"step": 2501, "split": "ood", "acc": theirs}, {"step": 156_250, "split": "ood", "acc": 0.5}],
            "ours": [{"step": s, "split": "ood", "acc": ours} for s in (2500, 156_250)] if ours is not None else [],
        }
        (tmp_path / f"sraven_hyla_seed{seed}.json").write_text(json.dumps(curves))
    args = ["--summary", "--dir", str(tmp_path)]
    text = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=True).stdout
    # theirs: 20, 30, 10 -> 20.0 +- 5.8 (3 seeds); ours: 10, 20 -> 15.0 +- 5.0 (2 seeds)
    assert "| 2500 | 20.0 +- 5.8 (3) | 15.0 +- 5.0 (2) | - | - |" in text
    assert "| 156250 | 50.0 +- 0.0 (3) | 15.0 +- 5.0 (2) | - | - |" in text
    assert (tmp_path / "sraven_hyla.md").read_text() == text.rstrip("\n") + "\n"


def test_their_runs_end_with_the_first_evaluation_past_the_plateau(tmp_path: Path) -> None:
    """``--their-runs``: one column per run of theirs (seeds and swaps), and a last line with the first
    evaluation at 40% OOD or more, the level the paper report reads our runs at."""
    for name, oods in (("sraven-hyla-seed0", (0.12, 0.41, 0.39)), ("sraven-hyla-seed1-init0", (0.12, 0.2, 0.3))):
        (tmp_path / "authors" / name).mkdir(parents=True)
        lines = [
            f"[INFO  10:00:00] step: {updates + 1} \t ood_acc: {acc:.4f} \t ood_loss: 1.0"
            for updates, acc in zip((2500, 5000, 7500), oods, strict=True)
        ]
        (tmp_path / "authors" / name / "event.log").write_text("\n".join(lines) + "\n")
    args = ["--their-runs", "--authors-logs", str(tmp_path / "authors"), "--dir", str(tmp_path), "--setting", "lr x"]
    text = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=True).stdout
    assert "their code (lr x)" in text
    assert "| updates | data 0, init 0 | data 1, init 0 |" in text
    assert "| 5000 | 41.0 | 20.0 |" in text
    assert text.rstrip().splitlines()[-1] == "| first >= 40% | 5,000 | - |"
    assert (tmp_path / "sraven_hyla_their_runs.md").read_text() == text.rstrip("\n") + "\n"
