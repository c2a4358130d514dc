"""The options that reproduce the authors' setup (smonsays/hypernetwork-attention), one test each, and the
paper configs that use them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hyla import Attention
from hyla.attention import functional as fn
from hyla.attention.position import RelativePositionBias
from hyla.cli import main
from hyla.models import Transformer, TransformerConfig
from hyla.tasks import FuzzyLogic
from hyla.train.build import build_task, build_tasks, sized_config
from hyla.train.config import load_config
from hyla.train.engines.optim import build_optimizer, decayed_parameter_names, lr_at
from hyla.train.loop import resume_differences
from hyla.train.run.checkpoint import latest_checkpoint
from hyla.train.sweeps import plan_groups
from tiny import tiny_overrides


# ----------------------------------------------------------------------------- 1. relative positions
def test_one_directional_buckets_put_later_keys_in_the_query_bucket() -> None:
    t = 32
    one_way = RelativePositionBias(8, num_buckets=t, max_distance=t, bidirectional=False)
    bias_HxQxK = one_way(t, t)
    for q in range(t):
        assert torch.equal(bias_HxQxK[:, q, q:], bias_HxQxK[:, q, q : q + 1].expand(-1, t - q))
    # past keys: exact buckets for distances below num_buckets // 2, then shared log-spaced buckets
    row = bias_HxQxK[0, t - 1]
    assert len(set(row[t - 16 :].tolist())) == 16 and len(set(row[: t - 16].tolist())) < t - 16
    two_way = RelativePositionBias(8, num_buckets=t, max_distance=t, bidirectional=True)(t, t)
    assert not torch.equal(two_way[:, 0, 1], two_way[:, 0, 0])

    model = Transformer(TransformerConfig(input_dim=3, output_dim=1, relative_position_bidirectional=False))
    assert all(not b.attn.relative_position.bidirectional for b in model.blocks)
    assert Transformer(TransformerConfig(input_dim=3)).blocks[0].attn.relative_position.bidirectional


# ----------------------------------------------------------------------------- 2. attention dropout
@pytest.mark.parametrize("preset", ["hyla", "softmax", "linear", "hyla_no_rmshead"])
def test_attention_dropout_drops_latent_pairs_shared_over_batch_and_heads(preset: str) -> None:
    torch.manual_seed(0)
    p = 0.3
    attn = Attention(16, 4, preset, dropout=p, relative_position=True, num_buckets=8, max_distance=8)
    plain = Attention(16, 4, preset)
    plain.load_state_dict({k: v for k, v in attn.state_dict().items() if "relative" not in k}, strict=False)
    x_BxTxD = torch.randn(3, 7, 16, requires_grad=True)

    attn.train()
    torch.manual_seed(5)
    y = attn(x_BxTxD)
    # by hand: the normalized code times one 1 x 1 x Q x K keep-mask / (1 - p), fed to the value network
    torch.manual_seed(5)
    q, k, v = attn.project(x_BxTxD)
    s = fn.attention_scores(q, k, attn.score_bias(7, 7, 0, None))
    a = fn.normalize_scores(s, attn.config.normalization)
    keep_11xQxK = torch.rand(1, 1, 7, 7) >= p
    hidden, _ = fn.value_network(a * keep_11xQxK / (1 - p), v, attn.config.value_network, attn.config.nonlinearity)
    expected = attn.out_proj(hidden.transpose(1, 2).reshape(3, 7, -1))
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-6)
    y.sum().backward()
    assert x_BxTxD.grad is not None and torch.isfinite(x_BxTxD.grad).all()

    attn.eval()  # no dropout at evaluation: the module without dropout's output
    no_drop = Attention(16, 4, preset, relative_position=True, num_buckets=8, max_distance=8)
    no_drop.load_state_dict(attn.state_dict())
    torch.testing.assert_close(attn(x_BxTxD), no_drop(x_BxTxD))


def test_attention_dropout_rate_and_validation() -> None:
    a = torch.ones(2, 3, 64, 64)
    torch.manual_seed(0)
    dropped = fn.drop_pairs(a, 0.25)
    assert torch.equal(dropped[0], dropped[1]) and torch.equal(dropped[:, 0], dropped[:, 2])
    assert abs((dropped[0, 0] == 0).float().mean().item() - 0.25) < 0.03
    torch.testing.assert_close(dropped.unique(), torch.tensor([0.0, 1 / 0.75]))
    with pytest.raises(ValueError, match="dropout must be in"):
        Attention(8, 2, dropout=1.0)
    with pytest.raises(ValueError, match="attention_dropout must be in"):
        Transformer(TransformerConfig(input_dim=3, attention_dropout=-0.1))


# ----------------------------------------------------------------------------- 3. and 4. the split
def test_authors_universe_reserves_the_last_terms_in_product_order() -> None:
    task = FuzzyLogic(holdout=0.7, num_unseen_terms=4, split_style="authors", split_seed=0)
    # product order over {0,1}^4 ends with x1 and x2 positive: our term ids with bits 0 and 1 set
    assert task.unseen_terms.tolist() == [3, 7, 11, 15]
    ids = {k: v.tolist() for k, v in task.task_ids.items()}
    assert (len(ids["train"]), len(ids["ood"]), len(ids["unseen_terms"])) == (20, 46, 6)
    combos = task.combinations
    assert not set(combos[ids["train"] + ids["ood"]].flatten().tolist()) & {3, 7, 11, 15}
    assert all(set(c) <= {3, 7, 11, 15} for c in combos[ids["unseen_terms"]].tolist())
    assert ids["test"] == ids["train"] and not set(ids["train"]) & set(ids["ood"])
    other = FuzzyLogic(holdout=0.7, num_unseen_terms=4, split_style="authors", split_seed=1)
    assert other.task_ids["ood"].tolist() != ids["ood"]
    # the library's own split: a cover of every seen term, random reserved terms
    cover = FuzzyLogic(holdout=0.7, num_unseen_terms=0)
    assert (len(cover.task_ids["train"]), len(cover.task_ids["ood"])) == (36, 84)
    assert set(cover.combinations[cover.task_ids["train"]].flatten().tolist()) == set(range(16))
    with pytest.raises(ValueError, match="split_style='nope' is not valid; allowed values: cover, authors"):
        FuzzyLogic(split_style="nope")


@pytest.mark.parametrize("task", ["fuzzy_logic", "sraven"])
def test_split_follows_the_seed_when_split_seed_is_null(task: str) -> None:
    def ood(*overrides: str) -> list[int]:
        return build_task(load_config(task, list(overrides))).task_ids["ood"].tolist()

    assert ood("seed=0") != ood("seed=1")  # the paper configs: split_seed null
    assert ood("seed=0", "data.split_seed=0") == ood("seed=1", "data.split_seed=0")
    assert ood("seed=1") == ood("seed=0", "data.split_seed=1")
    # runs whose splits differ stack all the same: each run keeps its own task in the stack
    tiny = tiny_overrides()
    cfgs = [load_config(task, [*tiny, "data.split_seed=null", f"seed={s}"]) for s in (0, 1)]
    assert plan_groups(cfgs) == [[0, 1]]
    tasks, task_of = build_tasks(cfgs)
    assert len(tasks) == 2 and task_of == [0, 1]
    assert [t.task_ids["ood"].tolist() for t in tasks] == [ood("seed=0"), ood("seed=1")]
    fixed = [load_config(task, [*tiny, f"seed={s}"]) for s in (0, 1)]  # tiny: split_seed 0, no dropout
    assert plan_groups(fixed) == [[0, 1]]


def test_hyla_data_config_exports_the_split_a_config_trains_on(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    def export(*args: str) -> int:
        return main(["data", "fuzzy-logic", "--config", "fuzzy_logic", *args, "--out", str(tmp_path / "x.npz")])

    for seed in (1, 2):
        assert export(f"seed={seed}", "--split", "ood", "--num", "400") == 0
        task_ids = set(np.load(tmp_path / "x.npz")["task_id"].tolist())
        expected = FuzzyLogic(holdout=0.7, num_unseen_terms=4, split_style="authors", split_seed=seed)
        assert task_ids <= set(expected.task_ids["ood"].tolist()) and len(task_ids) > 30
    assert export("--split", "unseen_terms", "--num", "50") == 0
    terms_NxKxL = np.load(tmp_path / "x.npz")["terms"]
    assert terms_NxKxL[:, :, :2].all()  # both terms of every problem have x1 and x2 positive
    assert export("--holdout", "0.5", "--split", "ood", "--num", "5") == 2
    err = capsys.readouterr().err
    assert "--holdout cannot be combined with --config; give it as an override (data.holdout=...)" in err
    assert main(["data", "sraven", "--config", "fuzzy_logic", "--split", "ood", "--num", "5", "--out", "x.npz"]) == 2
    assert "trains data.task=fuzzy_logic, not sraven" in capsys.readouterr().err


# ----------------------------------------------------------------------------- 5. initialization
def test_flax_init_is_lecun_normal_with_zero_biases() -> None:
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(input_dim=5, output_dim=1, emb_dim=256, mlp_dim=512, init="flax"))
    fc1 = model.blocks[0].ff.fc1
    std = fc1.weight.std().item()
    assert abs(std - 256**-0.5) / 256**-0.5 < 0.03
    assert fc1.weight.abs().max().item() <= 2 * 256**-0.5 / 0.8796 + 1e-6  # truncated at 2 std
    assert all(m.bias.abs().max() == 0 for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert abs(model.blocks[0].ff.fc2.weight.std().item() - 512**-0.5) / 512**-0.5 < 0.03
    torch.manual_seed(0)
    default = Transformer(TransformerConfig(input_dim=5, output_dim=1, emb_dim=256, mlp_dim=512))
    assert default.blocks[0].ff.fc1.bias.abs().max() > 0
    assert abs(default.blocks[0].ff.fc1.weight.std().item() - (3 * 256) ** -0.5) / (3 * 256) ** -0.5 < 0.03
    moe = Transformer(TransformerConfig(input_dim=5, moe_experts=3, init="flax")).blocks[0].ff
    assert abs(moe.w1_ExDxM.std().item() - 128**-0.5) / 128**-0.5 < 0.05 and moe.b1_ExM.abs().max() == 0


# ----------------------------------------------------------------------------- 6. and 7. the optimizer
def test_weight_decay_masks() -> None:
    model = Transformer(TransformerConfig(input_dim=5, num_layers=1, moe_experts=2))
    ndim = decayed_parameter_names(model, "ndim")
    authors = decayed_parameter_names(model, "authors")
    assert "blocks.0.attn.q_proj.bias" in authors - ndim and "blocks.0.attn.v_proj.bias" in authors
    assert {"blocks.0.ff.b1_ExM", "blocks.0.ff.b2_ExD"} <= ndim - authors
    for never in ("blocks.0.attn.out_proj.bias", "blocks.0.norm1.weight", "embed.bias", "readout.bias"):
        assert never not in authors | ndim
    cfg = load_config("fuzzy_logic_moe", ["model.num_layers=1"])
    opt = build_optimizer(model, cfg, torch.device("cpu"))
    decayed_ids = {id(p) for p in opt.param_groups[0]["params"]}
    assert decayed_ids == {id(p) for n, p in model.named_parameters() if n in authors}
    assert opt.param_groups[0]["weight_decay"] == 0.1 and opt.param_groups[1]["weight_decay"] == 0.0
    with pytest.raises(ValueError, match="allowed values: ndim, authors"):
        load_config("fuzzy_logic", ["train.weight_decay_mask=all"])


def test_cosine_end_follows_optax_with_decay_steps_minus_warmup() -> None:
    cfg = load_config("fuzzy_logic", ["train.steps=1000", "train.warmup_steps=100"])
    assert cfg.train.cosine_end == "steps_minus_warmup"
    for step in (0, 50, 100, 300, 450, 800, 900, 999):
        # optax.warmup_cosine_decay_schedule(0, lr, warmup, decay_steps=steps - warmup, end=0.1 lr)
        if step < 100:
            expected = 1e-3 * step / 100
        else:
            frac = min(step - 100, 800) / 800
            expected = 1e-4 + (1e-3 - 1e-4) * 0.5 * (1 + math.cos(math.pi * frac))
        assert lr_at(step, cfg) == pytest.approx(expected, rel=1e-12)
    ours = load_config("fuzzy_logic", ["train.steps=1000", "train.warmup_steps=100", "train.cosine_end=steps"])
    assert lr_at(900, ours) > 1.01e-4 and lr_at(1000, ours) == pytest.approx(1e-4)


def test_gelu_tanh_and_norm_eps_reach_the_modules() -> None:
    model = Transformer(TransformerConfig(input_dim=5, num_layers=1, gelu_approximate="tanh", norm_eps=1e-6))
    assert model.blocks[0].norm1.eps == 1e-6 and model.norm.eps == 1e-6
    x = torch.randn(4, 128)
    mlp = model.blocks[0].ff
    torch.testing.assert_close(mlp(x), mlp.fc2(F.gelu(mlp.fc1(x), approximate="tanh")))
    assert not torch.allclose(mlp(x), mlp.fc2(F.gelu(mlp.fc1(x))))


# ----------------------------------------------------------------------------- the paper configs
def test_paper_configs_follow_the_authors_code() -> None:
    for name in ("fuzzy_logic", "sraven", "fuzzy_logic_moe", "sraven_moe"):
        cfg = load_config(name)
        m, t = cfg.model, cfg.train
        assert (m.relative_position_bidirectional, m.attention_dropout, m.init) == (False, 0.1, "flax")
        assert (m.gelu_approximate, m.norm_eps) == ("tanh", 1e-6)
        assert (t.weight_decay_mask, t.cosine_end, cfg.data.split_seed) == ("authors", "steps_minus_warmup", None)
    fuzzy = load_config("fuzzy_logic").data
    assert (fuzzy.split_style, fuzzy.num_unseen_terms, fuzzy.holdout) == ("authors", 4, 0.7)
    assert load_config("fuzzy_logic_moe").train.moe_aux_weight == 0.0
    assert load_config("sraven_moe").train.moe_aux_weight == 0.0
    # the library's own defaults stay PyTorch's and the paper text's
    lib = TransformerConfig()
    assert (lib.init, lib.attention_dropout, lib.relative_position_bidirectional) == ("torch", 0.0, None)


LIBRARY_DEFAULTS = [
    "model.relative_position_bidirectional=null",
    "model.attention_dropout=0",
    "model.init=torch",
    "model.gelu_approximate=none",
    "model.norm_eps=1e-5",
    "train.weight_decay_mask=ndim",
    "train.cosine_end=steps",
    "data.split_style=cover",
]
NEW_KEYS = [o.split("=")[0].split(".") for o in LIBRARY_DEFAULTS]


@pytest.mark.float_sensitive
def test_a_checkpoint_from_before_the_new_options_still_resumes(tmp_path: Path) -> None:
    overrides = [*tiny_overrides(steps=8, every=4), *LIBRARY_DEFAULTS, "data.num_unseen_terms=0"]
    run, whole = tmp_path / "run", tmp_path / "whole"
    assert main(["train", "fuzzy_logic", *overrides, "--out", str(run), "--quiet", "--stop-at-step", "4"]) == 0
    state = latest_checkpoint(run) / "state.json"
    meta = json.loads(state.read_text())
    for section, key in NEW_KEYS:  # as a checkpoint written before these options existed
        del meta["config"][section][key]
    state.write_text(json.dumps(meta))
    assert main(["train", "fuzzy_logic", *overrides, "--out", str(run), "--quiet", "--resume"]) == 0
    assert main(["train", "fuzzy_logic", *overrides, "--out", str(whole), "--quiet"]) == 0
    assert (run / "metrics.jsonl").read_text() == (whole / "metrics.jsonl").read_text()
    # a missing key reads as the option's default, so a run with another value is refused
    cfg = load_config("fuzzy_logic", [*overrides, "model.attention_dropout=0.1"])
    cfg = sized_config(cfg, build_task(cfg))  # the task's sizes filled in, as the trainer compares
    assert resume_differences(meta["config"], cfg) == ["model.attention_dropout: checkpoint has 0.0, now 0.1"]
    # how a step is computed is not what it computes: a CPU run may continue on a GPU, as gpu_paper.sh does
    how = ["model.attention_backend=direct", "train.fast=true", "train.compile=true", "train.compile_mode=max-autotune"]
    cfg = load_config("fuzzy_logic", [*overrides, *how])
    assert resume_differences(meta["config"], sized_config(cfg, build_task(cfg))) == []
