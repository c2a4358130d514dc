"""Plots of runs (matplotlib, Agg backend: works without a display)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from hyla.analysis.runs import Run


def learning_curves(runs: list[Run], metric: str, splits: list[str], out: Path, title: str = "") -> Path:
    """One panel per split, one line per run: ``metric`` against training step."""
    fig, axes = plt.subplots(1, len(splits), figsize=(4.2 * len(splits), 3.4), squeeze=False, sharey=True)
    for ax, split in zip(axes[0], splits):
        for run in runs:
            steps, values = run.curve(split, metric)
            if steps:
                ax.plot(steps, values, marker="o", markersize=2.5, label=run.name)
        ax.set_title(split)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(metric)
    axes[0][-1].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
