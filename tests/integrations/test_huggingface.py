"""``attn_implementation="hyla"`` in HuggingFace models built from their configs: a tiny GPT-2 and a Llama-style
model (grouped-query heads) train on the CPU, and cached generation equals uncached generation."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from hyla.integrations import huggingface as hyla_hf  # noqa: E402

VOCAB = 40


def tiny_config(kind: str) -> transformers.PretrainedConfig:
    if kind == "gpt2":
        return transformers.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4)
    return transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )


def model_for(kind: str, implementation: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(tiny_config(kind), attn_implementation=implementation)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_a_hyla_model_trains_and_generates_alike_with_and_without_its_cache(kind: str) -> None:
    name = hyla_hf.register()
    model = model_for(kind, name)
    data = torch.randint(0, VOCAB, (8, 16), generator=torch.Generator().manual_seed(1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = model(input_ids=data, labels=data).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]
    model.eval()
    prompt, padded = data[:2, :5], torch.ones(2, 5, dtype=torch.long)
    cached = model.generate(prompt, attention_mask=padded, max_new_tokens=6, do_sample=False, use_cache=True)
    uncached = model.generate(prompt, attention_mask=padded, max_new_tokens=6, do_sample=False, use_cache=False)
    assert torch.equal(cached, uncached)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_with_softmax_the_implementation_computes_what_sdpa_does(kind: str) -> None:
    """The adapter itself (heads, grouped keys, scaling, masks with left padding) against transformers' SDPA."""
    name = hyla_hf.register("hyla_softmax_test", attention="softmax")
    ours, theirs = model_for(kind, name).eval(), model_for(kind, "sdpa").eval()
    ids = torch.randint(0, VOCAB, (3, 12), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, :4] = 0  # left padding
    with torch.no_grad():
        a, b = (m(input_ids=ids, attention_mask=mask).logits for m in (ours, theirs))
    keep = mask.bool()
    assert torch.allclose(a[keep], b[keep], atol=1e-5, rtol=1e-4)


def test_a_hyla_models_prefix_never_sees_what_follows() -> None:
    model = model_for("llama", hyla_hf.register()).eval()
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(3))
    changed = ids.clone()
    changed[:, 8:] = (changed[:, 8:] + 1) % VOCAB
    with torch.no_grad():
        a, b = model(input_ids=ids).logits, model(input_ids=changed).logits
    assert torch.allclose(a[:, :8], b[:, :8], atol=1e-6) and not torch.allclose(a[:, 8:], b[:, 8:])
