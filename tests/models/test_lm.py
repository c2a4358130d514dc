"""Causal language models: causality, cached decoding, generation, training through the CLI."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

from hyla.analysis.latents import collect_latents
from hyla.analysis.stats import mean_se
from hyla.attention import KVCache
from hyla.cli import main
from hyla.models import Transformer, TransformerConfig
from hyla.models.lm import LM_PRESETS, generate
from hyla.train.run.folder import load_trained


def tiny_lm(attention: str) -> Transformer:
    torch.manual_seed(0)
    preset = {
        **LM_PRESETS["lm-tiny"],
        "num_layers": 2,
        "emb_dim": 32,
        "num_heads": 4,
        "qk_dim": 32,
        "v_dim": 32,
        "mlp_dim": 64,
    }
    return Transformer(TransformerConfig(vocab_size=50, output_dim=50, attention=attention, **preset)).eval()


@pytest.mark.parametrize("attention", ["softmax", "linear", "hyla", "hyla_plus"])
def test_whole_model_is_causal(attention: str) -> None:
    model = tiny_lm(attention)
    tokens = torch.randint(0, 50, (2, 9))
    leaf = {}

    def grab(module, inputs, output):
        leaf["x"] = output.detach().requires_grad_(True)
        return leaf["x"]

    model.embed.register_forward_hook(grab)
    logits = model(tokens)
    for t in range(9):
        (grad,) = torch.autograd.grad(logits[:, t].sum(), leaf["x"], retain_graph=True)
        assert torch.all(grad[:, t + 1 :] == 0) and grad[:, : t + 1].abs().sum() > 0


@pytest.mark.parametrize("attention", ["softmax", "linear", "hyla", "hyla_plus"])
def test_cached_decoding_equals_full_recomputation(attention: str) -> None:
    model = tiny_lm(attention)
    tokens = torch.randint(0, 50, (2, 12))
    with torch.no_grad():
        full = model(tokens)
        caches = [KVCache() for _ in model.blocks]
        steps = [model(tokens[:, :5], caches=caches)]
        steps += [model(tokens[:, t : t + 1], caches=caches) for t in range(5, 12)]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_greedy_generation_matches_argmax_of_full_forward() -> None:
    model = tiny_lm("hyla")
    prompt = [3, 14, 15, 9]
    out = generate(model, prompt, 6, temperature=0)
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(6):
            seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
    assert out == seq[len(prompt) :]
    sampled = generate(model, prompt, 6, temperature=1.0, top_k=5, seed=1)
    assert len(sampled) == 6 and sampled == generate(model, prompt, 6, temperature=1.0, top_k=5, seed=1)


def write_corpus(root: Path) -> Path:
    root.mkdir()
    for i in range(40):
        (root / f"f{i}.py").write_text("\n".join(f"def f{i}_{j}(x):\n    return x + {j}" for j in range(30)))
    return root


LM_TINY = [
    "model.num_layers=1",
    "model.emb_dim=32",
    "model.num_heads=2",
    "model.qk_dim=32",
    "model.v_dim=32",
    "model.mlp_dim=64",
    "data.vocab_size=300",
    "data.seq_len=32",
    "data.val_fraction=0.1",
    "train.steps=6",
    "train.batch_size=8",
    "train.eval_every=3",
    "train.eval_size=16",
    "train.eval_batch_size=8",
    "train.log_every=2",
    "train.checkpoint_every=3",
    "train.warmup_steps=1",
]


@pytest.mark.float_sensitive
def test_lm_trains_resumes_exactly_and_generates(tmp_path: Path, capsys) -> None:
    args = ["lm_tiny", f"data.corpus={write_corpus(tmp_path / 'c')}", *LM_TINY]
    assert main(["train", *args, "--out", str(tmp_path / "a"), "--quiet"]) == 0
    rows = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert {r["split"] for r in rows} == {"train_batch", "train", "val"}
    # a split's perplexity is exp of its mean loss per token, not the mean of per-sequence perplexities
    assert all(r["ppl"] == pytest.approx(math.exp(r["loss"]), rel=1e-12) for r in rows)
    assert (tmp_path / "a" / "tokenizer.json").is_file()
    assert main(["train", *args, "--out", str(tmp_path / "b"), "--quiet", "--stop-at-step", "4"]) == 0
    assert main(["train", *args, "--out", str(tmp_path / "b"), "--quiet", "--resume"]) == 0
    # Both runs train in this one process on this machine, so an exact resume is bit for bit: every row
    # (every split, step and number, and how many rows) is the same byte for byte.
    assert (tmp_path / "a" / "metrics.jsonl").read_bytes() == (tmp_path / "b" / "metrics.jsonl").read_bytes()
    capsys.readouterr()
    prompt = "def f1"
    command = ["generate", str(tmp_path / "a"), "--prompt", prompt, "--max-new-tokens", "8", "--temperature", "0"]
    assert main(command) == 0
    assert capsys.readouterr().out == prompt + greedy_continuation(tmp_path / "a", prompt, 8) + "\n"
    with pytest.raises(ValueError, match=f"^{re.escape(str(tmp_path / 'a'))}: latent codes are extracted for"):
        collect_latents(tmp_path / "a", "test", num=2)  # the error names the run, not only its task


def greedy_continuation(run_dir: Path, prompt: str, max_new_tokens: int) -> str:
    """The trained model's greedy continuation, recomputed over the whole sequence at every step (no cache):
    the obviously correct reference for ``hyla generate --temperature 0``."""
    _path, _cfg, task, model, _weights, _step = load_trained(run_dir)
    ids = task.encode(prompt)
    new: list[int] = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            new.append(int(model(torch.tensor([ids + new]))[0, -1].argmax()))
            if new[-1] == task.eos_id:
                break
    continuation = task.decode(new)
    assert continuation.strip(), "the greedy continuation is empty: comparing against it would prove nothing"
    return continuation


def test_lm_seeds_train_one_by_one_and_report_reads_them(tmp_path: Path, capsys) -> None:
    args = ["lm_tiny", f"data.corpus={write_corpus(tmp_path / 'c')}", *LM_TINY, "--seeds", "0,1", "--quiet"]
    assert main(["train", *args, "--out", str(tmp_path / "lm")]) == 0
    assert "language-model runs are trained one by one" in capsys.readouterr().out
    finals = [json.loads((tmp_path / "lm" / f"seed{s}" / "metrics.jsonl").read_text().splitlines()[-1]) for s in (0, 1)]
    assert finals[0]["split"] == "val" and finals[0]["loss"] != finals[1]["loss"]
    runs = [str(tmp_path / "lm" / f"seed{s}") for s in (0, 1)]
    assert main(["report", *runs, "--out", str(tmp_path / "report")]) == 0
    m, se = mean_se([math.exp(f["loss"]) for f in finals])
    assert f"| hyla | 2 | {6 * 8 * 32 / 1e6:.2f}M | {m:.2f} +- {se:.2f} |" in capsys.readouterr().out


@pytest.mark.float_sensitive
def test_gradient_accumulation_gives_the_same_updates(tmp_path: Path) -> None:
    args = ["lm_tiny", f"data.corpus={write_corpus(tmp_path / 'c')}", *LM_TINY]
    assert main(["train", *args, "--out", str(tmp_path / "one"), "--quiet"]) == 0
    assert main(["train", *args, "train.grad_accum_steps=2", "--out", str(tmp_path / "two"), "--quiet"]) == 0
    one = [json.loads(x) for x in (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()]
    two = [json.loads(x) for x in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    assert len(one) == len(two) == 7  # train_batch at 2, 4, 6; train and val at 3 and 6
    for a, b in zip(one, two):
        assert a.keys() == b.keys() and (a["step"], a["split"]) == (b["step"], b["split"])
        # Not bit for bit: two half-batches sum the gradient in another order. That moves float32 results
        # by a few ulps (measured: relative 1e-7 at most after 6 steps); a micro-batch lost or counted twice
        # would move them by far more.
        assert {k: v for k, v in a.items() if k not in ("step", "split")} == pytest.approx(
            {k: v for k, v in b.items() if k not in ("step", "split")}, rel=1e-5
        )


def test_scaled_tied_logits_are_the_tied_logits_over_sqrt_width() -> None:
    preset = {**LM_PRESETS["lm-wiki"], "num_layers": 2, "attention_dropout": 0.0}
    torch.manual_seed(0)
    scaled = Transformer(TransformerConfig(vocab_size=50, output_dim=50, attention="hyla", **preset)).eval()
    plain = Transformer(
        TransformerConfig(vocab_size=50, output_dim=50, attention="hyla", **{**preset, "scale_tied_logits": False})
    ).eval()
    plain.load_state_dict(scaled.state_dict())
    tokens = torch.randint(0, 50, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(scaled(tokens), plain(tokens) / math.sqrt(preset["emb_dim"]))
    with pytest.raises(ValueError, match="scale_tied_logits needs tie_embeddings"):
        TransformerConfig(vocab_size=50, output_dim=50, scale_tied_logits=True).validate()


def test_the_lm_wiki_config_builds_the_lm_wiki_preset() -> None:
    from hyla.train.config import load_config

    model = load_config("lm_wiki", []).model
    for key, value in LM_PRESETS["lm-wiki"].items():
        assert getattr(model, key) == value, key


@pytest.mark.parametrize(
    "attention, key_normalization",
    [("softmax", "none"), ("linear", "none"), ("hyla", "none"), ("linear", "count"), ("hyla", "count")],
)
def test_lm_wiki_trains_every_variant_and_loss_falls(tmp_path: Path, attention: str, key_normalization: str) -> None:
    """The authors' preset (dropout, relative positions, flax init, scaled tied logits) at LM_TINY's widths."""
    settings = [f"model.attention={attention}", f"model.key_normalization={key_normalization}", "train.lr=0.01"]
    run = tmp_path / "run"
    args = ["lm_wiki", f"data.corpus={write_corpus(tmp_path / 'c')}", *LM_TINY, *settings]
    assert main(["train", *args, "train.steps=12", "--out", str(run), "--quiet"]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if r["split"] == "train_batch"]
    assert losses[-1] < losses[0]
    _path, _cfg, _task, model, _weights, _step = load_trained(run)
    assert model.blocks[0].attn.config.key_normalization == key_normalization
    assert model.blocks[0].attn.dropout == 0.1 and model.cfg.scale_tied_logits
