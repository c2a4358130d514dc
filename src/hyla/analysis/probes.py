"""Decoding probes (scikit-learn) on latent codes.

SRAVEN: a logistic-regression probe is fit on the codes of problems from *training* tasks (split
``test``) and predicts the rule of each answer slot of *held-out* tasks (split ``ood``): per layer
and with all layers together. Baselines: chance = the most frequent OOD rule's share; control = the
same probe fit on shuffled training labels (it must fall to chance if the probe reads real structure).

Fuzzy logic: ridge regression from the code of a sequence (per layer and head, mean and standard
deviation over the context keys) to its term literals (+-1), fit on one half of the sequences and
scored (R^2) on the other.
"""

from __future__ import annotations

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler


def slot_features(codes_NxFxLxKxH: np.ndarray, layer: int | None) -> np.ndarray:
    """One row per (problem, answer slot): the code of one layer, or of all layers, flattened."""
    n, f = codes_NxFxLxKxH.shape[:2]
    picked = codes_NxFxLxKxH if layer is None else codes_NxFxLxKxH[:, :, layer : layer + 1]
    return picked.reshape(n * f, -1)


def fit_rule_probe(x_train: np.ndarray, y_train: np.ndarray, seed: int = 0) -> object:
    probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, C=1.0, random_state=seed))
    return probe.fit(x_train, y_train)


def rule_probe(train: dict, ood: dict, seed: int = 0) -> dict:
    """Accuracy of decoding held-out tasks' rules, per layer and all layers, with baselines."""
    rng = np.random.default_rng(seed)
    y_train, y_ood = train["query_rule"].reshape(-1), ood["query_rule"].reshape(-1)
    num_layers = train["codes"].shape[2]
    _values, counts = np.unique(y_ood, return_counts=True)
    result: dict = {
        "chance": float(counts.max() / counts.sum()),
        "num_train": len(y_train),
        "num_ood": len(y_ood),
        "layers": {},
    }
    for layer in [*range(num_layers), None]:
        x_train, x_ood = slot_features(train["codes"], layer), slot_features(ood["codes"], layer)
        probe = fit_rule_probe(x_train, y_train, seed)
        shuffled = fit_rule_probe(x_train, rng.permutation(y_train), seed)
        result["layers"]["all" if layer is None else str(layer)] = {
            "ood_acc": float((probe.predict(x_ood) == y_ood).mean()),
            "train_acc": float((probe.predict(x_train) == y_train).mean()),
            "shuffled_label_ood_acc": float((shuffled.predict(x_ood) == y_ood).mean()),
        }
    return result


def key_pooled(codes_NxLxKxH: np.ndarray) -> np.ndarray:
    """Per sequence, the mean and standard deviation over the context keys of each (layer, head) code.

    The keys are random examples, so their order carries nothing; pooling makes the features
    comparable across sequences (2 * layers * heads of them)."""
    n = len(codes_NxLxKxH)
    return np.concatenate([codes_NxLxKxH.mean(2).reshape(n, -1), codes_NxLxKxH.std(2).reshape(n, -1)], axis=1)


def term_probe(codes: np.ndarray, terms_NxKxL: np.ndarray, seed: int = 0) -> dict:
    """Ridge R^2 of the term literals (+-1) from features of the code; fit on half, scored on the rest.

    ``codes`` is either the extracted ``(N, layers, keys, heads)`` array (pooled over keys, see
    :func:`key_pooled`) or any ``(N, features)`` matrix. The ridge strength is chosen by
    cross-validation on the fitting half."""
    from sklearn.linear_model import RidgeCV

    rng = np.random.default_rng(seed)
    n = len(codes)
    order = rng.permutation(n)
    fit, score = order[: n // 2], order[n // 2 :]
    x = key_pooled(codes) if codes.ndim == 4 else codes.reshape(n, -1)
    y = np.where(terms_NxKxL, 1.0, -1.0).reshape(n, -1)
    alphas = np.logspace(-3, 3, 13)
    model = make_pipeline(StandardScaler(), RidgeCV(alphas=alphas)).fit(x[fit], y[fit])
    shuffled = make_pipeline(StandardScaler(), RidgeCV(alphas=alphas)).fit(x[fit], y[rng.permutation(fit)])
    return {
        "r2": float(model.score(x[score], y[score])),
        "shuffled_label_r2": float(shuffled.score(x[score], y[score])),
        "num": int(n),
    }
