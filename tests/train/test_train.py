"""`hyla train`: runs per task, exact resume, DDP on gloo, reliability, configs."""

from __future__ import annotations

import getpass
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hyla.cli import main
from hyla.textio import TornLineWarning
from hyla.train.config import ExperimentConfig, load_config, parse_overrides
from hyla.train.engines.fast import (
    INDUCTOR_CACHE_ENV,
    cpu_dispatch_tag,
    keep_compiled_code_apart,
    shared_inductor_cache,
)
from hyla.train.engines.optim import lr_at
from hyla.train.loop import Interrupted, NonFiniteLossError, Trainer
from hyla.train.run.checkpoint import latest_checkpoint, load_checkpoint
from tiny import HANG_GUARD_S, sigterm_after_step, tiny_overrides


def tiny(task: str, steps: int = 8, **extra: object) -> list[str]:
    overrides = tiny_overrides(layers=1, steps=steps, every=4, log_every=2, warmup_steps=2)
    return [task, *overrides, *(f"{k}={v}" for k, v in extra.items())]


def read_metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    ("task", "metric", "splits"),
    [
        ("sraven", "acc", {"train", "test", "ood"}),
        ("fuzzy_logic", "r2", {"train", "test", "ood", "unseen_terms"}),
    ],
)
def test_few_step_run_through_cli(tmp_path: Path, task: str, metric: str, splits: set[str]) -> None:
    out = tmp_path / "run"
    extra = ["data.num_unseen_terms=2"] if task == "fuzzy_logic" else []
    assert main(["train", *tiny(task), *extra, "--out", str(out), "--quiet"]) == 0
    cfg = load_config(str(out / "config.yaml"))
    assert cfg.model.attention == "hyla" and cfg.train.steps == 8
    rows = read_metrics(out)
    evals = [r for r in rows if r["split"] in splits]
    assert {r["step"] for r in evals} == {4, 8} and {r["split"] for r in evals} == splits
    assert all(metric in r and "loss" in r for r in evals)
    if task == "sraven":
        assert all("feature_acc" in r for r in evals)
    train_rows = [r for r in rows if r["split"] == "train_batch"]
    assert [r["step"] for r in train_rows] == [2, 4, 6, 8] and all(metric in r for r in train_rows)
    assert list((out / "tb").glob("events.out.tfevents.*"))
    ckpt = latest_checkpoint(out)
    assert ckpt is not None and ckpt.name == "step-000000008"
    assert {p.name for p in ckpt.iterdir()} == {
        "model.safetensors",
        "optimizer.pt",
        "rng.safetensors",
        "state.json",
    }


@pytest.mark.float_sensitive
def test_interrupted_then_resumed_run_is_bitwise_identical(tmp_path: Path) -> None:
    # stop at 5: between logs (2, 4, 6) and checkpoints (4, 8), so accumulators and data stream must resume
    args = tiny("fuzzy_logic", steps=10, **{"model.attention": "hyla", "train.eval_every": 3})
    assert main(["train", *args, "--out", str(tmp_path / "a"), "--quiet"]) == 0
    assert main(["train", *args, "--out", str(tmp_path / "b"), "--quiet", "--stop-at-step", "5"]) == 0
    assert latest_checkpoint(tmp_path / "b").name == "step-000000005"
    assert max(r["step"] for r in read_metrics(tmp_path / "b")) == 4  # logs at 2, 4; eval at 3
    assert main(["train", *args, "--out", str(tmp_path / "b"), "--quiet", "--resume"]) == 0
    assert (tmp_path / "a" / "metrics.jsonl").read_bytes() == (tmp_path / "b" / "metrics.jsonl").read_bytes()
    wa = load_checkpoint(latest_checkpoint(tmp_path / "a")).model
    wb = load_checkpoint(latest_checkpoint(tmp_path / "b")).model
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_checkpoint_from_another_device_type_resumes_with_a_fresh_data_stream(tmp_path: Path) -> None:
    """A CUDA-made checkpoint (a 16-byte Philox data state) resumed on the CPU, as a CPU one on CUDA: the
    stream begins anew, seeded by the run and the step, with a warning; each such resume draws alike."""
    from safetensors.torch import load_file, save_file

    from hyla.train.run.checkpoint import DeviceChangeWarning

    args = tiny("sraven", steps=8)
    assert main(["train", *args, "--out", str(tmp_path / "a"), "--quiet"]) == 0
    assert main(["train", *args, "--out", str(tmp_path / "b"), "--quiet", "--stop-at-step", "4"]) == 0
    rng_file = latest_checkpoint(tmp_path / "b") / "rng.safetensors"
    rng = load_file(str(rng_file))
    rng["data_rank0"] = torch.arange(16, dtype=torch.uint8)  # a CUDA generator's state: seed and offset
    save_file(rng, str(rng_file))
    state = rng_file.with_name("state.json")  # the file's sum as the CUDA run would have recorded it
    meta = json.loads(state.read_text())
    meta["sha256"]["rng.safetensors"] = hashlib.sha256(rng_file.read_bytes()).hexdigest()
    state.write_text(json.dumps(meta))
    shutil.copytree(tmp_path / "b", tmp_path / "c")
    for run in ("b", "c"):
        with pytest.warns(DeviceChangeWarning, match="run 0's data stream was saved on another device type than cpu"):
            assert main(["train", *args, "--out", str(tmp_path / run), "--quiet", "--resume"]) == 0
    after = {run: [r for r in read_metrics(tmp_path / run) if r["step"] > 4] for run in "abc"}
    assert after["b"] == after["c"] and len(after["b"]) == len(after["a"]) > 0
    assert after["b"] != after["a"]  # other batches after the resume


