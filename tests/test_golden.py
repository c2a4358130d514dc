"""The golden records: the code reproduces the committed ``metrics.jsonl`` of short CPU runs exactly.

The runs (``tests/golden/run_golden.py``): lone fuzzy logic and SRAVEN with HYLA and softmax, the
authors' setup (dropout, flax init, its split), a stack of 3 seeds, a run stopped and resumed, an MoE
run, each from a fully spelled-out config. A checkpoint written before the training code was
restructured (``tests/golden/pre_move_run``) must still resume onto the same numbers. Regenerate only
for an intended numerical change: ``python tests/golden/run_golden.py --write``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "golden"))
import run_golden

GOLDEN = Path(__file__).resolve().parent / "golden"


def test_golden_runs_reproduce_their_records_exactly(tmp_path: Path) -> None:
    run_golden.run_all(tmp_path)
    ours, golden = run_golden.metrics_files(tmp_path), run_golden.metrics_files(run_golden.RECORDS)
    assert sorted(ours) == sorted(golden) and len(golden) == 11
    for name in golden:
        assert ours[name] == golden[name], f"golden run {name}: metrics.jsonl differs from tests/golden/records"
    # stopping and resuming changes nothing
    assert golden["fuzzy_hyla_authors_resumed"] == golden["fuzzy_hyla_authors"]
    # the C kernel (dropout included) and the direct form train the same run up to rounding
    kernel, direct = (
        [json.loads(line) for line in golden[name].splitlines()]
        for name in ("fuzzy_hyla_authors", "fuzzy_hyla_authors_direct")
    )
    assert kernel != direct and [(m["step"], m["split"]) for m in kernel] == [(m["step"], m["split"]) for m in direct]
    for a, b in zip(kernel, direct):
        assert abs(a["loss"] - b["loss"]) <= 1e-5 * abs(b["loss"]), (a, b)


def test_a_checkpoint_from_before_the_restructure_resumes_onto_the_golden_numbers(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(GOLDEN / "pre_move_run", run)
    env = {**__import__("os").environ, **run_golden.GOLDEN_ENV}
    env["PYTHONPATH"] = str(GOLDEN.parents[1] / "src")
    config = str(GOLDEN / "configs" / "fuzzy_hyla_authors.yaml")
    # it trained with dropout through the direct form (the C kernel did not drop then): it continues there
    direct = "model.attention_backend=direct"
    cmd = [sys.executable, "-m", "hyla", "train", config, direct, "--out", str(run), "--quiet", "--resume"]
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    golden = (run_golden.RECORDS / "fuzzy_hyla_authors_direct" / "metrics.jsonl").read_text()
    assert (run / "metrics.jsonl").read_text() == golden
