"""Extract the latent code ``a[:, q, k]`` (all layers and heads) of a trained run at the pairs that matter.

SRAVEN. For answer slot ``i`` the query is token ``q = 8F + i`` (the i-th query token). That slot
holds canonical feature ``j = perm[n, 2, i]``, whose rule is ``rules[n, j]``. The relevant keys are
the same feature's two visible panels of the last row, (2, 0) and (2, 1): slot ``i_c`` with
``perm[n, c, i_c] == j``, token ``(2*3 + c)*F + i_c``. These are the pairs whose value networks must
compute the answer (the paper reads the code at "the final query token of a feature and the keys of
that feature's panels in the same row"). Codes: ``codes[n, i, layer, key, head]`` with key 0 =
panel (2, 0), key 1 = panel (2, 1); labels ``query_rule[n, i] = rules[n, perm[n, 2, i]]``.

Fuzzy logic. The query is the last token (the one whose y is predicted); the keys are the N-1 context
examples: ``codes[n, layer, key, head]``; ground truth ``terms[n, K, L]``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from hyla.tasks.sraven import RULE_NAMES
from hyla.train.loop import load_trained


def sraven_pairs(perm_NxGxF: torch.Tensor, num_features: int, grid_size: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """Query tokens ``(N, F)`` and relevant key tokens ``(N, F, G-1)`` for every answer slot."""
    n, g, f = perm_NxGxF.shape[0], grid_size, num_features
    last = g - 1
    feature_of_slot = perm_NxGxF[:, last]  # (N, F): canonical feature j of answer slot i
    queries = (g * g - 1) * f + torch.arange(f).expand(n, f)
    inverse = perm_NxGxF.argsort(-1)  # inverse[n, c, j] = slot of canonical feature j in column c
    keys = torch.stack([(last * g + c) * f + inverse[:, c].gather(1, feature_of_slot) for c in range(g - 1)], dim=-1)
    return queries, keys


@torch.no_grad()
def collect_latents(run_dir: str | Path, split: str, num: int = 2048, batch_size: int = 512, seed: int = 0) -> dict:
    """The documented arrays (see module docstring) for ``num`` problems of ``split``."""
    cfg, task, model = load_trained(run_dir)
    task.check_split(split)
    gen = torch.Generator().manual_seed(seed)
    parts: dict[str, list[np.ndarray]] = {}
    for start in range(0, num, batch_size):
        batch = task.sample(min(batch_size, num - start), split, gen)
        codes = torch.stack(model.latent_codes(batch.inputs), dim=1)  # (B, L, H, T, T)
        if cfg.data.task == "sraven":
            f = task.num_features
            q_tok, k_tok = sraven_pairs(batch.info["perm"], f, task.grid_size)
            b_idx = torch.arange(len(q_tok))[:, None, None]
            # codes[b, :, :, q, k] for q = q_tok[b, i], k = k_tok[b, i, c] -> (B, F, G-1, L, H)
            sel = codes.permute(0, 3, 4, 1, 2)[b_idx, q_tok[..., None], k_tok]
            query_rule = batch.info["rules"].gather(1, batch.info["perm"][:, -1])
            arrays = {
                "codes": sel.permute(0, 1, 3, 2, 4).numpy().astype(np.float32),  # (B, F, L, G-1, H)
                "query_rule": query_rule.numpy(),
                "rules": batch.info["rules"].numpy(),
                "perm": batch.info["perm"].numpy(),
                "task_id": batch.info["task_id"].numpy(),
                "query_tokens": q_tok.numpy(),
                "key_tokens": k_tok.numpy(),
            }
        else:
            t = codes.shape[-1]
            arrays = {
                "codes": codes[:, :, :, t - 1, : t - 1].permute(0, 1, 3, 2).numpy().astype(np.float32),  # (B, L, K, H)
                "terms": batch.info["terms"].numpy(),
                "task_id": batch.info["task_id"].numpy(),
            }
        for k, v in arrays.items():
            parts.setdefault(k, []).append(v)
    out = {k: np.concatenate(v) for k, v in parts.items()}
    out["task"] = np.array(cfg.data.task)
    out["split"] = np.array(split)
    out["attention"] = np.array(cfg.model.attention)
    if cfg.data.task == "sraven":
        out["rule_names"] = np.array(RULE_NAMES)
    return out


def save_latents(arrays: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.npz")
    np.savez_compressed(tmp, **arrays)
    tmp.replace(path)
    return path