@pytest.mark.float_sensitive
def test_resume_drops_metrics_written_after_the_checkpoint(tmp_path: Path) -> None:
    args = tiny("sraven", steps=8)
    assert main(["train", *args, "--out", str(tmp_path / "a"), "--quiet"]) == 0
    assert main(["train", *args, "--out", str(tmp_path / "b"), "--quiet", "--stop-at-step", "4"]) == 0
    with open(tmp_path / "b" / "metrics.jsonl", "a") as f:  # as if the job logged step 6 and then died
        f.write(json.dumps({"step": 6, "split": "train_batch", "loss": 0.0}) + "\n")
    assert main(["train", *args, "--out", str(tmp_path / "b"), "--quiet", "--resume"]) == 0
    assert (tmp_path / "a" / "metrics.jsonl").read_bytes() == (tmp_path / "b" / "metrics.jsonl").read_bytes()


@pytest.mark.float_sensitive
def test_resume_cuts_a_torn_last_metrics_line_and_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    args = tiny("sraven", steps=8)
    assert main(["train", *args, "--out", str(tmp_path / "a"), "--quiet"]) == 0
    assert main(["train", *args, "--out", str(tmp_path / "b"), "--quiet", "--stop-at-step", "4"]) == 0
    metrics = tmp_path / "b" / "metrics.jsonl"
    with open(metrics, "a") as f:  # as if kill -9 cut the job off while it wrote step 6
        f.write('{"step": 6, "split": "tr')
    with pytest.warns(TornLineWarning, match=re.escape(f"{metrics}: dropped its torn last line")):
        assert main(["train", *args, "--out", str(tmp_path / "b"), "--quiet", "--resume"]) == 0
    assert (tmp_path / "a" / "metrics.jsonl").read_bytes() == metrics.read_bytes()


def test_nan_loss_stops_with_step_and_keeps_last_good_checkpoint(tmp_path: Path, monkeypatch) -> None:
    cfg = load_config(*_split(tiny("fuzzy_logic", steps=12, **{"train.log_every": 1})))
    trainer = Trainer(cfg, tmp_path / "run", quiet=True)
    real_loss = trainer.task.loss

    def poisoned(out, batch):
        loss = real_loss(out, batch)
        return loss * float("nan") if trainer.step == 6 else loss  # the 7th update

    monkeypatch.setattr(trainer.task, "loss", poisoned)
    with pytest.raises(NonFiniteLossError, match="at step 7"):
        trainer.run()
    trainer.close()
    assert latest_checkpoint(tmp_path / "run").name == "step-000000004"
    state = load_checkpoint(latest_checkpoint(tmp_path / "run"))
    assert all(torch.isfinite(v).all() for v in state.model.values())


