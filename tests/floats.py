"""One rule for tests that compare floats computed by different code paths, processes or machines.

- Same arithmetic (same machine, same settings, same ops): bit for bit.
- Different arithmetic (another CPU or dispatch path, vmap instead of a loop): within a tolerance that a
  measured noise floor justifies, over few enough optimizer steps that AdamW's amplification of rounding
  noise (near-zero gradients turned into full-size updates) does not decide.

"Same machine" means the CPU (model and flags) and torch build on which ``tests/golden/records`` were
written (their ``FINGERPRINT.json``): the exact promises of the suite were checked there.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "golden"))
import run_golden


def on_the_records_machine() -> bool:
    """Whether this CPU and torch build are those that wrote ``tests/golden/records``."""
    import torch

    stored = run_golden.read_fingerprint(run_golden.RECORDS) or {}
    return stored.get("cpu") == run_golden.cpu_fingerprint() and stored.get("torch") == torch.__version__


def rows_text(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def assert_same_numbers(ours: str, theirs: str, *, exact: bool, rtol: float, what: str) -> None:
    """Two ``metrics.jsonl`` texts: the same steps, splits and keys, and bit-equal numbers when ``exact``,
    else every number within ``rtol`` (relative)."""
    if exact:
        assert ours == theirs, f"{what}: not bit for bit the same (same machine and settings)"
    step, split, key, deviation = max(run_golden.relative_deviations(ours, theirs), key=lambda d: d[3])
    assert deviation <= rtol, f"{what}: {key} of {split} at step {step} is {deviation:.1e} off (rtol {rtol:.0e})"
