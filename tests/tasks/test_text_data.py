"""Text data: tokenizer round trip, document-level split without leaks, the datasets path, packing."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from hyla.tasks.text import TextTask, is_validation, iter_documents
from hyla.train.config import DataConfig


def corpus(tmp_path: Path, n: int = 60) -> Path:
    root = tmp_path / "corpus"
    root.mkdir()
    for i in range(n):
        body = " ".join(f"word{(i * 7 + j) % 50}" for j in range(80))
        (root / f"doc{i:03d}.txt").write_text(f"MARKER{i:03d}X {body}\n")
    return root


def data_config(root: Path | str, **kw: object) -> DataConfig:
    base = DataConfig(task="text", corpus=str(root), vocab_size=400, seq_len=32, val_fraction=0.2, max_documents=1000)
    return replace(base, **kw)


def test_tokenizer_round_trip(tmp_path: Path) -> None:
    task = TextTask(data_config(corpus(tmp_path)))
    for text in ("def f(x):\n    return x ** 2  # é ü 你好", "MARKER007X word3 word4", "   \t\n"):
        assert task.decode(task.encode(text)) == text
    task.save_tokenizer(tmp_path / "tok.json")
    again = TextTask(data_config(tmp_path / "corpus"), tmp_path / "tok.json")
    assert again.encode("word1 word2") == task.encode("word1 word2")


def test_no_validation_document_leaks_into_training(tmp_path: Path) -> None:
    task = TextTask(data_config(corpus(tmp_path)))
    val_markers = {d.split()[0] for d in task.documents["val"]}
    train_markers = {d.split()[0] for d in task.documents["train"]}
    assert val_markers and train_markers and not val_markers & train_markers
    assert len(val_markers) + len(train_markers) == 60
    train_text = task.decode(task.tokens["train"].tolist())
    assert not any(m in train_text for m in val_markers)
    assert all(m in train_text for m in train_markers)
    assert all(is_validation(d, 0.2) for d in task.documents["val"])  # by content, not by position


def test_windows_are_shifted_and_deterministic(tmp_path: Path) -> None:
    task = TextTask(data_config(corpus(tmp_path)))
    a = task.sample(4, "train", torch.Generator().manual_seed(0))
    b = task.sample(4, "train", torch.Generator().manual_seed(0))
    assert a.inputs.shape == (4, 32) and torch.equal(a.inputs, b.inputs)
    assert torch.equal(a.inputs[:, 1:], a.targets[:, :-1])
    start = int(a.info["start"][0])
    assert torch.equal(a.inputs[0], task.tokens["train"][start : start + 32])


def test_datasets_code_path_on_local_text_files(tmp_path: Path) -> None:
    root = corpus(tmp_path, n=30)
    files = str(root / "*.txt")
    docs = list(iter_documents("hf:text", 10, data_files=files))
    assert len(docs) == 10 and all(d.startswith("MARKER") for d in docs)
    task = TextTask(data_config("hf:text", data_files=files, max_documents=30))
    assert len(task.documents["train"]) + len(task.documents["val"]) == 30
    n_train, n_val = len(task.documents["train"]), len(task.documents["val"])
    assert task.describe().startswith(
        f"corpus hf:text: {n_train} train / {n_val} val documents, "
        f"{len(task.tokens['train']):,} / {len(task.tokens['val']):,} tokens, vocabulary {task.vocab_size}"
    )
    with pytest.raises(ValueError, match=r"data\.text_field='content' is not a column"):
        list(iter_documents("hf:text", 5, data_files=files, text_field="content"))


def test_folder_corpus_leaves_out_installed_packages_below_it_but_reads_a_site_packages_folder(
    tmp_path: Path,
) -> None:
    packages = tmp_path / "lib" / "site-packages"
    for folder, name in ((tmp_path / "lib", "own.py"), (packages / "pkg", "mod.py"), (packages, "top.txt")):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(f"MARKER {name}\n")
    assert list(iter_documents(str(tmp_path / "lib"), 10)) == ["MARKER own.py\n"]
    assert list(iter_documents(str(packages), 10)) == ["MARKER mod.py\n", "MARKER top.txt\n"]


def test_stdlib_corpus_is_available_offline() -> None:
    docs = list(iter_documents("stdlib", 5))
    assert len(docs) == 5 and all(len(d) > 0 for d in docs)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"corpus": "/no/such/folder"}, "data.corpus='/no/such/folder': no such file or folder"),
        ({"seq_len": 100000}, "fewer than data.seq_len"),
        ({"vocab_size": 100}, "data.vocab_size must be >= 300"),
        ({"val_fraction": 0.0}, "data.val_fraction must be in"),
    ],
)
def test_bad_text_configs(tmp_path: Path, kw: dict, match: str) -> None:
    root = corpus(tmp_path, n=20)
    with pytest.raises(ValueError, match=match):
        TextTask(data_config(kw.pop("corpus", root), **kw))