@pytest.mark.float_sensitive
def test_signal_saves_a_checkpoint_then_resume_matches(tmp_path: Path) -> None:
    args = tiny("fuzzy_logic", steps=8)
    assert main(["train", *args, "--out", str(tmp_path / "a"), "--quiet"]) == 0
    cfg = load_config(*_split(args))
    trainer = Trainer(cfg, tmp_path / "b", quiet=True)
    sigterm_after_step(trainer, 3)
    with pytest.raises(Interrupted):
        trainer.run()
    trainer.close()
    assert latest_checkpoint(tmp_path / "b").name == "step-000000003"
    assert main(["train", *args, "--out", str(tmp_path / "b"), "--quiet", "--resume"]) == 0
    assert (tmp_path / "a" / "metrics.jsonl").read_bytes() == (tmp_path / "b" / "metrics.jsonl").read_bytes()


def test_checkpoint_errors_are_clear(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    args = tiny("fuzzy_logic", steps=4)
    assert main(["train", *args, "--out", str(tmp_path / "none"), "--resume", "--quiet"]) == 2
    assert "no checkpoint in" in capsys.readouterr().err
    assert main(["train", *args, "--out", str(out), "--quiet"]) == 0
    assert main(["train", *args, "--out", str(out), "--quiet"]) == 2
    assert "already holds a run; pass --resume" in capsys.readouterr().err
    assert main(["train", *args, "model.attention=softmax", "--out", str(out), "--resume", "--quiet"]) == 2
    assert "model.attention: checkpoint has 'hyla', now 'softmax'" in capsys.readouterr().err
    ckpt = latest_checkpoint(out)
    (ckpt / "model.safetensors").write_bytes(b"garbage")
    assert main(["train", *args, "train.steps=6", "--out", str(out), "--resume", "--quiet"]) == 2
    assert "is unreadable" in capsys.readouterr().err


def test_checkpoint_files_load_without_pickle(tmp_path: Path) -> None:
    assert main(["train", *tiny("sraven", steps=4), "--out", str(tmp_path / "r"), "--quiet"]) == 0
    ckpt = latest_checkpoint(tmp_path / "r")
    torch.load(ckpt / "optimizer.pt", weights_only=True)  # raises if anything but tensors/containers
    state = load_checkpoint(ckpt)
    assert state.step == 4 and state.config["model"]["attention"] == "hyla"


@pytest.mark.parametrize(
    ("override", "match"),
    [
        (
            "model.atention=hyla",
            r"unknown config key model.atention \(did you mean model.attention\?\); valid keys at model: output_dim, "
            "input_dim",
        ),
        ("train.stepz=3", r"unknown config key train.stepz \(did you mean train.steps\?\); valid keys at train: steps"),
        ("optimizer.lr=3", "unknown config key optimizer; valid keys at top level: name, seed, data, model, train$"),
        ("train.steps=abc", "train.steps must be an integer"),
        ("model.attention=flash", "attention='flash' is unknown"),
        ("data.task=mnist", "data.task='mnist' is not valid"),
    ],
)
def test_config_errors_name_the_key(override: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        cfg = load_config("sraven", [override])
        Trainer(cfg, Path("/nonexistent/never-created"), quiet=True)


def test_every_config_file_loads_and_has_the_required_keys() -> None:
    from hyla.train.config import CONFIG_DIR

    files = sorted(CONFIG_DIR.glob("*.yaml"))
    assert {
        "sraven",
        "fuzzy_logic",
        "sraven_depth8",
        "sraven_width4",
        "sraven_data40m",
        "sraven_single_head",
    } <= {f.stem for f in files}
    for f in files:
        cfg = load_config(str(f))
        assert isinstance(cfg, ExperimentConfig)
        for key in (
            "seed",
            "model.attention",
            "train.steps",
            "train.batch_size",
            "train.lr",
            "train.eval_every",
            "data.holdout",
        ):
            node = cfg
            for part in key.split("."):
                node = getattr(node, part)
    assert load_config("sraven_width2").model.width_multiplier == 2
    assert load_config("sraven_depth16").model.num_layers == 16
    assert parse_overrides(["train.lr=3e-4", "model.single_head=true"]) == {
        "train": {"lr": 3e-4},
        "model": {"single_head": True},
    }


def test_lr_schedule_and_weight_decay_groups(tmp_path: Path) -> None:
    library = ["train.cosine_end=steps", "train.weight_decay_mask=ndim"]  # the library's defaults
    cfg = load_config("sraven", ["train.steps=100", "train.warmup_steps=10", "train.lr=1e-3", *library])
    assert lr_at(0, cfg) == 0.0 and lr_at(5, cfg) == pytest.approx(5e-4) and lr_at(10, cfg) == pytest.approx(1e-3)
    assert lr_at(100, cfg) == pytest.approx(1e-4) and lr_at(55, cfg) == pytest.approx(1e-4 + 0.9e-3 * 0.5)
    config, overrides = _split(tiny("sraven"))
    trainer = Trainer(load_config(config, [*overrides, *library]), tmp_path / "r", quiet=True)
    decay, no_decay = trainer.engine.optimizer.param_groups
    assert all(p.ndim >= 2 for p in decay["params"]) and decay["weight_decay"] == 0.1
    assert all(p.ndim < 2 for p in no_decay["params"]) and no_decay["weight_decay"] == 0.0
    trainer.close()


def test_ddp_on_gloo_with_two_processes(tmp_path: Path) -> None:
    out = tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        # torchrun binds its rendezvous store to port 0 and hands the port it got to the workers: no fixed
        # port that another run on this machine could hold, and no gap between picking a port and binding it
        "--standalone",
        "-m",
        "hyla",
        "train",
        *tiny("fuzzy_logic", steps=6),
        "data.num_unseen_terms=2",
        "--out",
        str(out),
        "--quiet",
    ]
    # the timeout only ends a hang (e.g. a rank waiting for the other forever); two ranks of 6 tiny steps
    # need seconds, so a busy machine never comes near it
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(out)
    assert {r["split"] for r in rows if r["step"] == 6} >= {
        "train",
        "test",
        "ood",
        "unseen_terms",
        "train_batch",
    }
    assert len([r for r in rows if r["split"] == "test"]) == 2  # written once (rank 0), at steps 4 and 6
    state = load_checkpoint(latest_checkpoint(out))
    assert state.extra["world_size"] == 2 and {"data_rank0", "data_rank1"} <= set(state.rng)
    assert not torch.equal(state.rng["data_rank0"], state.rng["data_rank1"])  # each rank its own stream


def _split(argv: list[str]) -> tuple[str, list[str]]:
    return argv[0], argv[1:]


def test_bf16_autocast_run(tmp_path: Path) -> None:
    out = tmp_path / "bf16"
    assert main(["train", *tiny("sraven", steps=4), "train.bf16=true", "--out", str(out), "--quiet"]) == 0
    rows = [r for r in read_metrics(out) if r["split"] == "ood"]
    assert rows and all(0 <= r["acc"] <= 1 and r["loss"] > 0 for r in rows)


@pytest.mark.slow
@pytest.mark.compiled
def test_compiled_run_matches_eager_losses(tmp_path: Path) -> None:
    args = tiny("fuzzy_logic", steps=4, **{"train.log_every": 1})
    assert main(["train", *args, "--out", str(tmp_path / "eager"), "--quiet"]) == 0
    assert main(["train", *args, "train.compile=true", "--out", str(tmp_path / "compiled"), "--quiet"]) == 0
    eager = [r["loss"] for r in read_metrics(tmp_path / "eager") if r["split"] == "train_batch"]
    compiled = [r["loss"] for r in read_metrics(tmp_path / "compiled") if r["split"] == "train_batch"]
    assert compiled == pytest.approx(eager, rel=1e-4)


@pytest.mark.parametrize("engine", ["lone", "stacked"])
def test_training_lines_log_the_gradient_and_parameter_norms(tmp_path: Path, engine: str) -> None:
    """Each training line carries the global norm of its update's gradient and of the parameters after
    it (as the authors' code logs them), recomputed here from the same model and batch."""
    import copy

    cfg = load_config("sraven", [*tiny("sraven", steps=1)[1:], "train.log_every=1", "train.warmup_steps=0"])
    trainer = Trainer(cfg, tmp_path / "run", engine=engine, quiet=True)
    model_before, _ = trainer.engine._lone_run(0, 0)
    model_before = copy.deepcopy(model_before)
    data_gen = torch.Generator().set_state(trainer.engine.data_gens[0].get_state())
    trainer.run()
    trainer.close()
    (row,) = [r for r in read_metrics(tmp_path / "run") if r["split"] == "train_batch"]

    batch = trainer.task.sample(cfg.train.batch_size, "train", data_gen)
    out = model_before(batch.inputs, last_positions=trainer.task.num_output_positions).float()
    trainer.task.loss(out, batch).backward()
    grad_sq = sum(float(p.grad.double().pow(2).sum()) for p in model_before.parameters())
    assert row["loss"] == pytest.approx(float(trainer.task.loss(out, batch).detach()), rel=1e-6)
    assert row["grad_norm"] == pytest.approx(math.sqrt(grad_sq), rel=1e-6)
    final = load_checkpoint(latest_checkpoint(tmp_path / "run")).model
    param_sq = sum(
        float(w.double().pow(2).sum()) for k, w in final.items() if k in dict(model_before.named_parameters())
    )
    assert row["param_norm"] == pytest.approx(math.sqrt(param_sq), rel=1e-9)
    assert row["param_norm"] != pytest.approx(
        math.sqrt(sum(float(p.double().pow(2).sum()) for p in model_before.parameters())), rel=1e-9
    )


@pytest.mark.slow
@pytest.mark.compiled
@pytest.mark.parametrize("config", ["sraven", "fuzzy_logic"])
def test_fast_step_trains_the_paper_configs_with_attention_dropout(tmp_path: Path, config: str) -> None:
    """``train.fast=true`` (torch.compile here, as on a GPU) with the paper configs' attention dropout: the
    compiled forward draws the dropout mask of a layer whose query count differs from the other layers'
    (the last one computes only the answer positions), a size torch.compile may make symbolic."""
    args = [*tiny(config, steps=4, **{"model.num_layers": 2})[1:], "train.log_every=1", "model.attention_dropout=0.1"]
    out = tmp_path / "fast"
    assert main(["train", config, *args, "train.fast=true", "--out", str(out), "--quiet"]) == 0
    losses = [r["loss"] for r in read_metrics(out) if r["split"] == "train_batch"]
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)


