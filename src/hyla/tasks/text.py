"""Language modeling on real text: corpora, a BPE tokenizer, packed sequences, a ``Task``.

Corpora (``data.corpus``):

* ``stdlib`` (default, offline): the ``.py`` files of the running Python's standard library, sorted by
  path (every machine has it);
* a path to a text file or a folder (every ``*.txt``, ``*.md``, ``*.py``, ``*.rst`` below it, sorted,
  leaving out ``site-packages`` folders below it; a ``site-packages`` folder itself, e.g. a GPU
  machine's with torch, triton and jax, is a code corpus several times the standard library's);
* ``hf:<name>``: a Hugging Face dataset through ``datasets.load_dataset(name, data.dataset_config,
  split=data.dataset_split, streaming=True, data_files=data.data_files)``, reading ``data.text_field``
  (e.g. ``hf:allenai/c4`` with config ``en``, or ``hf:wikitext`` with ``wikitext-103-raw-v1``; ``hf:text``
  with ``data_files`` reads local text files the same way).

At most ``data.max_documents`` documents are read. A document goes to validation when the first
8 bytes of its SHA-1 (as an integer, mod 10^6) fall below ``val_fraction * 10^6``: deterministic,
independent of order, and a validation document never appears in training. Each split's documents
are tokenized (byte-level BPE trained on the *training* documents, vocabulary ``data.vocab_size``,
saved as ``tokenizer.json`` in the run directory), joined with an end-of-document token, and packed
into one token array. A batch is ``batch_size`` windows of ``seq_len + 1`` tokens at offsets drawn
from the data generator: the stream's position *is* the generator state, which the checkpoint holds,
so resumption is exact (random windows instead of sequential epochs).
"""

from __future__ import annotations

import hashlib
import math
import sysconfig
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from hyla.tasks.base import Batch, Task

EOS = "<eos>"
TEXT_SUFFIXES = (".txt", ".md", ".py", ".rst")


def iter_documents(
    corpus: str,
    max_documents: int,
    *,
    dataset_config: str | None = None,
    dataset_split: str = "train",
    data_files: str | None = None,
    text_field: str = "text",
) -> Iterator[str]:
    """Yield up to ``max_documents`` non-empty documents of the corpus (see module docstring)."""
    count = 0

    def emit(text: str) -> bool:
        nonlocal count
        if text.strip():
            count += 1
            return True
        return False

    if corpus.startswith("hf:"):
        import datasets

        ds = datasets.load_dataset(
            corpus[3:], dataset_config, split=dataset_split, streaming=True, data_files=data_files
        )
        for row in ds:
            if text_field not in row:
                raise ValueError(f"data.text_field={text_field!r} is not a column of {corpus}; columns: {list(row)}")
            if emit(row[text_field]):
                yield row[text_field]
            if count >= max_documents:
                return
        return
    root = Path(sysconfig.get_paths()["stdlib"]) if corpus == "stdlib" else Path(corpus)
    if not root.exists():
        raise ValueError(f"data.corpus={corpus!r}: no such file or folder (or use 'stdlib' or 'hf:<dataset>')")
    # below the corpus folder, installed packages are not part of it (the stdlib folder holds site-packages);
    # a corpus folder that is itself a site-packages (a larger offline code corpus) is read whole
    files = (
        [root]
        if root.is_file()
        else sorted(
            p
            for p in root.rglob("*")
            if p.suffix in TEXT_SUFFIXES and p.is_file() and "site-packages" not in p.relative_to(root).parts
        )
    )
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        if emit(text):
            yield text
        if count >= max_documents:
            return


def is_validation(text: str, val_fraction: float) -> bool:
    h = int.from_bytes(hashlib.sha1(text.encode("utf-8")).digest()[:8], "big")
    return h % 1_000_000 < val_fraction * 1_000_000


