"""Decoding probes (scikit-learn) on latent codes.

SRAVEN: a logistic-regression probe is fit on the codes of problems from *training* tasks (split
``test``) and predicts the rule of each answer slot of *held-out* tasks (split ``ood``): per layer
and with all layers together. Baselines: chance = the most frequent OOD rule's share; control = the
same probe fit on shuffled training labels (it must fall to chance if the probe reads real structure).

Fuzzy logic: ridge regression from the code of a sequence (per layer and head, mean and standard
deviation over the context keys) to its term literals (+-1), fit on one half of the sequences and
scored (R^2) on the other; per layer and all layers, with the same shuffled-label control.
"""

from __future__ import annotations

import numpy as np
from sklearn.linear_model import LogisticRegression, RidgeCV
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
    for name, lat in (("train", train), ("ood", ood)):
        if "query_rule" not in lat or "codes" not in lat:
            raise ValueError(f"{name} latents need SRAVEN 'codes' and 'query_rule' (from collect_latents)")
    if train["codes"].shape[2:] != ood["codes"].shape[2:]:
        shapes = f"{train['codes'].shape} and {ood['codes'].shape}"
        raise ValueError(f"train and ood codes must agree beyond (N, F); got {shapes}")
    rng = np.random.default_rng(seed)
    y_train, y_ood = train["query_rule"].reshape(-1), ood["query_rule"].reshape(-1)
    if len(np.unique(y_train)) < 2:
        raise ValueError("the training latents hold fewer than 2 distinct rules: raise num")
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


def _ridge_scores(
    x: np.ndarray,
    y: np.ndarray,
    fit: np.ndarray,
    score: np.ndarray,
    shuffled_fit: np.ndarray,
    x_ood: np.ndarray | None = None,
    y_ood: np.ndarray | None = None,
) -> dict[str, float]:
    """R^2 on ``score`` (and on ``x_ood``, ``y_ood`` when given) of ridge fits on ``fit`` with the true and
    with the shuffled labels."""
    alphas = np.logspace(-3, 3, 13)
    model = make_pipeline(StandardScaler(), RidgeCV(alphas=alphas)).fit(x[fit], y[fit])
    shuffled = make_pipeline(StandardScaler(), RidgeCV(alphas=alphas)).fit(x[fit], y[shuffled_fit])
    out = {"r2": float(model.score(x[score], y[score])), "shuffled_label_r2": float(shuffled.score(x[score], y[score]))}
    if x_ood is not None and y_ood is not None:
        out["ood_r2"] = float(model.score(x_ood, y_ood))
        out["shuffled_label_ood_r2"] = float(shuffled.score(x_ood, y_ood))
    return out


def term_probe(
    codes: np.ndarray,
    terms_NxKxL: np.ndarray,
    seed: int = 0,
    ood_codes: np.ndarray | None = None,
    ood_terms_MxKxL: np.ndarray | None = None,
) -> dict:
    """Ridge R^2 of the term literals (+-1) from features of the code; fit on half, scored on the rest.

    ``codes`` is either the extracted ``(N, layers, keys, heads)`` array (pooled over keys, see
    ``key_pooled``; then also scored per layer under ``layers``) or any ``(N, features)`` matrix.
    R^2 is sklearn's, averaged uniformly over the K*L literals. The ridge strength is chosen by
    cross-validation on the fitting half. Control: the same fit with the sequences' labels shuffled.
    With ``ood_codes`` and ``ood_terms_MxKxL`` (sequences of held-out term combinations, same layout) the
    same fits are also scored there (``ood_r2``, ``shuffled_label_ood_r2``): whether the code of a new
    combination still names its terms, the fuzzy-logic counterpart of ``rule_probe``."""
    n = len(codes)
    if n < 8 or len(terms_NxKxL) != n:
        raise ValueError(
            f"term_probe needs >= 8 sequences, one terms entry each; got {n} codes, {len(terms_NxKxL)} terms"
        )
    with_ood = ood_codes is not None and ood_terms_MxKxL is not None
    if with_ood and (len(ood_codes) != len(ood_terms_MxKxL) or ood_codes.shape[1:] != codes.shape[1:]):
        raise ValueError(
            f"term_probe: ood_codes {ood_codes.shape} must match codes {codes.shape} past the first axis, "
            f"one ood_terms entry each (got {len(ood_terms_MxKxL)})"
        )
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    fit, score = order[: n // 2], order[n // 2 :]
    shuffled_fit = rng.permutation(fit)

    def literals(terms: np.ndarray) -> np.ndarray:
        return np.where(terms, 1.0, -1.0).reshape(len(terms), -1)

    y, y_ood = literals(terms_NxKxL), literals(ood_terms_MxKxL) if with_ood else None
    layers = {}
    if codes.ndim == 4:
        for layer in range(codes.shape[1]):
            x_ood = key_pooled(ood_codes[:, layer : layer + 1]) if with_ood else None
            x = key_pooled(codes[:, layer : layer + 1])
            layers[str(layer)] = _ridge_scores(x, y, fit, score, shuffled_fit, x_ood, y_ood)
        x, x_ood = key_pooled(codes), key_pooled(ood_codes) if with_ood else None
    else:
        x, x_ood = codes.reshape(n, -1), ood_codes.reshape(len(ood_codes), -1) if with_ood else None
    layers["all"] = _ridge_scores(x, y, fit, score, shuffled_fit, x_ood, y_ood)
    result = {**layers["all"], "num": int(n), "num_fit": len(fit), "layers": layers}
    if with_ood:
        result["num_ood"] = len(ood_codes)
    return result