#: the folder Inductor's compiles of this process write under (``cache_dir()``: every Inductor cache path starts
#: there), after the trainer's choice
PRINT_INDUCTOR_FOLDER = (
    "from torch._inductor.runtime.cache_dir_utils import cache_dir\n"
    "from hyla.train.engines.fast import keep_compiled_code_apart\n"
    "keep_compiled_code_apart()\n"
    "print(cache_dir())\n"
)


def test_compiled_code_is_kept_apart_per_cpu_dispatch(tmp_path: Path) -> None:
    """Code compiled under another ATen CPU capability than the one that filled Inductor's cache is not loaded
    (it crashed with SIGSEGV in a compiled backward): each dispatch gets its own folder, also in a child of a
    process whose Inductor already wrote its shared default into the environment."""
    own = torch.backends.cpu.get_cpu_capability().lower()
    other = "avx2" if own == "avx512" else "default"
    unset = (INDUCTOR_CACHE_ENV, "ATEN_CPU_CAPABILITY", "HYLA_CPU_MARCH")
    env = {k: v for k, v in os.environ.items() if k not in unset} | {"TMPDIR": str(tmp_path)}
    inherited = {INDUCTOR_CACHE_ENV: str(tmp_path / f"torchinductor_{getpass.getuser()}")}
    folders = set()
    for capability, parent in ((own, {}), (other, inherited)):  # one process each: the capability is fixed at start
        child = env | parent | {"ATEN_CPU_CAPABILITY": capability}
        done = subprocess.run([sys.executable, "-c", PRINT_INDUCTOR_FOLDER], env=child, capture_output=True, text=True)
        assert done.returncode == 0, f"ATEN_CPU_CAPABILITY={capability}: rc {done.returncode}\n{done.stderr[-2000:]}"
        folders.add(done.stdout.strip())
    shared = inherited[INDUCTOR_CACHE_ENV]
    assert folders == {f"{shared}-{own}-native", f"{shared}-{other}-native"}