def train_tokenizer(documents: list[str], vocab_size: int):
    """Byte-level BPE (Hugging Face ``tokenizers``): lossless on any text, ``EOS`` as a special token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(documents, trainer)
    return tok


@dataclass
class TextOptions:
    """The ``data.*`` options of ``data.task=text``."""

    corpus: str = "stdlib"  # stdlib | a file or folder | hf:<dataset name>
    dataset_config: str | None = None  # hf: the dataset's configuration (e.g. en for C4)
    dataset_split: str = "train"  # hf
    data_files: str | None = None  # hf: e.g. local files for hf:text
    text_field: str = "text"  # hf: the column holding the text
    max_documents: int = 2000
    vocab_size: int = 4096  # BPE vocabulary
    seq_len: int = 256  # tokens per training sequence
    val_fraction: float = 0.05  # documents held out for validation (by content hash)


class TextTask(Task):
    name = "text"
    options = TextOptions
    primary_metric = "ppl"
    eval_splits = ("val",)
    num_output_positions = None
    token_inputs = True

    @classmethod
    def from_options(cls, options: TextOptions, split_seed: int, run_dir: Path | None = None) -> TextTask:
        """The tokenizer saved in ``run_dir`` is reused when there is one (a resumed or analysed run)."""
        return cls(options, None if run_dir is None else Path(run_dir) / "tokenizer.json")

    def model_sizes(self) -> dict[str, Any]:
        return {"input_dim": None, "vocab_size": self.vocab_size, "output_dim": self.vocab_size, "causal": True}

    def __init__(self, data: Any, tokenizer_path: Path | None = None) -> None:
        if data.seq_len < 2:
            raise ValueError(f"data.seq_len must be >= 2, got {data.seq_len}")
        if not 0 < data.val_fraction < 1:
            raise ValueError(f"data.val_fraction must be in (0, 1), got {data.val_fraction}")
        if data.vocab_size < 300:
            raise ValueError(f"data.vocab_size must be >= 300 (256 byte symbols + merges), got {data.vocab_size}")
        started = time.perf_counter()
        self.corpus = data.corpus
        docs = list(
            iter_documents(
                data.corpus,
                data.max_documents,
                dataset_config=data.dataset_config,
                dataset_split=data.dataset_split,
                data_files=data.data_files,
                text_field=data.text_field,
            )
        )
        self.documents = {"train": [d for d in docs if not is_validation(d, data.val_fraction)]}
        self.documents["val"] = [d for d in docs if is_validation(d, data.val_fraction)]
        for split, ds in self.documents.items():
            if not ds:
                raise ValueError(
                    f"the corpus {data.corpus!r} gave no {split} documents ({len(docs)} read); "
                    "raise data.max_documents or change data.val_fraction"
                )
        if tokenizer_path is not None and tokenizer_path.is_file():
            from tokenizers import Tokenizer

            self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        else:
            self.tokenizer = train_tokenizer(self.documents["train"], data.vocab_size)
        self.eos_id = self.tokenizer.token_to_id(EOS)
        self.vocab_size = self.tokenizer.get_vocab_size()
        self.seq_len = data.seq_len
        self.input_dim, self.output_dim = 0, self.vocab_size
        self.tokens = {split: self._pack(ds) for split, ds in self.documents.items()}
        for split, toks in self.tokens.items():
            if len(toks) <= self.seq_len + 1:
                raise ValueError(
                    f"the {split} split has {len(toks)} tokens, fewer than data.seq_len + 2; "
                    "raise data.max_documents or lower data.seq_len"
                )
        self._device_tokens: dict[tuple[str, torch.device], Tensor] = {}
        self.build_seconds = time.perf_counter() - started

    def describe(self) -> str:
        docs, toks = self.documents, self.tokens
        return (
            f"corpus {self.corpus}: {len(docs['train']):,} train / {len(docs['val']):,} val documents, "
            f"{len(toks['train']):,} / {len(toks['val']):,} tokens, vocabulary {self.vocab_size:,} "
            f"(read and tokenized in {self.build_seconds:.0f} s)"
        )

    def _pack(self, documents: list[str]) -> Tensor:
        ids: list[int] = []
        for enc in self.tokenizer.encode_batch(documents):
            ids.extend(enc.ids)
            ids.append(self.eos_id)
        return torch.tensor(ids, dtype=torch.long)

    def save_tokenizer(self, path: Path) -> None:
        self.tokenizer.save(str(path))

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def sample(self, batch_size: int, split: str, generator: torch.Generator) -> Batch:
        self.check_split(split)
        key = (split, generator.device)
        if key not in self._device_tokens:
            self._device_tokens[key] = self.tokens[split].to(generator.device)
        tokens = self._device_tokens[key]
        starts = torch.randint(
            len(tokens) - self.seq_len - 1, (batch_size, 1), generator=generator, device=generator.device
        )
        windows = tokens[starts + torch.arange(self.seq_len + 1, device=generator.device)]
        return Batch(windows[:, :-1], windows[:, 1:], {"start": starts[:, 0]})

    def summarize(self, means: dict[str, float]) -> dict[str, float]:
        """Perplexity of the whole split: exp(mean loss per token); every sequence has ``seq_len`` tokens,
        so the mean of the sequences' mean losses is the mean over tokens."""
        return {**means, "ppl": math.exp(means["loss"])} if "loss" in means else means

    def loss(self, outputs_BxTxO: Tensor, batch: Batch) -> Tensor:
        return F.cross_entropy(outputs_BxTxO.reshape(-1, outputs_BxTxO.shape[-1]), batch.targets.reshape(-1))

    def metrics(self, outputs_BxTxO: Tensor, batch: Batch) -> dict[str, Tensor]:
        """Per sequence: ``loss`` (mean token cross-entropy, nats) and ``ppl`` = exp(loss); a split's
        perplexity is exp of its mean loss (``summarize``), not the mean of the sequences' ``ppl``."""
        ce = F.cross_entropy(outputs_BxTxO.transpose(1, 2), batch.targets, reduction="none").mean(1)
        return {"loss": ce, "ppl": ce.exp(), "bits_per_token": ce / math.log(2)}
