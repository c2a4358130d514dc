"""The training shell's pieces: the per-run step sums, the engine choice, and tasks owning their config."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from hyla.tasks import REGISTRY
from hyla.train.build import build_model, build_task, build_tasks, sized_config
from hyla.train.config import DataConfig, load_config, task_options
from hyla.train.engines.base import StepSums
from hyla.train.engines.optim import StackedAdamW, build_optimizer, decayed_parameter_names, load_optimizer_state, lr_at
from hyla.train.engines.stacked import decay_groups, stack_layout
from hyla.train.loop import Trainer
from tiny import tiny_overrides

TINY = tiny_overrides(layers=1, steps=4, every=2, log_every=2, warmup_steps=1)


def test_step_sums_add_take_and_flag_per_run() -> None:
    sums = StepSums(2, ("loss", "r2"), torch.device("cpu"))
    assert sums.take() is None and sums.bad_runs() == []
    for step, (a, b) in enumerate([(1.0, 2.0), (3.0, float("nan")), (5.0, 7.0)], start=1):
        loss_R = torch.tensor([a, b], dtype=torch.float64)
        sums.add({"loss": loss_R, "r2": 2 * loss_R}, loss_R, step)
    keys, sums_RxK = sums.take()
    assert keys == ["loss", "r2"] and sums_RxK[0].tolist() == [9.0, 18.0] and sums_RxK[1].isnan().all()
    assert sums.take() is None  # taken: starts anew
    assert sums.bad_runs() == [(1, 2)]  # the first non-finite step is kept
    # a captured step adds into fixed buffers, which a take zeroes instead of dropping
    sums.fix_buffers()
    buffer = sums.sums_R["loss"]
    sums.add({"loss": torch.ones(2, dtype=torch.float64), "r2": torch.ones(2, dtype=torch.float64)}, torch.ones(2), 4)
    assert sums.take()[1].tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert sums.sums_R["loss"] is buffer and buffer.tolist() == [0.0, 0.0]
    snap = sums.snapshot()
    sums.add({"loss": torch.ones(2, dtype=torch.float64)}, torch.tensor([float("inf"), 1.0]), 5)
    sums.restore(snap)
    assert buffer.tolist() == [0.0, 0.0] and sums.bad_runs() == [(1, 2)]


def test_engine_choice_and_its_errors(tmp_path: Path) -> None:
    cfgs = [load_config("fuzzy_logic", [*TINY, f"seed={s}"]) for s in (0, 1)]
    with pytest.raises(ValueError, match="engine='fast' is not valid; allowed values: auto, lone, stacked"):
        Trainer(cfgs[0], tmp_path / "x", engine="fast")
    with pytest.raises(ValueError, match="the lone engine trains one run, got 2"):
        Trainer(cfgs, [tmp_path / "a", tmp_path / "b"], engine="lone")
    auto = Trainer(cfgs, [tmp_path / "c", tmp_path / "d"], quiet=True)
    assert type(auto.engine).__name__ == "StackedEngine" and auto.num_runs == 2
    auto.close()
    one = Trainer(cfgs[:1], [tmp_path / "e"], quiet=True)
    assert type(one.engine).__name__ == "LoneEngine"
    one.close()


def test_a_checkpoint_resumes_in_the_step_mode_of_the_optimizer_it_is_loaded_into() -> None:
    """A CPU run's AdamW state (not capturable) resumed by a CUDA run with ``train.graph_step`` (capturable
    AdamW) must stay capturable, or the graph capture of the step fails (seen on an H100, 2026-11-27); the
    run's own options (weight decay, betas) and moments come from the checkpoint."""
    torch.manual_seed(0)
    saved_model = torch.nn.Linear(5, 3)
    saved = torch.optim.AdamW(saved_model.parameters(), lr=1e-3, weight_decay=0.3, betas=(0.8, 0.9))
    saved_model(torch.randn(7, 5)).square().sum().backward()
    saved.step()
    model = torch.nn.Linear(5, 3)
    for plain, capturable in ((False, True), (True, False)):
        opt = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.1, capturable=capturable)
        if plain:  # why the helper exists: torch's own load takes the checkpoint's step mode
            opt.load_state_dict(saved.state_dict())
            assert opt.param_groups[0]["capturable"] is False
            opt = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.1, capturable=capturable)
        load_optimizer_state(opt, saved.state_dict())
        group = opt.param_groups[0]
        assert group["capturable"] is capturable
        assert (group["weight_decay"], group["betas"]) == (0.3, (0.8, 0.9))
        for p_saved, p in zip(saved_model.parameters(), model.parameters()):
            torch.testing.assert_close(opt.state[p]["exp_avg"], saved.state[p_saved]["exp_avg"], rtol=0, atol=0)
            torch.testing.assert_close(opt.state[p]["exp_avg_sq"], saved.state[p_saved]["exp_avg_sq"], rtol=0, atol=0)
    two_groups = build_optimizer(model, load_config("fuzzy_logic", TINY), torch.device("cpu"))
    with pytest.raises(ValueError, match="parameter groups"):
        load_optimizer_state(two_groups, saved.state_dict())


