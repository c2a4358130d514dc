"""Topographic similarity of the latent code: do similar tasks get similar codes?

A problem's code is the concatenation, over canonical features j = 0..F-1, of the code of the answer
slot holding feature j (so position j always carries the rule ``rules[n, j]``); a task's code is the
mean over its problems. Topographic similarity = Spearman correlation between the pairwise Euclidean
distances of task codes and pairwise task distances, over all task pairs in the sample.

Task distances between rule tuples ``r, s`` (sorted multisets, aligned by canonical feature):

* ``slots``: the number of features whose rules differ, ``sum_j [r_j != s_j]``;
* ``semantic``: like ``slots`` but two progressions count 0.5 apart (one family: +-1, +-2), and
  addition/subtraction 0.5 apart (arithmetic); any other difference counts 1.

The p-value is a permutation test: task labels are shuffled against codes ``permutations`` times;
``p = (1 + #{shuffled rho >= observed rho}) / (1 + permutations)``.
"""

from __future__ import annotations

import numpy as np
from scipy.spatial.distance import pdist, squareform
from scipy.stats import spearmanr

RULE_FAMILY = np.array([0, 1, 1, 1, 1, 2, 2, 3])  # constant | progressions | arithmetic | distribute_three
TASK_DISTANCES = ("slots", "semantic")


def task_distance_matrix(rules_TxF: np.ndarray, kind: str) -> np.ndarray:
    if kind not in TASK_DISTANCES:
        raise ValueError(f"kind={kind!r} is not valid; allowed values: {', '.join(TASK_DISTANCES)}")
    differ = rules_TxF[:, None, :] != rules_TxF[None, :, :]
    if kind == "slots":
        return differ.sum(-1).astype(float)
    fam = RULE_FAMILY[rules_TxF]
    same_family = fam[:, None, :] == fam[None, :, :]
    return (differ * np.where(same_family, 0.5, 1.0)).sum(-1)


def canonical_codes(latents: dict) -> np.ndarray:
    """``(N, F * L * K * H)``: per problem, the slot codes reordered by canonical feature."""
    codes, perm = latents["codes"], latents["perm"]  # (N, F, L, K, H), (N, G, F)
    slot_of_feature = perm[:, -1].argsort(-1)  # answer slot of canonical feature j
    ordered = np.take_along_axis(codes, slot_of_feature[:, :, None, None, None], axis=1)
    return ordered.reshape(len(codes), -1)


def task_codes(latents: dict) -> tuple[np.ndarray, np.ndarray]:
    """Mean code per task present in the sample, and that task's rule tuple."""
    codes = canonical_codes(latents)
    ids = latents["task_id"]
    tasks = np.unique(ids)
    means = np.stack([codes[ids == t].mean(0) for t in tasks])
    rules = np.stack([latents["rules"][ids == t][0] for t in tasks])
    return means, rules


def topographic_similarity(
    codes_TxD: np.ndarray, rules_TxF: np.ndarray, kind: str = "slots", permutations: int = 1000, seed: int = 0
) -> dict:
    if len(codes_TxD) < 3:
        raise ValueError(f"need at least 3 distinct tasks for topographic similarity, got {len(codes_TxD)}")
    code_dist = pdist(codes_TxD)
    task_dist = squareform(task_distance_matrix(rules_TxF, kind), checks=False)
    rho = float(spearmanr(code_dist, task_dist).statistic)
    rng = np.random.default_rng(seed)
    square = squareform(code_dist)
    exceed = 0
    for _ in range(permutations):
        p = rng.permutation(len(codes_TxD))
        shuffled = squareform(square[np.ix_(p, p)], checks=False)
        exceed += spearmanr(shuffled, task_dist).statistic >= rho
    return {
        "rho": rho,
        "p_value": (1 + exceed) / (1 + permutations),
        "num_tasks": len(codes_TxD),
        "kind": kind,
        "permutations": permutations,
    }


def correlation_across_runs(topsim: list[float], ood: list[float]) -> dict:
    """Spearman correlation between runs' topographic similarity and their OOD accuracy."""
    if len(topsim) < 3:
        return {"spearman": float("nan"), "num_runs": len(topsim), "note": "needs >= 3 runs"}
    res = spearmanr(topsim, ood)
    return {"spearman": float(res.statistic), "p_value": float(res.pvalue), "num_runs": len(topsim)}
