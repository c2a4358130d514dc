"""Topographic similarity of the latent code (not in the paper): do similar tasks get similar codes?

Codes. A problem's code is a ``(F, D)`` matrix: row ``j`` is the code of the answer slot holding
canonical feature ``j`` (``D = layers * 2 keys * heads``), so row ``j`` always carries the rule
``rules[n, j]`` (``canonical_codes``). A task's code is the mean over its problems in the sample.

Distances. A task is a *multiset* of F rules (canonical feature ``j`` gets the j-th rule of the sorted
multiset), so both distances compare tasks by the best matching of their F features, not position by
position (``(0,1,2,3)`` and ``(1,2,3,4)`` share three rules: distance 1, not 4):

* code distance ``d_code(a, b) = min over bijections s of sum_j ||code_a[j] - code_b[s(j)]||``;
* task distance ``d_task(r, s) = min over bijections of sum_j cost(r_j, s_s(j))`` with rule costs

  - ``slots``: 0 for the same rule, 1 otherwise: the number of rule slots that must change to turn one
    task into the other, ``F - |r ∩ s|`` (multiset intersection);
  - ``semantic``: like ``slots``, but rules of one family cost 0.5: the four progressions (+-1, +-2)
    are one family, addition and subtraction another (constant, distribute-three alone).

Topographic similarity = Spearman rho between ``d_code`` and ``d_task`` over all task pairs in the sample.
The p-value is a permutation test: task labels are shuffled against codes ``permutations`` times;
``p = (1 + #{shuffled rho >= observed rho}) / (1 + permutations)`` (one-sided: structure means rho > 0).
"""

from __future__ import annotations

import itertools

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.spatial.distance import cdist, squareform
from scipy.stats import spearmanr

#: rule id -> family: constant | progressions (+1, +2, -1, -2) | arithmetic (add, sub) | distribute_three
RULE_FAMILY = np.array([0, 1, 1, 1, 1, 2, 2, 3])
TASK_DISTANCES = ("slots", "semantic")
_MAX_ENUMERATED = 6  # up to this many features, all F! matchings are enumerated (vectorized)


def matching_distance(cost_AxBxFxF: np.ndarray) -> np.ndarray:
    """``(A, B)``: the minimum over bijections ``s`` of ``sum_j cost[a, b, j, s(j)]``."""
    a, b, f, _ = cost_AxBxFxF.shape
    if f <= _MAX_ENUMERATED:
        perms = np.array(list(itertools.permutations(range(f))))  # (P, F)
        totals = cost_AxBxFxF[:, :, np.arange(f)[None, :], perms].sum(-1)  # (A, B, P)
        return totals.min(-1)
    out = np.empty((a, b))
    for i in range(a):
        for k in range(b):
            rows, cols = linear_sum_assignment(cost_AxBxFxF[i, k])
            out[i, k] = cost_AxBxFxF[i, k, rows, cols].sum()
    return out


def rule_cost_matrix(kind: str, num_rules: int = len(RULE_FAMILY)) -> np.ndarray:
    """``(R, R)`` cost of matching rule ``u`` with rule ``v`` under the task distance ``kind``."""
    if kind not in TASK_DISTANCES:
        raise ValueError(f"kind={kind!r} is not valid; allowed values: {', '.join(TASK_DISTANCES)}")
    ids = np.arange(num_rules)
    cost = (ids[:, None] != ids[None, :]).astype(float)
    if kind == "semantic":
        fam = RULE_FAMILY[ids]
        cost[(fam[:, None] == fam[None, :]) & (cost > 0)] = 0.5
    return cost


def task_distance_matrix(rules_TxF: np.ndarray, kind: str) -> np.ndarray:
    """``(T, T)`` task distances (see the module docstring) between rule multisets."""
    cost = rule_cost_matrix(kind)
    rules_TxF = np.asarray(rules_TxF)
    if rules_TxF.ndim != 2 or rules_TxF.min() < 0 or rules_TxF.max() >= len(cost):
        top = len(cost) - 1
        raise ValueError(f"rules_TxF must be (tasks, features) rule ids in 0..{top}, got {rules_TxF.shape}")
    return matching_distance(cost[rules_TxF[:, None, :, None], rules_TxF[None, :, None, :]])