@pytest.mark.float_sensitive
def test_stacked_adamw_equals_torch_adamw_and_converts_both_ways() -> None:
    """Two runs with different lr / weight decay, 5 steps on random gradients: the stacked update is
    ``torch.optim.AdamW``'s (on the CPU its fused kernel run by run: bit for bit; the all-runs arithmetic that
    CUDA uses: within rounding), and a run's moments survive the trip to its state format and back."""
    cfgs = [load_config("fuzzy_logic", [*TINY, "train.lr=0.01", "train.weight_decay=0.3"])]
    cfgs.append(load_config("fuzzy_logic", [*TINY, "train.lr=0.003", "train.weight_decay=0.1"]))
    task = build_task(cfgs[0])
    models = [build_model(cfg, task) for cfg in cfgs]
    decayed = decayed_parameter_names(models[0], cfgs[0].train.weight_decay_mask)
    slots, width = stack_layout(models[0], decayed)
    columns = {s.name: s.columns for s in slots}
    groups = decay_groups(slots)
    assert [columns[n] for n in columns if n in decayed] == groups[0] and groups[1]
    assert max(c.stop for c in groups[0]) <= min(c.start for c in groups[1])  # decayed first, as a lone run groups
    used = torch.zeros(width, dtype=torch.bool)
    flat_RxN = torch.zeros(2, width)
    with torch.no_grad():
        for r, model in enumerate(models):
            for n, p in model.named_parameters():
                flat_RxN[r, columns[n]] = p.reshape(-1)
                used[columns[n]] = True
    assert not used.all()  # gaps between parameters, as in a stack: they must stay 0
    stacked = StackedAdamW(flat_RxN, *groups, cfgs)
    all_at_once = StackedAdamW(flat_RxN.clone(), *groups, cfgs)
    start_RxN = flat_RxN.clone()
    optimizers = [build_optimizer(m, cfg, torch.device("cpu")) for m, cfg in zip(models, cfgs)]
    assert all(opt.defaults["fused"] for opt in optimizers)
    gen = torch.Generator().manual_seed(0)
    for step in range(5):
        grad_RxN = torch.randn(flat_RxN.shape, generator=gen) * used  # a stack's gradient is 0 in the gaps
        for r, (model, opt) in enumerate(zip(models, optimizers)):
            for group in opt.param_groups:
                group["lr"] = lr_at(step, cfgs[r])
            for n, p in model.named_parameters():
                p.grad = grad_RxN[r, columns[n]].reshape(p.shape).clone()
            opt.step()
        stacked.update(step, grad_RxN)
        all_at_once.step(grad_RxN, all_at_once.schedule_row(step))
    for r, (model, opt) in enumerate(zip(models, optimizers)):
        for n, p in model.named_parameters():
            assert torch.equal(flat_RxN[r, columns[n]], p.detach().reshape(-1)), (r, n)
            # the moments too: the fused kernel rounds a tensor's scalar tail unlike its vector body (v above all)
            assert torch.equal(stacked.exp_avg_sq_RxN[r, columns[n]], opt.state[p]["exp_avg_sq"].reshape(-1)), (r, n)
            torch.testing.assert_close(
                all_at_once.flat_RxN[r, columns[n]], p.detach().reshape(-1), rtol=1e-5, atol=1e-6
            )
        assert not torch.equal(flat_RxN[r], start_RxN[r])  # it moved
    for t in (flat_RxN, stacked.exp_avg_RxN, all_at_once.flat_RxN, all_at_once.exp_avg_sq_RxN):
        assert t[:, ~used].abs().sum() == 0
    opt = stacked.to_adamw(1, models[1], columns, step=5)
    assert opt.state[next(models[1].parameters())]["step"].item() == 5.0
    copy = StackedAdamW(flat_RxN.clone(), *groups, cfgs)
    copy.load_adamw(1, opt, models[1], columns)
    assert torch.equal(copy.exp_avg_RxN[1], stacked.exp_avg_RxN[1])
    assert torch.equal(copy.exp_avg_sq_RxN[1], stacked.exp_avg_sq_RxN[1])
    assert copy.exp_avg_RxN[0].abs().sum() == 0 < stacked.exp_avg_RxN[0].abs().sum()  # only run 1 was loaded


