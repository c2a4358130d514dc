"""Extract the latent code ``a[:, q, k]`` (all layers and heads) of a trained run at the pairs that matter.

SRAVEN (G = 3, F features, token ``(r*G + c)*F + i`` = panel (r, c), slot i; the last F tokens are the
queries of the answer panel (2, 2)). For answer slot ``i`` the query is token ``q = 8F + i``. Slot i of
the answer panel holds canonical feature ``j = perm[n, 2, i]`` (``grid[n, r, c, i] = canonical[n, r, c,
perm[n, c, i]]``), so its rule is ``rules[n, j]``. The relevant keys are the *same canonical feature* in
the two visible panels of the last row, (2, 0) and (2, 1): in column c it sits in slot ``i_c`` with
``perm[n, c, i_c] == j`` (``i_c = argsort(perm[n, c])[j]``), token ``(2*G + c)*F + i_c``. Why these:
the answer value of feature j follows from that feature's values in the same row under its rule, so
these are the (q, k) pairs whose generated value networks must carry the rule; the paper reads the
code at "the final query token of a feature and the keys of that feature's panels in the same row".

Fuzzy logic (one token per example (x_t, y_t), the last one's y zeroed): the query is the last token
(whose y is predicted), the keys are the N-1 context examples.

Arrays (as returned by ``collect_latents`` and stored by ``hyla analyze latents`` in a ``.npz``):

=============  ============================  ==================================================
task           key                           content
=============  ============================  ==================================================
sraven         ``codes`` float32             (N, F, layers, 2, H): ``a[h, q, k]`` for answer slot i,
                                             key 0 = panel (2, 0), key 1 = panel (2, 1)
sraven         ``query_rule`` int64          (N, F): rule of answer slot i, ``rules[n, perm[n, 2, i]]``
sraven         ``rules`` int64               (N, F): rule per canonical feature (sorted multiset)
sraven         ``perm`` int64                (N, 3, F): the problem's feature permutation per column
sraven         ``query_tokens`` int64        (N, F): q of each answer slot (``8F + i``)
sraven         ``key_tokens`` int64          (N, F, 2): k of each answer slot, panels (2, 0), (2, 1)
sraven         ``rule_names`` str            (8,): names of the rule ids
fuzzy_logic    ``codes`` float32             (N, layers, N_examples - 1, H): ``a[h, T-1, k]``
fuzzy_logic    ``terms`` bool                (N, K, L): True where the literal is x_i, else 1 - x_i
both           ``task_id`` int64             (N,): index of the task (rule multiset / term combination)
both           ``task``, ``split``,          0-d str: the run's task, the split sampled, the attention
               ``attention``, ``weights``    preset, the weights read (``final`` or ``checkpoint at step N``)
=============  ============================  ==================================================
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from hyla.tasks import REGISTRY, task_entry
from hyla.tasks.sraven import sraven_pairs
from hyla.train.run.folder import TrainedRun, load_trained

__all__ = ["collect_latents", "save_latents", "sraven_pairs"]


@torch.no_grad()
def collect_latents(
    run: str | Path | TrainedRun, split: str, num: int = 2048, batch_size: int = 256, seed: int = 0
) -> dict[str, np.ndarray]:
    """The documented arrays (see module docstring) for ``num`` problems of ``split``.

    ``run``: a run directory (its trained model is read, ``load_trained``) or a
    model already read from one, so that several splits see the same weights. Problems come from
    ``torch.Generator().manual_seed(seed)`` in batches of ``batch_size`` (so the same arguments give the
    same problems); the model runs on the CPU."""
    if num < 1:
        raise ValueError(f"num={num} must be >= 1")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    run_dir, cfg, task, model, weights, _step = run if isinstance(run, TrainedRun) else load_trained(run)
    if task_entry(cfg.data.task).latent_probe is None:
        analysed = " and ".join(name for name, entry in REGISTRY.items() if entry.latent_probe)
        raise ValueError(f"{run_dir}: latent codes are extracted for {analysed} runs, not {cfg.data.task!r} ones")
    task.check_split(split)
    gen = torch.Generator().manual_seed(seed)
    parts: dict[str, list[np.ndarray]] = {}
    for start in range(0, num, batch_size):
        batch = task.sample(min(batch_size, num - start), split, gen)
        codes = torch.stack(model.latent_codes(batch.inputs), dim=1)  # (B, L, H, T, T)
        for k, v in task.latent_arrays(codes, batch).items():
            parts.setdefault(k, []).append(v)
    out = {k: np.concatenate(v) for k, v in parts.items()}
    out["task"] = np.array(cfg.data.task)
    out["split"] = np.array(split)
    out["attention"] = np.array(cfg.model.attention)
    out["weights"] = np.array(weights)
    return out | task.constant_arrays()


def save_latents(arrays: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.npz")
    np.savez_compressed(tmp, **arrays)
    tmp.replace(path)
    return path