def code_distance_matrix(codes: np.ndarray) -> np.ndarray:
    """``(T, T)``: Euclidean for ``(T, D)`` codes; the best feature matching for ``(T, F, D)`` codes."""
    if codes.ndim == 2:
        return cdist(codes, codes)
    if codes.ndim != 3:
        raise ValueError(f"codes must be (tasks, dim) or (tasks, features, dim), got shape {codes.shape}")
    f = codes.shape[1]
    rows = [np.stack([cdist(codes[:, i], codes[:, j]) for j in range(f)], -1) for i in range(f)]
    cost_TxTxFxF = np.stack(rows, -2)
    return matching_distance(cost_TxTxFxF)


def canonical_codes(latents: dict) -> np.ndarray:
    """``(N, F, L * K * H)``: per problem, the answer-slot codes reordered by canonical feature."""
    codes, perm = latents["codes"], latents["perm"]  # (N, F, L, K, H), (N, G, F)
    slot_of_feature = perm[:, -1].argsort(-1)  # (N, F): answer slot holding canonical feature j
    ordered = np.take_along_axis(codes, slot_of_feature[:, :, None, None, None], axis=1)
    return ordered.reshape(*ordered.shape[:2], -1)


def task_codes(latents: dict) -> tuple[np.ndarray, np.ndarray]:
    """Mean code ``(T, F, D)`` per task present in the sample, and its rule tuple ``(T, F)``."""
    codes = canonical_codes(latents)
    ids = latents["task_id"]
    tasks = np.unique(ids)
    means = np.stack([codes[ids == t].mean(0) for t in tasks])
    rules = np.stack([latents["rules"][ids == t][0] for t in tasks])
    return means, rules


def topographic_similarity(
    codes: np.ndarray, rules_TxF: np.ndarray, kind: str = "slots", permutations: int = 1000, seed: int = 0
) -> dict:
    """Spearman rho between code and task distances, with a permutation-test p-value.

    ``codes``: ``(T, F, D)`` per-feature task codes (matched, see the module docstring) or ``(T, D)``."""
    if len(codes) != len(rules_TxF):
        raise ValueError(f"codes ({len(codes)} tasks) and rules_TxF ({len(rules_TxF)} tasks) must match")
    if len(codes) < 3:
        raise ValueError(f"need at least 3 distinct tasks for topographic similarity, got {len(codes)}")
    if permutations < 0:
        raise ValueError(f"permutations={permutations} must be >= 0")
    code_TxT = code_distance_matrix(codes)
    task_dist = squareform(task_distance_matrix(rules_TxF, kind), checks=False)
    if np.ptp(task_dist) == 0:
        raise ValueError("all tasks are at one distance from each other: topographic similarity is undefined")
    rho = float(spearmanr(squareform(code_TxT, checks=False), task_dist).statistic)
    rng = np.random.default_rng(seed)
    exceed = 0
    for _ in range(permutations):
        p = rng.permutation(len(codes))
        exceed += spearmanr(squareform(code_TxT[np.ix_(p, p)], checks=False), task_dist).statistic >= rho
    return {
        "rho": rho,
        "p_value": (1 + exceed) / (1 + permutations),
        "num_tasks": len(codes),
        "kind": kind,
        "permutations": permutations,
    }


#: fewer runs than this give no correlation across runs
MIN_RUNS_TO_CORRELATE = 3


def correlation_across_runs(topsim: list[float], ood: list[float]) -> dict:
    """Spearman correlation between runs' topographic similarity and their OOD accuracy."""
    pairs = [(t, o) for t, o in zip(topsim, ood) if np.isfinite(t) and np.isfinite(o)]
    if len(pairs) < MIN_RUNS_TO_CORRELATE:
        return {"spearman": float("nan"), "num_runs": len(pairs), "note": f"needs >= {MIN_RUNS_TO_CORRELATE} runs"}
    if len({t for t, _ in pairs}) == 1 or len({o for _, o in pairs}) == 1:
        return {"spearman": float("nan"), "num_runs": len(pairs), "note": "a constant input: undefined"}
    res = spearmanr(*zip(*pairs))
    return {"spearman": float(res.statistic), "p_value": float(res.pvalue), "num_runs": len(pairs)}