@pytest.mark.float_sensitive
def test_stacked_adamw_updates_each_parameter_as_a_tensor_of_its_own() -> None:
    """Parameters of 1, 3 and 8 elements inside a longer row: a lone run's fused AdamW takes each in its
    scalar tail, which rounds unlike the kernel's vector body, so the stack must pass each as its own tensor
    to give the lone run's moments bit for bit."""
    cfg = load_config("fuzzy_logic", [*TINY, "train.weight_decay=0.3"])
    sizes = {"a": 1, "b": 3, "c": 8, "d": 1}
    decayed, undecayed = [slice(0, 1), slice(16, 19)], [slice(32, 40), slice(48, 49)]
    gen = torch.Generator().manual_seed(0)
    flat_RxN = torch.zeros(1, 64)
    lone = {n: torch.randn(k, generator=gen) for n, k in sizes.items()}
    for n, cols in zip(sizes, decayed + undecayed):
        flat_RxN[0, cols] = lone[n]
    params = {n: torch.nn.Parameter(t) for n, t in lone.items()}
    groups = [{"params": [params["a"], params["b"]], "weight_decay": 0.3}]
    groups.append({"params": [params["c"], params["d"]], "weight_decay": 0.0})
    opt = torch.optim.AdamW(groups, lr=cfg.train.lr, fused=True)
    stacked = StackedAdamW(flat_RxN, decayed, undecayed, [cfg])
    for step in range(20):
        grad_RxN = torch.zeros_like(flat_RxN)
        for n, cols in zip(sizes, decayed + undecayed):
            grad_RxN[0, cols] = params[n].grad = torch.randn(sizes[n], generator=gen)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        opt.step()
        stacked.update(step, grad_RxN)
    for n, cols in zip(sizes, decayed + undecayed):
        assert torch.equal(flat_RxN[0, cols], params[n].detach()), n
        assert torch.equal(stacked.exp_avg_sq_RxN[0, cols], opt.state[params[n]]["exp_avg_sq"]), n


def test_every_registered_task_owns_its_data_keys() -> None:
    data_keys = {f.name for f in dataclasses.fields(DataConfig)}
    for name, entry in REGISTRY.items():
        own = {f.name for f in dataclasses.fields(entry.options)}
        assert own <= data_keys, name
        options = task_options(DataConfig(task=name))
        assert type(options) is entry.options
    with pytest.raises(ValueError, match=r"data\.task='chess' is not valid; allowed values: sraven, fuzzy_logic, text"):
        load_config("fuzzy_logic", ["data.task=chess"])
    with pytest.raises(ValueError, match=r"data\.split_style='nope' is not valid; allowed values: cover, authors"):
        load_config("fuzzy_logic", ["data.split_style=nope"])


def test_each_held_out_split_is_built_once_and_runs_point_at_theirs() -> None:
    """A stack's tasks: runs whose split follows their seed (the paper configs') each have their own, runs
    that differ only in the optimizer share one, and a fixed ``data.split_seed`` gives all runs one."""
    follow = ["data.split_seed=null"]
    cfgs = [load_config("fuzzy_logic", [*follow, *o]) for o in (["seed=0"], ["seed=1"], ["seed=0", "train.lr=0.01"])]
    tasks, task_of = build_tasks(cfgs)
    assert len(tasks) == 2 and task_of == [0, 1, 0]
    assert [t.split_seed for t in tasks] == [0, 1]
    assert not torch.equal(tasks[0].task_ids["ood"], tasks[1].task_ids["ood"])  # really another split
    fixed = [load_config("fuzzy_logic", ["data.split_seed=5", f"seed={s}"]) for s in (0, 1)]
    tasks, task_of = build_tasks(fixed)
    assert len(tasks) == 1 and task_of == [0, 0] and tasks[0].split_seed == 5


def test_the_model_is_sized_by_the_task_without_changing_the_config() -> None:
    cfg = load_config("sraven", TINY)
    before = cfg.to_dict()
    task = build_task(cfg)
    model = build_model(cfg, task)
    assert cfg.to_dict() == before and cfg.model.input_dim is None
    sized = sized_config(cfg, task)
    assert (sized.model.input_dim, sized.model.output_dim) == (task.input_dim, task.output_dim)
    if cfg.model.relative_position:
        assert sized.model.relative_position_buckets == task.seq_len
    assert model(task.sample(2, "train", torch.Generator().manual_seed(0)).inputs).shape[-1] == task.output_dim
