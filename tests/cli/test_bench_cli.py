"""The benchmark commands run and write their documented JSON (tests never judge the timings)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from hyla import cpu
from hyla.cli import main


@pytest.mark.slow
def test_bench_commands_write_their_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the fused kernel then reports why it cannot run on CPU
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
                "--backend",
                "manual_backward",
                "--dropout",
                "0.1",
                "--json",
                str(step),
            ]
        )
        == 0
    )
    d = json.loads(step.read_text())
    assert set(d["variants"]) == {"softmax", "hyla"} and "device" in d and d["backend"] == "manual_backward"
    assert d["dropout"] == 0.1 and d["blas"] == cpu.blas_path()  # which BLAS path the timings are of
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
                "hyla_direct,hyla_fused,sdpa_softmax",
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
    assert rows["hyla_direct"]["status"] == "ok"
    assert (
        rows["hyla_fused"]["status"]
        == "unavailable: CPU tensors need TRITON_INTERPRET=1 (the Triton interpreter; slow, for testing)"
    )
    assert (tmp_path / "a.png").is_file()


def test_bench_train_writes_lone_and_stacked_figures(tmp_path: Path) -> None:
    out = tmp_path / "train.json"
    tiny = ["model.num_layers=1", "train.batch_size=8", "train.stack_forward=loop"]
    args = ["bench", "train", "--task", "fuzzy_logic", "--variants", "softmax", "--seeds", "2", "--steps", "1"]
    args += ["--repeats", "2", "--warmup", "1", "--json", str(out), *(f"--override={o}" for o in tiny)]
    args += ["--also-stack-forward", "vmap"]
    assert main(args) == 0
    d = json.loads(out.read_text())
    r = d["variants"]["softmax"]
    assert r["stack_forward"] == "loop" and len(r["lone_block_ms"]) == len(r["stacked_block_ms"]) == 2
    assert r["stacked_cost_vs_one_run"] == pytest.approx(r["stacked_ms_per_step"] / r["lone_ms_per_step"])
    # the lone step is also timed on one core when there are at least as many runs as cores
    assert ("lone_speedup_all_cores_vs_one" in r) == (1 < torch.get_num_threads() <= 2)
    assert "--override train.stack_forward=loop" in d["command"] and "--also-stack-forward vmap" in d["command"]
    vmapped = r["other_stack_forwards"]["vmap"]
    assert len(vmapped["stacked_block_ms"]) == 2 and vmapped["stacked_cost_vs_one_run"] > 0


@pytest.mark.kernel
def test_bench_attention_runs_the_fused_kernel_under_the_interpreter(tmp_path: Path) -> None:
    """With TRITON_INTERPRET=1 (set by ``make test`` for kernel tests) the fused row is measured."""
    pytest.importorskip("triton", reason="triton is not installed (make test-kernel installs it)")
    out = tmp_path / "att.json"
    argv = ["bench", "attention", "--seq-lens", "20", "--batch-tokens", "20", "--heads", "2", "--head-dim", "4"]
    assert main([*argv, "--repeats", "1", "--variants", "hyla_fused,hyla_chunked", "--json", str(out)]) == 0
    rows = {r["variant"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["hyla_fused"]["status"] == "ok" and rows["hyla_fused"]["fwd_bwd_ms"] > 0


def test_bench_step_reads_the_paper_models_from_the_task_configs() -> None:
    """The sizes of the paper's models come from ``hyla/configs/`` (the task's ``paper_config``), not a copy."""
    from hyla.bench.step import paper_model, paper_tasks

    assert paper_tasks() == ("sraven", "fuzzy_logic")
    assert paper_model("sraven") == dict(num_layers=4, emb_dim=128, num_heads=16, qk_dim=64, v_dim=64, mlp_dim=256)
    assert paper_model("fuzzy_logic") == dict(num_layers=2, emb_dim=128, num_heads=8, qk_dim=16, v_dim=16, mlp_dim=256)


def test_profile_step_lists_the_ops_with_the_most_self_time(tmp_path: Path) -> None:
    """benchmarks/speed/profile_step.py (the A/B suite's profile, run against either side's checkout)."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "speed" / "profile_step.py"
    out = tmp_path / "profile.json"
    args = ["--task", "fuzzy_logic", "--variant", "hyla", "--steps", "1", "--warmup", "1", "--top", "4"]
    done = subprocess.run([sys.executable, str(script), *args, "--json", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    d = json.loads(out.read_text())
    ops = d["ops"]
    assert d["task"] == "fuzzy_logic" and len(ops) == 4 and d["blas"] == cpu.blas_path()
    assert 1 >= ops[0]["share"] >= ops[1]["share"] >= ops[2]["share"] >= ops[3]["share"] > 0, ops
    assert all(op["op"] and op["ms_per_step"] > 0 for op in ops), ops
    assert "self CPU time" in done.stdout


def test_kernel_bits_finds_a_one_ulp_change_and_a_missing_case() -> None:
    """benchmarks/speed/kernel_bits.py, the bit-for-bit check of the C kernel between two checkouts: the same
    checkout twice is equal in every case; one gradient moved by one float32 ulp, or a case one side lacks, is
    named."""
    from tiny import load_script

    kernel_bits = load_script(Path(__file__).resolve().parents[2] / "benchmarks" / "speed" / "kernel_bits.py")
    sizes = ((2, 3, 5, 2),)
    first, second = kernel_bits.kernel_results(sizes), kernel_bits.kernel_results(sizes)
    assert {case[4] for case in first} >= {"softmax", "hyla"} and len({case[5] for case in first}) == 2
    assert kernel_bits.differing(first, second) == []
    case = (2, 3, 5, 2, "hyla", str(torch.float32))
    dk = second[case][2].clone()
    second[case][2] = dk
    dk[0, 1, 2, 1] = torch.nextafter(dk[0, 1, 2, 1], torch.tensor(float("inf")))
    (line,) = kernel_bits.differing(first, second)
    assert line.startswith(f"{case}: dk differ (largest difference "), line
    second[case][2] = first[case][2]  # equal again
    missing = (2, 3, 5, 2, "softmax", str(torch.float64))
    del second[missing]
    assert kernel_bits.differing(first, second) == [f"{missing}: only in the first file"]


def test_ab_speed_summarizes_the_paper_step_suite_per_side(tmp_path: Path) -> None:
    """benchmarks/speed/ab_speed.py on the paper-step suite's files: per side and variant the median of the rounds'
    lone ms a step with each round beside it, and each later side over the first; sides named VAR=VALUE too."""
    import subprocess
    import sys

    sides = {"old": [200.0, 240.0, 220.0], "G=off": [110.0, 130.0, 90.0], "G=auto": [55.0, 66.0, 44.0]}
    for side, values in sides.items():
        (tmp_path / side).mkdir()
        for round_, ms in enumerate(values, 1):
            variants = {"softmax": {"lone_ms_per_step": ms}, "hyla": {"lone_ms_per_step": ms / 2}}
            (tmp_path / side / f"paper_sraven_r{round_}.json").write_text(json.dumps({"variants": variants}))
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "speed" / "ab_speed.py"
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path), "abc1234", *sides], capture_output=True, text=True, check=True
    )
    lines = done.stdout.splitlines()
    head = next(line for line in lines if line.startswith("| paper step (ms)"))
    assert head == "| paper step (ms) | variant | old | G=off | G=auto | G=off/old | G=auto/old |"
    rows = [line for line in lines if line.startswith("| sraven |")]
    assert rows == [
        "| sraven | softmax | 220.0 (200.0 / 240.0 / 220.0) | 110.0 (110.0 / 130.0 / 90.0) "
        "| 55.0 (55.0 / 66.0 / 44.0) | 0.50 | 0.25 |",
        "| sraven | hyla | 110.0 (100.0 / 120.0 / 110.0) | 55.0 (55.0 / 65.0 / 45.0) "
        "| 27.5 (27.5 / 33.0 / 22.0) | 0.50 | 0.25 |",
    ]
    assert not any(line.startswith("| model step") for line in lines)  # that suite did not run


def test_ab_speed_refuses_a_setting_outside_the_paper_step_suite() -> None:
    """benchmarks/speed/ab_speed.sh checks SUITE and SETTING before it makes a worktree or times anything."""
    import subprocess

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "speed" / "ab_speed.sh"
    for env, named in (
        ({"SUITE": "fast"}, "SUITE must be all, one-thread-step or paper-step, got fast"),
        ({"SETTING": "HYLA_FAST_GELU=off"}, "SETTING must be VAR=V1,V2,... with SUITE=paper-step"),
        ({"SUITE": "paper-step", "SETTING": "novalues"}, "got SETTING=novalues"),
    ):
        done = subprocess.run(
            ["bash", str(script), "HEAD", "/nonexistent/out"], env={**os.environ, **env}, capture_output=True, text=True
        )
        assert done.returncode == 2 and named in done.stderr, done.stderr
