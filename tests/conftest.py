"""Fixtures shared by the test modules."""

from __future__ import annotations

import functools

import pytest


@pytest.fixture
def quick_tsne(monkeypatch: pytest.MonkeyPatch) -> None:
    """t-SNE with scikit-learn's fewest iterations (250, not 1,000): for tests of what a report or figure holds,
    where t-SNE's 1,000 iterations were most of the minutes and its convergence is not under test."""
    import sklearn.manifold

    monkeypatch.setattr(sklearn.manifold, "TSNE", functools.partial(sklearn.manifold.TSNE, max_iter=250))