def test_a_folder_the_user_named_for_compiled_code_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ours = f"{shared_inductor_cache()}-{cpu_dispatch_tag()}"
    for inherited in (shared_inductor_cache(), f"{shared_inductor_cache()}-avx2-x86-64-v3"):  # a parent's choices
        monkeypatch.setenv(INDUCTOR_CACHE_ENV, inherited)
        assert keep_compiled_code_apart() == ours == os.environ[INDUCTOR_CACHE_ENV]
    monkeypatch.setenv(INDUCTOR_CACHE_ENV, str(tmp_path / "mine"))
    assert keep_compiled_code_apart() == str(tmp_path / "mine") == os.environ[INDUCTOR_CACHE_ENV]


def test_a_compiled_run_compiles_into_its_cpu_dispatch_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer of a ``train.fast`` run points Inductor at its dispatch's folder before it compiles."""
    folders_at_compile: list[str | None] = []

    def compile_later(model: torch.nn.Module, **options: object) -> torch.nn.Module:
        folders_at_compile.append(os.environ.get(INDUCTOR_CACHE_ENV))
        return model

    monkeypatch.delenv(INDUCTOR_CACHE_ENV, raising=False)
    monkeypatch.setattr(torch, "compile", compile_later)
    Trainer(load_config("fuzzy_logic", [*tiny("fuzzy_logic")[1:], "train.fast=true"]), tmp_path / "run")
    assert folders_at_compile == [f"{shared_inductor_cache()}-{cpu_dispatch_tag()}"]


