"""The benchmark commands run and write their documented JSON (tests never judge the timings)."""

from __future__ import annotations

import json
from pathlib import Path

from hyla.cli import main


def test_bench_commands_write_their_json(tmp_path: Path) -> None:
    step = tmp_path / "step.json"
    assert (
        main(
            [
                "bench",
                "step",
                "--task",
                "fuzzy_logic",
                "--variants",
                "softmax,hyla",
                "--steps",
                "2",
                "--warmup",
                "1",
                "--batch-size",
                "8",
                "--json",
                str(step),
            ]
        )
        == 0
    )
    d = json.loads(step.read_text())
    assert set(d["variants"]) == {"softmax", "hyla"} and "device" in d
    assert all({"ms_per_step", "peak_mem_mb"} <= set(v) for v in d["variants"].values())
    data = tmp_path / "data.json"
    assert (
        main(
            [
                "bench",
                "data",
                "--task",
                "sraven",
                "--batch-sizes",
                "64",
                "--repeats",
                "1",
                "--ambiguity",
                "64",
                "--json",
                str(data),
            ]
        )
        == 0
    )
    assert {"problems_per_s", "ambiguous_fraction_any_panel", "ambiguous_fraction_paper"} <= set(
        json.loads(data.read_text())
    )
    att = tmp_path / "att.json"
    assert (
        main(
            [
                "bench",
                "attention",
                "--seq-lens",
                "32",
                "--batch-tokens",
                "64",
                "--repeats",
                "1",
                "--variants",
                "hyla_reference,hyla_fused,sdpa_softmax",
                "--json",
                str(att),
                "--csv",
                str(tmp_path / "a.csv"),
                "--plot",
                str(tmp_path / "a.png"),
            ]
        )
        == 0
    )
    rows = {r["variant"]: r for r in json.loads(att.read_text())["rows"]}
    assert rows["hyla_reference"]["status"] == "ok" and rows["hyla_fused"]["status"] == "not implemented"
    assert (tmp_path / "a.png").is_file()
