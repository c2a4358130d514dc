"""Stacked runs (seeds / optimizer hyperparameters in one stacked model, run by run or vmapped) equal
the same runs trained alone; ``train.fast`` (compile; CUDA graphs on CUDA) gives the plain path's losses."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import pytest
import torch
import yaml

from floats import assert_same_numbers, on_the_records_machine
from hyla.cli import main
from hyla.train.cli import run_configs
from hyla.train.config import TrainConfig, load_config
from hyla.train.engines import base as engine_module
from hyla.train.engines import lone as lone_module
from hyla.train.engines import optim as optim_module
from hyla.train.engines.fast import StepGraph, compile_mode, uses_cudagraphs
from hyla.train.engines.stacked import ALIGN_BYTES, StackedStepGraph, stack_forward_mode
from hyla.train.loop import Interrupted, NonFiniteLossError, Trainer
from hyla.train.run.checkpoint import latest_checkpoint, load_checkpoint
from hyla.train.sweeps import describe_plan, engine_for, plan_groups
from tiny import sigterm_after_step, tiny_overrides

TINY = tiny_overrides(layers=2, steps=8, every=4, log_every=2, warmup_steps=2)


def metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def train_losses(path: Path) -> list[float]:
    return [r["loss"] for r in metrics(path) if r["split"] == "train_batch"]


def assert_same_metrics(a: list[dict], b: list[dict], rel: float = 1e-4) -> None:
    assert [(r["step"], r["split"]) for r in a] == [(r["step"], r["split"]) for r in b]
    for x, y in zip(a, b):
        assert set(x) == set(y)
        for k in x:
            if k not in ("step", "split"):
                assert x[k] == pytest.approx(y[k], rel=rel, abs=1e-6), (x["step"], x["split"], k)


def lone(tmp: Path, task: str, out: str, *overrides: str) -> Path:
    assert main(["train", task, *TINY, *overrides, "--out", str(tmp / out), "--quiet"]) == 0
    return tmp / out


#: Stacked vs lone, where their arithmetic differs (vmap always; a loop off the records' machine). Over
#: these 3 steps the tiny SRAVEN lone run under ATEN_CPU_CAPABILITY=default moves from its AVX2 self by at
#: most 4.2e-7 and a vmap stack's seed 0 by 2.5e-7; from the 4th step on AdamW amplifies the same noise (up
#: to 1.9e-4 by step 5, 2.2e-2 by step 8), so a longer comparison would test the CPU, not the code.
#: Measured with `tests/golden/stack_noise.py OUT --steps 8` (2-core AMD EPYC, AVX2, torch 2.13.0). With the
#: paper configs' split and dropout (below) the vmap stacks' 3 steps stayed within 8.3e-7 (dense) and 4.6e-6
#: (MoE: its routing's top-k and load-balancing means add reorderings) of their lone runs (2-core Intel Xeon,
#: torch 2.13.0; the loop stacks were bit for bit equal there).
STACK_RTOL = 1e-4
#: MoE's vmap stacks on a 2-core AMD EPYC without AVX-512 (Zen 3) with MKL as installed (its path for a CPU
#: it does not recognise sums the batched products in another order): 3.2e-5 and 1.1e-4 from their lone runs
#: over the same 3 steps (the dense configs 5.9e-7; with `hyla.cpu`'s override 1.7e-6; read off this test's
#: failure messages with both tolerances set to 0): a routing score near a
#: top-k tie moves more than a dense product. Ten times that still fails a stack that mixes its seeds (O(1)).
MOE_STACK_RTOL = 1e-3
FEW_STEPS = tiny_overrides(layers=2, steps=3, every=3, log_every=1, warmup_steps=2)
#: the paper configs' data: each run's held-out split follows its seed, and attention dropout is drawn
PAPER_SPLIT = [o for o in FEW_STEPS if not o.startswith(("data.split_seed", "model.attention_dropout"))]
#: a load-balancing term that changes the records (the paper configs weigh it 0): each run's own is added
MOE = ["train.moe_aux_weight=0.5"]


def update_as_on_cuda(self: optim_module.StackedAdamW, step: int, grad_RxN: torch.Tensor) -> None:
    """``StackedAdamW.update`` as on CUDA: the plain step's arithmetic for all runs, not the CPU's fused kernel."""
    self.step(grad_RxN, self.schedule_row(step))


@pytest.mark.float_sensitive
@pytest.mark.parametrize("forward", ["loop", "vmap"])
@pytest.mark.parametrize("config", ["sraven", "fuzzy_logic", "sraven_moe", "fuzzy_logic_moe"])
def test_each_stacked_seed_matches_its_lone_run(tmp_path: Path, capsys, config: str, forward: str) -> None:
    """Seeds stack although each has its own held-out split (the paper configs'), problems, initial draw,
    dropout masks and, with MoE, load-balancing term. A loop over the runs does each run's arithmetic exactly
    as alone: bit for bit where that was checked (:func:`floats.on_the_records_machine`); vmap batches the
    matmuls: within ``STACK_RTOL``."""
    overrides = [*PAPER_SPLIT, *(MOE if config.endswith("_moe") else [])]
    stack = ["train", config, *overrides, f"train.stack_forward={forward}", "--seeds", "0,3"]
    assert main([*stack, "--out", str(tmp_path / "stack"), "--quiet"]) == 0
    assert f"2 stacked runs ({config}_seed0, {config}_seed3)" in capsys.readouterr().out  # one stack, not 2 groups
    exact = forward == "loop" and on_the_records_machine()
    for seed in (0, 3):
        stacked = tmp_path / "stack" / f"seed{seed}"
        alone = tmp_path / f"lone{seed}"
        lone_args = ["train", config, *overrides, f"seed={seed}", f"name={config}_seed{seed}"]
        assert main([*lone_args, "--out", str(alone), "--quiet"]) == 0
        ours, theirs = ((run / "metrics.jsonl").read_text() for run in (stacked, alone))
        rtol = MOE_STACK_RTOL if config.endswith("_moe") else STACK_RTOL
        assert_same_numbers(ours, theirs, exact=exact, rtol=rtol, what=f"{forward} stack, seed {seed}")
        # a complete, ordinary run directory: its own seed, tensorboard, lone-format checkpoints
        assert yaml.safe_load((stacked / "config.yaml").read_text())["seed"] == seed
        assert list((stacked / "tb").iterdir())
        mine, theirs = load_checkpoint(latest_checkpoint(stacked)), load_checkpoint(latest_checkpoint(alone))
        assert mine.step == theirs.step == 3 and mine.model.keys() == theirs.model.keys()
        for k in mine.model:
            if exact:
                assert torch.equal(mine.model[k], theirs.model[k]), k
            else:  # atol ~ lr / 10: Adam turns reordering noise in near-zero gradients into steps of up to lr
                torch.testing.assert_close(mine.model[k], theirs.model[k], rtol=1e-4, atol=1e-4)
        assert mine.optimizer["param_groups"][0]["weight_decay"] == 0.1
        assert [len(g["params"]) for g in mine.optimizer["param_groups"]] == [
            len(g["params"]) for g in theirs.optimizer["param_groups"]
        ]
    assert train_losses(tmp_path / "stack" / "seed0") != train_losses(tmp_path / "stack" / "seed3")


@pytest.mark.parametrize("update", ["cpu", "as_on_cuda"])
def test_stacked_parameters_start_where_a_lone_runs_would_and_the_gaps_stay_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, update: str
) -> None:
    """Every run's every parameter starts on the allocator's alignment (a CPU product's last bits can depend
    on its operand's address), and the padding between them neither trains nor holds optimizer state."""
    if update == "as_on_cuda":
        monkeypatch.setattr(optim_module.StackedAdamW, "update", update_as_on_cuda)
    cfgs = [load_config("fuzzy_logic_moe", [*FEW_STEPS, *MOE, f"seed={seed}"]) for seed in (0, 3)]
    trainer = Trainer(cfgs, [tmp_path / "s0", tmp_path / "s3"], quiet=True, engine="stacked")
    engine = trainer.engine
    assert sum(s.numel for s in engine.slots) < engine.flat_RxN.shape[1]  # the tiny model's shapes need gaps
    for name, param in engine.params.items():
        assert [param[r].data_ptr() % ALIGN_BYTES for r in range(2)] == [0, 0], name
    used = torch.zeros(engine.flat_RxN.shape[1], dtype=torch.bool)
    for s in engine.slots:
        used[s.columns] = True
    start = engine.flat_RxN.clone()
    for _ in range(3):
        trainer.train_step()
    for t in (engine.flat_RxN, engine.optimizer.exp_avg_RxN, engine.optimizer.exp_avg_sq_RxN):
        assert t[:, ~used].abs().sum() == 0 and t[:, used].abs().sum() > 0
    assert not torch.equal(engine.flat_RxN[:, used], start[:, used])


@pytest.mark.slow
@pytest.mark.float_sensitive
@pytest.mark.parametrize("config", ["sraven", "fuzzy_logic_moe"])
def test_seeds_with_their_own_splits_hand_over_between_stack_and_lone_runs(tmp_path: Path, config: str) -> None:
    """With the paper configs' split, a stacked run's checkpoint continues alone and lone runs' checkpoints
    continue as one stack, each run on its own split, as the uninterrupted lone runs."""
    overrides = [*PAPER_SPLIT, "train.steps=4", "train.stack_forward=loop", *MOE]
    exact = on_the_records_machine()

    def lone_args(seed: int) -> list[str]:
        return ["train", config, *overrides, f"seed={seed}", f"name={config}_seed{seed}", "--quiet"]

    def text(run: Path) -> str:
        return (run / "metrics.jsonl").read_text()

    whole = {seed: tmp_path / f"lone{seed}" for seed in (0, 3)}
    for seed, out in whole.items():
        assert main([*lone_args(seed), "--out", str(out)]) == 0
    stack = ["train", config, *overrides, "--seeds", "0,3", "--quiet"]
    assert main([*stack, "--out", str(tmp_path / "stacked"), "--stop-at-step", "2"]) == 0
    for seed in (0, 3):  # stacked, then each alone
        assert main([*lone_args(seed), "--out", str(tmp_path / "stacked" / f"seed{seed}"), "--resume"]) == 0
    for seed in (0, 3):  # alone, then stacked
        assert main([*lone_args(seed), "--out", str(tmp_path / "alone" / f"seed{seed}"), "--stop-at-step", "2"]) == 0
    assert main([*stack, "--out", str(tmp_path / "alone"), "--resume"]) == 0
    for seed in (0, 3):
        for parts in ("stacked", "alone"):
            run = tmp_path / parts / f"seed{seed}"
            assert_same_numbers(text(run), text(whole[seed]), exact=exact, rtol=STACK_RTOL, what=f"{parts}, {seed}")
            assert load_checkpoint(latest_checkpoint(run)).step == 4


@pytest.mark.slow
@pytest.mark.float_sensitive
def test_stacked_runs_drop_the_pairs_their_lone_runs_drop(tmp_path: Path) -> None:
    """Attention dropout in a stack: each run draws its masks from its own generator, so a loop stack
    equals its lone runs bit for bit (same process), vmap within ``STACK_RTOL``; a stopped stack
    resumes onto the uninterrupted one, and the lone trainer continues a stacked run's masks."""
    dropped = [o for o in FEW_STEPS if not o.startswith("model.attention_dropout")] + ["model.attention_dropout=0.3"]
    six_steps = [*dropped, "train.steps=6"]

    def train(out: str, *extra: str) -> Path:
        assert main(["train", "sraven", *six_steps, *extra, "--out", str(tmp_path / out), "--quiet"]) == 0
        return tmp_path / out

    def text(run: Path) -> str:
        return (run / "metrics.jsonl").read_text()

    def assert_as_alone(run: Path, seed: int, exact: bool) -> None:
        assert_same_numbers(text(run), text(lone[seed]), exact=exact, rtol=STACK_RTOL, what=f"{run.name}, seed {seed}")

    lone = {seed: train(f"lone{seed}", f"seed={seed}", f"name=sraven_seed{seed}") for seed in (0, 3)}
    loop = train("loop", "train.stack_forward=loop", "--seeds", "0,3")
    assert text(lone[0]) != text(lone[3])
    exact = on_the_records_machine()  # the loop's arithmetic is the lone run's (see the test above)
    for seed in (0, 3):
        assert_as_alone(loop / f"seed{seed}", seed, exact)
    # without dropout the same seeds give other numbers: the masks are really drawn
    undropped = tmp_path / "undropped"
    assert main(["train", "sraven", *FEW_STEPS, "train.steps=6", "--out", str(undropped), "--quiet"]) == 0
    assert train_losses(undropped) != train_losses(lone[0])
    # vmap: the same masks, the matmuls batched; compared over the first 3 steps (see STACK_RTOL)
    vmap_dir = train("vmap", "train.stack_forward=vmap", "--seeds", "0,3", "--stop-at-step", "3")
    for seed in (0, 3):
        first = "".join(line + "\n" for line in text(lone[seed]).splitlines() if json.loads(line)["step"] <= 3)
        ours = text(vmap_dir / f"seed{seed}")
        assert_same_numbers(ours, first, exact=False, rtol=STACK_RTOL, what=f"vmap stack with dropout, seed {seed}")
    # stopped at step 2 and resumed: the masks go on where they stopped
    train("parts", "train.stack_forward=loop", "--seeds", "0,3", "--stop-at-step", "2")
    parts = train("parts", "train.stack_forward=loop", "--seeds", "0,3", "--resume")
    for seed in (0, 3):
        assert_as_alone(parts / f"seed{seed}", seed, exact)
    # a stacked checkpoint (a stack of one: `--seeds 3` alone would train lone) continued by the lone trainer
    train_stack("sraven", [*six_steps, "train.stack_forward=loop"], tmp_path / "handover", "3", stop_at_step=2)
    alone = ["train", "sraven", *six_steps, "seed=3", "name=sraven_seed3", "--resume", "--quiet"]
    assert main([*alone, "--out", str(tmp_path / "handover" / "seed3")]) == 0
    assert_as_alone(tmp_path / "handover" / "seed3", 3, exact)


@pytest.mark.float_sensitive
def test_sweep_of_optimizer_hyperparameters_matches_lone_runs(tmp_path: Path) -> None:
    """Per-run lr / weight decay / warmup (and gradient accumulation, for all) in one stack."""
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(
        "runs:\n  - {train.lr: 0.003}\n  - {train.lr: 0.0003, train.weight_decay: 0.3, train.warmup_steps: 3}\n"
    )
    common = ["train.grad_accum_steps=2", "train.steps=6"]
    args = ["train", "fuzzy_logic", *TINY, *common, "--sweep", str(sweep), "--out", str(tmp_path / "s"), "--quiet"]
    assert main(args) == 0
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["lr0.0003-weight_decay0.3-warmup_steps3", "lr0.003"]
    for name, overrides in (
        ("lr0.003", ["train.lr=0.003"]),
        (
            "lr0.0003-weight_decay0.3-warmup_steps3",
            ["train.lr=0.0003", "train.weight_decay=0.3", "train.warmup_steps=3"],
        ),
    ):
        alone = lone(tmp_path, "fuzzy_logic", f"lone_{name}", *common, *overrides, f"name=fuzzy_logic_{name}")
        assert_same_metrics(metrics(tmp_path / "s" / name), metrics(alone))


@pytest.mark.float_sensitive
def test_stacked_resume_and_lone_resume_of_a_stacked_run(tmp_path: Path) -> None:
    full = tmp_path / "full"
    assert main(["train", "sraven", *TINY, "--seeds", "0,1", "--out", str(full), "--quiet"]) == 0
    part = tmp_path / "part"
    assert main(["train", "sraven", *TINY, "--seeds", "0,1", "--out", str(part), "--quiet", "--stop-at-step", "5"]) == 0
    assert load_checkpoint(latest_checkpoint(part / "seed0")).step == 5
    assert main(["train", "sraven", *TINY, "--seeds", "0,1", "--out", str(part), "--quiet", "--resume"]) == 0
    for s in (0, 1):
        assert_same_metrics(metrics(part / f"seed{s}"), metrics(full / f"seed{s}"), rel=1e-6)
    # a stacked run directory is an ordinary one: the lone trainer continues it
    one = tmp_path / "one"
    train_stack("sraven", TINY, one, "1", stop_at_step=3)  # a stack of one: `--seeds 1` would train lone
    resume = ["train", "sraven", *TINY, "seed=1", "name=sraven_seed1", "--out", str(one / "seed1"), "--resume"]
    assert main([*resume, "--quiet"]) == 0
    assert_same_metrics(metrics(one / "seed1"), metrics(full / "seed1"))
    assert load_checkpoint(latest_checkpoint(one / "seed1")).step == 8


@pytest.mark.float_sensitive
def test_signal_stops_a_stack_with_checkpoints_and_resume_matches(tmp_path: Path) -> None:
    """SIGTERM mid-run: every run's checkpoint is written at that step, and resuming gives the
    uninterrupted stack's metrics (both engines run in the one shell, ``hyla.train.loop.Trainer``)."""
    args = ["train", "fuzzy_logic", *TINY, "--seeds", "0,1", "--quiet"]
    assert main([*args, "--out", str(tmp_path / "whole")]) == 0
    cfgs, outs = stacked_configs_for(tmp_path / "parts", "0,1")
    trainer = Trainer(cfgs, outs, quiet=True, engine="stacked")
    sigterm_after_step(trainer, 3)
    with pytest.raises(Interrupted, match="SIGTERM"):
        trainer.run()
    trainer.close()
    assert [latest_checkpoint(out).name for out in outs] == ["step-000000003"] * 2
    assert main([*args, "--out", str(tmp_path / "parts"), "--resume"]) == 0
    for seed in (0, 1):
        whole, parts = tmp_path / "whole" / f"seed{seed}", tmp_path / "parts" / f"seed{seed}"
        assert (whole / "metrics.jsonl").read_bytes() == (parts / "metrics.jsonl").read_bytes()


def stacked_configs_for(
    out: Path, seeds: str, config: str = "fuzzy_logic", overrides: list[str] = TINY
) -> tuple[list, list[Path]]:
    """What ``hyla train CONFIG OVERRIDES --seeds SEEDS --out OUT`` would train."""
    import argparse

    ns = argparse.Namespace(config=config, overrides=overrides, seeds=seeds, sweep=None, out=str(out))
    return run_configs(ns)


def train_stack(config: str, overrides: list[str], out: Path, seeds: str, stop_at_step: int) -> None:
    """``hyla train ... --seeds SEEDS --stop-at-step N`` forced onto the stacked engine, even for one seed."""
    cfgs, outs = stacked_configs_for(out, seeds, config, overrides)
    trainer = Trainer(cfgs, outs, quiet=True, engine="stacked", stop_at_step=stop_at_step)
    try:
        trainer.run()
    finally:
        trainer.close()


def test_runs_that_do_not_stack_are_trained_group_by_group(tmp_path: Path, capsys) -> None:
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("grid:\n  model.num_layers: [1, 2]\n  train.lr: [0.001, 0.003]\n")
    assert main(["train", "sraven", *TINY, "--sweep", str(sweep), "--out", str(tmp_path / "x"), "--quiet"]) == 0
    assert "4 runs in 2 groups (they differ in model.num_layers), trained one after another" in capsys.readouterr().out
    run = tmp_path / "x" / "num_layers1-lr0.003"
    alone = lone(tmp_path, "sraven", "alone", "model.num_layers=1", "train.lr=0.003", "name=sraven_num_layers1-lr0.003")
    assert_same_metrics(metrics(run), metrics(alone))
    options = ([], ["seed=1"], ["model.num_layers=2"], ["model.moe_experts=2"], ["seed=2", "model.moe_experts=2"])
    cfgs = [load_config("sraven", o) for o in options]  # each seed its own split (the paper config's), MoE too
    assert plan_groups(cfgs) == [[0, 1], [2], [3, 4]]
    assert [engine_for([cfgs[i] for i in g]) for g in plan_groups(cfgs)] == ["stacked", "lone", "stacked"]
    assert describe_plan([[cfgs[i] for i in g] for g in plan_groups(cfgs)]) == (
        "5 runs in 3 groups (they differ in model.moe_experts, model.num_layers)"
    )
    lm = [load_config("lm_tiny", [f"seed={s}"]) for s in (0, 1)]
    assert describe_plan([[c] for c in lm]).endswith("(data.task=text (language-model runs are trained one by one))")
    assert describe_plan([cfgs[:2]]) == "2 runs in one stack"
    assert describe_plan([cfgs[:1], cfgs[1:2]]) == "2 runs in 2 groups (their checkpoints are at different steps)"
    # runs stack only when they start together: all new, or resuming from checkpoints of one step
    assert plan_groups(cfgs[:2], [4, 4]) == [[0, 1]]
    assert plan_groups(cfgs[:2], [4, 6]) == plan_groups(cfgs[:2], [None, 4]) == [[0], [1]]


def test_bad_input_is_refused_with_the_parameter_named(tmp_path: Path, capsys) -> None:
    out = str(tmp_path / "y")
    assert main(["train", "sraven", *TINY, "--seeds", "0,a", "--out", out, "--quiet"]) == 2
    assert "--seeds must be comma-separated integers" in capsys.readouterr().err
    assert main(["train", "sraven", *TINY, "--seeds", "1,1", "--out", out, "--quiet"]) == 2
    assert "--seeds must list distinct integers" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("lr: [1, 2]\n")
    assert main(["train", "sraven", *TINY, "--sweep", str(bad), "--out", out, "--quiet"]) == 2
    assert "unknown sweep field lr; allowed fields:" in capsys.readouterr().err
    assert main(["train", "sraven", *TINY, "--seeds", "0,1", "--out", out, "--resume", "--quiet"]) == 2
    assert "--resume: no checkpoint in" in capsys.readouterr().err
    cfgs = [load_config("sraven", TINY), load_config("sraven", [*TINY, "model.num_layers=1"])]
    with pytest.raises(ValueError, match=r"these differ too: model\.num_layers"):
        Trainer(cfgs, [tmp_path / "a", tmp_path / "b"], engine="stacked")
    with pytest.raises(ValueError, match="run_dirs must hold one directory per run"):
        Trainer(cfgs[:1], [tmp_path / "a", tmp_path / "b"], engine="stacked")


def test_nonfinite_loss_in_one_run_stops_the_stack_naming_it(tmp_path: Path) -> None:
    cfgs = [load_config("fuzzy_logic", [*TINY, "train.log_every=1", f"seed={s}", f"name=run{s}"]) for s in (0, 1)]
    trainer = Trainer(cfgs, [tmp_path / "r0", tmp_path / "r1"], quiet=True, engine="stacked")
    real_step = trainer.train_step

    def poisoned_step() -> None:
        if trainer.step == 6:  # before the 7th update
            with torch.no_grad():
                trainer.engine.flat_RxN[1, 0] = float("nan")
        real_step()

    trainer.train_step = poisoned_step  # type: ignore[method-assign]
    with pytest.raises(NonFiniteLossError, match=r"run1 \(step 7\)"):
        trainer.run()
    trainer.close()
    assert latest_checkpoint(tmp_path / "r1").name == "step-000000004"
    assert all(torch.isfinite(v).all() for v in load_checkpoint(latest_checkpoint(tmp_path / "r1")).model.values())


def test_stack_forward_resolves_per_device_and_refuses_unknown_values(tmp_path: Path) -> None:
    assert stack_forward_mode("auto", "cuda") == "vmap" and stack_forward_mode("auto", "cpu") == "loop"
    assert stack_forward_mode("vmap", "cpu") == "vmap" and stack_forward_mode("loop", "cuda") == "loop"
    assert stack_forward_mode("threads", "cpu") == "loop"  # retired: older run configs still load
    cfgs = [load_config("fuzzy_logic", [*TINY, f"seed={s}", "train.stack_forward=loop"]) for s in range(2)]
    trainer = Trainer(cfgs, [tmp_path / "a", tmp_path / "b"], quiet=True, engine="stacked")
    assert trainer.engine.forward_mode == "loop"
    trainer.close()
    with pytest.raises(ValueError, match=r"train.stack_forward='batched'.*allowed values: auto, vmap, loop$"):
        load_config("fuzzy_logic", ["train.stack_forward=batched"]).validate()


def test_fast_mode_resolves_per_device() -> None:
    fast, plain = TrainConfig(fast=True), TrainConfig()
    assert compile_mode(fast, "cuda") == "reduce-overhead" and uses_cudagraphs("reduce-overhead", "cuda")
    assert compile_mode(fast, "cpu") == "default" and not uses_cudagraphs("default", "cpu")
    assert compile_mode(fast, "cuda", distributed=True) == "default"  # no CUDA graphs under DDP
    assert compile_mode(TrainConfig(fast=True, compile_mode="max-autotune"), "cpu") == "max-autotune-no-cudagraphs"
    assert compile_mode(plain, "cuda") is None
    assert compile_mode(TrainConfig(compile=True, compile_mode="reduce-overhead"), "cuda") == "reduce-overhead"


@pytest.mark.slow
@pytest.mark.compiled
def test_fast_path_gives_the_plain_path_losses(tmp_path: Path) -> None:
    """On CPU ``train.fast`` is torch.compile vs eager: same losses for a lone and a stacked run."""
    small = ["model.num_layers=1", "train.steps=4", "train.log_every=1", "train.eval_every=4"]
    plain = lone(tmp_path, "fuzzy_logic", "plain", *small, "seed=1", "name=fuzzy_logic_seed1")
    fast = lone(tmp_path, "fuzzy_logic", "fast", *small, "seed=1", "name=fuzzy_logic_seed1", "train.fast=true")
    args = ["train", "fuzzy_logic", *TINY, *small, "train.fast=true", "--seeds", "0,1", "--out", str(tmp_path / "s")]
    assert main([*args, "--quiet"]) == 0
    assert len(train_losses(plain)) == 4
    assert train_losses(fast) == pytest.approx(train_losses(plain), rel=1e-4)
    assert_same_metrics(metrics(tmp_path / "s" / "seed1"), metrics(plain))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("task", ["sraven", "fuzzy_logic"])
def test_fast_paths_on_cuda_give_the_plain_path_losses(tmp_path: Path, task: str) -> None:
    """On CUDA, ``train.fast`` (compiled model replayed as CUDA graphs, HYLA's fused kernel) and
    ``train.graph_step`` (the whole step as one CUDA graph, with and without ``fast``) give the eager plain
    run's losses step by step; so does the stacked run. TF32 is off: with it, the direct form (stacked,
    vmap) and the fused kernel (lone) would differ by TF32 rounding rather than by summation order."""
    small = ["model.num_layers=1", "train.steps=6", "train.log_every=1", "train.eval_every=6", "train.tf32=false"]
    run = [*small, "seed=1", f"name={task}_seed1"]
    plain = lone(tmp_path, task, "plain", *run, "--device", "cuda")
    for name, extra in (
        ("fast", ["train.fast=true"]),
        ("graph", ["train.graph_step=true"]),
        ("fast_graph", ["train.fast=true", "train.graph_step=true"]),
    ):
        fast = lone(tmp_path, task, name, *run, *extra, "--device", "cuda")
        assert len(train_losses(fast)) == 6, name
        assert train_losses(fast) == pytest.approx(train_losses(plain), rel=1e-4), name
        assert_same_metrics(metrics(fast), metrics(plain), rel=1e-4)
    for name, extra in (("s", []), ("s_graph", ["train.graph_step=true"])):
        args = ["train", task, *TINY, *small, "train.fast=true", *extra, "--seeds", "0,1", "--device", "cuda"]
        assert main([*args, "--out", str(tmp_path / name), "--quiet"]) == 0
        assert_same_metrics(metrics(tmp_path / name / "seed1"), metrics(plain), rel=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graph_step_run_resumes_exactly(tmp_path: Path) -> None:
    """A ``train.graph_step`` run stopped at step 3 (between logs and checkpoints) and resumed writes the
    uninterrupted run's metrics: the data generator's state advances with each graph replay."""
    small = ["model.num_layers=1", "train.steps=6", "train.log_every=2", "train.eval_every=6", "train.graph_step=true"]
    whole = lone(tmp_path, "fuzzy_logic", "whole", *small, "--device", "cuda")
    args = ["train", "fuzzy_logic", *TINY, *small, "--device", "cuda", "--out", str(tmp_path / "parts"), "--quiet"]
    assert main([*args, "--stop-at-step", "3"]) == 0
    assert main([*args, "--resume"]) == 0
    assert_same_metrics(metrics(tmp_path / "parts"), metrics(whole), rel=1e-6)
    stacked = ["train", "fuzzy_logic", *TINY, *small, "--device", "cuda", "--seeds", "0,1", "--quiet"]
    assert main([*stacked, "--out", str(tmp_path / "stack_whole")]) == 0
    assert main([*stacked, "--out", str(tmp_path / "stack_parts"), "--stop-at-step", "3"]) == 0
    assert main([*stacked, "--out", str(tmp_path / "stack_parts"), "--resume"]) == 0
    for seed in (0, 1):
        parts, whole_run = tmp_path / "stack_parts" / f"seed{seed}", tmp_path / "stack_whole" / f"seed{seed}"
        assert_same_metrics(metrics(parts), metrics(whole_run), rel=1e-6)


def test_graph_step_refuses_cpu_runs(tmp_path: Path, capsys) -> None:
    assert main(["train", "fuzzy_logic", *TINY, "train.graph_step=true", "--out", str(tmp_path / "a"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "train.graph_step=true needs a CUDA device" in err and "allowed values here: false" in err
    cfgs = [load_config("fuzzy_logic", [*TINY, f"seed={s}", "train.graph_step=true"]) for s in (0, 1)]
    with pytest.raises(ValueError, match=r"train\.graph_step=true needs a CUDA device.*allowed values here: false"):
        Trainer(cfgs, [tmp_path / "s0", tmp_path / "s1"], engine="stacked")


def stand_in_for_cuda_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let ``train.graph_step`` run on CPU with torch.cuda's stream and graph API replaced: a capture
    runs the step once and then undoes it (a real capture records without computing), a replay clears
    the gradients (a real one overwrites the captured ones) and runs the step. What it checks is the
    mechanics around the graph: warm-up and restore, step counter, schedule chunks, in-place sums."""

    class Stream:
        def __init__(self, *args: object) -> None:
            pass

        def wait_stream(self, other: object) -> None:
            pass

    capturing: list[StepGraph] = []

    class Graph:
        def __init__(self) -> None:
            self.owner = capturing[-1]

        def register_generator_state(self, gen: torch.Generator) -> None:
            pass

        def replay(self) -> None:
            self.owner._clear_grads()
            self.owner._body()

    @contextmanager
    def graph(g: Graph) -> Iterator[None]:
        snap, step = g.owner._snapshot(), int(g.owner.step_count)
        yield
        g.owner._restore(snap)
        g.owner.step_count.fill_(step)

    real_capture = StepGraph._capture

    def capture(self: StepGraph, step: int) -> None:
        capturing.append(self)
        real_capture(self, step)

    monkeypatch.setattr(StepGraph, "_capture", capture)
    for name, value in (
        ("Stream", Stream),
        ("current_stream", lambda device=None: Stream()),
        ("stream", lambda s: nullcontext()),
        ("CUDAGraph", Graph),
        ("graph", graph),
        ("get_rng_state", lambda device=None: torch.get_rng_state()),
        ("set_rng_state", lambda state, device=None: torch.set_rng_state(state)),
    ):
        monkeypatch.setattr(torch.cuda, name, value)
    monkeypatch.setattr(engine_module, "graph_step_unsupported_reason", lambda *args: None)
    build = lone_module.build_optimizer  # capturable AdamW needs CUDA; the plain one takes a tensor lr
    monkeypatch.setattr(
        lone_module, "build_optimizer", lambda model, cfg, device, capturable=False: build(model, cfg, device)
    )


@pytest.mark.slow
def test_graph_step_mechanics_with_a_stand_in_for_cuda_graphs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lone and stacked ``train.graph_step`` runs (capture, replays, a stop and resume) on CPU write the
    plain runs' metrics; only the CUDA graph itself is stood in for (the real one: CUDA-only tests)."""
    stand_in_for_cuda_graphs(monkeypatch)
    monkeypatch.setattr(optim_module, "SCHEDULE_CHUNK", 3)
    base = ["train", "fuzzy_logic", *TINY, "train.stack_forward=loop"]
    for name, extra in (("plain", []), ("graph", ["train.graph_step=true"])):
        assert main([*base, *extra, "--quiet", "--out", str(tmp_path / f"lone_{name}")]) == 0
        assert main([*base, *extra, "--seeds", "0,1", "--quiet", "--out", str(tmp_path / f"stack_{name}")]) == 0
    parts = [*base, "train.graph_step=true", "--seeds", "0,1", "--quiet", "--out", str(tmp_path / "stack_parts")]
    assert main([*parts, "--stop-at-step", "3"]) == 0
    assert main([*parts, "--resume"]) == 0
    assert_same_metrics(metrics(tmp_path / "lone_graph"), metrics(tmp_path / "lone_plain"), rel=1e-5)
    for seed in (0, 1):
        plain = metrics(tmp_path / "stack_plain" / f"seed{seed}")
        assert_same_metrics(metrics(tmp_path / "stack_graph" / f"seed{seed}"), plain, rel=1e-6)
        assert_same_metrics(metrics(tmp_path / "stack_parts" / f"seed{seed}"), plain, rel=1e-6)


def test_stacked_graph_body_run_eagerly_equals_the_plain_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``train.graph_step`` captures for a stack, run eagerly on CPU: each run's sampling from its own
    split (the paper configs') with its own dropout masks, the step as a device tensor, the AdamW schedule
    row read on the device across schedule chunks, the sums and flags in place, and the snapshot the
    warm-up is undone with. Only the capture itself needs CUDA."""
    monkeypatch.setattr(optim_module, "SCHEDULE_CHUNK", 3)  # steps 0..6 cross two chunk boundaries
    monkeypatch.setattr(optim_module.StackedAdamW, "update", update_as_on_cuda)
    sweep = [["seed=0", "train.lr=0.003"], ["seed=1", "train.lr=0.001", "train.weight_decay=0.3"]]
    paper = ["train.stack_forward=loop", "data.split_seed=null", "model.attention_dropout=0.1"]
    cfgs = [load_config("fuzzy_logic", [*TINY, *paper, *o]) for o in sweep]
    plain = Trainer(cfgs, [tmp_path / "p0", tmp_path / "p1"], quiet=True, engine="stacked")
    body = Trainer(cfgs, [tmp_path / "b0", tmp_path / "b1"], quiet=True, engine="stacked")
    engine, ref = body.engine, plain.engine
    assert [t.split_seed for t in engine.tasks] == [0, 1] and engine.task_of == [0, 1]
    graph = StackedStepGraph(engine)
    engine.graph = graph
    graph._before_capture()
    snap = graph._snapshot()
    for _ in range(2):  # the warm-up, then undone
        engine.optimizer.load_schedule(int(graph.step_count))
        graph._body()
    graph._restore(snap)
    graph.step_count.fill_(0)
    assert torch.equal(engine.flat_RxN, ref.flat_RxN)
    assert torch.equal(engine.optimizer.exp_avg_sq_RxN, ref.optimizer.exp_avg_sq_RxN)
    for step in range(7):
        plain.train_step()
        engine.optimizer.load_schedule(step)
        graph._body()
        body.steps_since_log += 1
        body.step += 1
        if step in (1, 6):
            for mine, theirs in zip(body._flush_train_metrics(), plain._flush_train_metrics(), strict=True):
                assert mine == pytest.approx(theirs, rel=1e-6) and set(mine) == {"loss", body.task.primary_metric}
    assert int(graph.step_count) == 7
    pairs = ((engine.flat_RxN, ref.flat_RxN), (engine.optimizer.exp_avg_RxN, ref.optimizer.exp_avg_RxN))
    for mine, theirs in pairs:
        torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=1e-7)
    assert engine.sums.nonfinite_R.tolist() == [-1, -1]
    assert set(engine.sums.sums_R) == {"loss", body.task.primary_metric}  # buffers kept, zeroed by the flush
    assert all(v.abs().sum() == 0 for v in engine.sums.sums_R.values())
    plain.close()
    body.close()


def test_stacked_runs_take_their_own_init_weights(tmp_path: Path) -> None:
    from hyla.train.build import build_model, build_task
    from hyla.train.run.checkpoint import save_weights

    cfgs = [load_config("sraven", [*TINY, "model.attention=hyla", f"seed={s}"]) for s in (0, 1)]
    draws = []
    for cfg in cfgs:
        draws.append(tmp_path / f"seed{cfg.seed}.safetensors")
        save_weights(draws[-1], build_model(cfg, build_task(cfg)).state_dict())

    def stack(name: str, *weights: Path | None) -> list[list[dict]]:
        given = []
        for cfg, w in zip(cfgs, weights):
            extra = [f"train.init_weights={w}"] if w else []
            given.append(load_config("sraven", [*TINY, "model.attention=hyla", f"seed={cfg.seed}", *extra]))
        trainer = Trainer(given, [tmp_path / name / str(r) for r in range(2)], engine="stacked", quiet=True)
        trainer.run()
        trainer.close()
        return [metrics(tmp_path / name / str(r)) for r in range(2)]

    plain = stack("plain", None, None)
    assert stack("own", None, draws[1]) == plain  # a run given its own draw is itself, beside one that is not given
    swapped = stack("swapped", draws[1], draws[0])
    assert swapped[0] != plain[0] and swapped[1] != plain[1]


@pytest.mark.float_sensitive
def test_a_sweep_run_stopped_under_its_name_from_before_resumes_there(tmp_path: Path, capsys) -> None:
    """``hyla train --seeds/--sweep`` named runs ``seed0_lr0.003`` before taking ``hyla sweep``'s rule
    (``lr0.003-seed0``): a run stopped under the old name continues there, saying so."""
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("grid:\n  train.lr: [0.003]\n")
    old = tmp_path / "old" / "seed0_lr0.003"  # what the former hyla train wrote: its config and folder name
    former = ["seed=0", "train.lr=0.003", "name=fuzzy_logic_seed0_lr0.003"]
    assert main(["train", "fuzzy_logic", *TINY, *former, "--out", str(old), "--quiet", "--stop-at-step", "4"]) == 0
    new = ["train", "fuzzy_logic", *TINY, "--seeds", "0", "--sweep", str(sweep), "--quiet"]
    capsys.readouterr()
    with pytest.warns(DeprecationWarning, match="now named like lr0.003-seed0"):
        assert main([*new, "--out", str(tmp_path / "old"), "--resume"]) == 0
    assert f"hyla train: resuming {old} (named seed0_lr0.003 before" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "old").iterdir()) == ["seed0_lr0.003"]
    assert main([*new, "--out", str(tmp_path / "fresh")]) == 0
    assert (old / "metrics.jsonl").read_bytes() == (tmp_path / "fresh" / "lr0.003-seed0" / "metrics.jsonl").read_bytes()