def initial_draw(args: list[str], path: Path) -> Path:
    """The weights a run of ``args`` starts from, saved as ``train.init_weights`` reads them."""
    from hyla.train.build import build_model, build_task
    from hyla.train.run.checkpoint import save_weights

    cfg = load_config(args[0], args[1:])
    save_weights(path, build_model(cfg, build_task(cfg)).state_dict())
    return path


def test_init_weights_replaces_the_initial_draw_and_nothing_else(tmp_path: Path) -> None:
    def train(name: str, args: list[str]) -> list[dict]:
        assert main(["train", *args, "--out", str(tmp_path / name), "--quiet"]) == 0
        return read_metrics(tmp_path / name)

    def plain(seed: int) -> list[str]:
        return tiny("sraven", steps=6, seed=seed, **{"model.attention": "hyla", "model.attention_dropout": 0.1})

    # a run given its own initial draw is the run itself: the data and dropout streams are untouched
    own = initial_draw(plain(0), tmp_path / "seed0.safetensors")
    assert train("given_own", [*plain(0), f"train.init_weights={own}"]) == train("plain", plain(0))
    # seed 0 from seed 7's draw is seed 7 on seed 0's data (dropout off: its stream follows the seed)
    no_dropout = {"model.attention": "hyla", "model.attention_dropout": 0}
    seed7 = initial_draw(tiny("sraven", seed=7, **no_dropout), tmp_path / "seed7.safetensors")
    swapped = train("swapped", tiny("sraven", steps=6, seed=0, **no_dropout, **{"train.init_weights": seed7}))
    data_seed0 = {"train.data_seed": ExperimentConfig(seed=0).data_seed}
    assert swapped == train("seed7_on_data0", tiny("sraven", steps=6, seed=7, **no_dropout, **data_seed0))
    assert swapped != train("seed0", tiny("sraven", steps=6, seed=0, **no_dropout))


def test_init_weights_errors_name_the_option(tmp_path: Path) -> None:
    def trainer(weights: Path, out: str) -> Trainer:
        return Trainer(load_config("sraven", [*tiny("sraven")[1:], f"train.init_weights={weights}"]), tmp_path / out)

    with pytest.raises(ValueError, match=r"train\.init_weights=.*no such file"):
        trainer(tmp_path / "none", "a")
    fuzzy = initial_draw(tiny("fuzzy_logic"), tmp_path / "fuzzy.safetensors")  # another task: other shapes
    with pytest.raises(ValueError, match=r"train\.init_weights=.*does not fit the model"):
        trainer(fuzzy, "b")
