"""Plots of runs (matplotlib, Agg backend: works without a display)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from hyla.train.run.folder import RunRecord


def save_figure(fig: plt.Figure, out: Path, dpi: int = 120) -> Path:
    """Lay out ``fig``, write it to ``out`` (PNG) and free it."""
    fig.tight_layout()
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return out


def learning_curves(
    runs: list[RunRecord],
    metric: str,
    splits: list[str],
    out: Path,
    title: str = "",
    log_y: bool = False,
    groups: list[str] | None = None,
) -> Path:
    """One panel per split, one line per run: ``metric`` against training step. ``groups`` (one label per
    run): runs with the same label (seeds of one configuration) share a colour and a legend entry."""
    labels = groups or [run.label for run in runs]
    colours = {label: f"C{i % 10}" for i, label in enumerate(dict.fromkeys(labels))}
    fig, axes = plt.subplots(1, len(splits), figsize=(4.2 * len(splits), 3.4), squeeze=False, sharey=True)
    for ax, split in zip(axes[0], splits):
        shown = set()
        for run, label in zip(runs, labels):
            steps, values = run.curve(split, metric)
            if steps:
                legend = None if label in shown else label
                shown.add(label)
                ax.plot(steps, values, marker="o", markersize=2.5, color=colours[label], label=legend, alpha=0.85)
        ax.set_title(split)
        ax.set_xlabel("step")
        if log_y:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(metric)
    if axes[0][-1].get_legend_handles_labels()[0]:  # runs that have not evaluated yet draw nothing
        axes[0][-1].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    out.parent.mkdir(parents=True, exist_ok=True)
    return save_figure(fig, out)


def _panel_grid(n: int, width: float = 3.6, height: float = 3.3):
    cols = min(n, 4)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def embedding_panels(
    features_by_panel: list,
    labels,
    label_names: list[str],
    out: Path,
    method: str = "pca",
    titles: list[str] = (),
    max_points: int | None = None,
) -> tuple[Path, int]:
    """2-D embedding (PCA or t-SNE) of each ``(points, dim)`` matrix, coloured by label; one panel each.

    ``max_points`` subsamples the points (the same ones in every panel; t-SNE is quadratic)."""
    import numpy as np
    from sklearn.decomposition import PCA
    from sklearn.manifold import TSNE

    if method not in ("pca", "tsne"):
        raise ValueError(f"method={method!r} is not valid; allowed values: pca, tsne")
    if not features_by_panel:
        raise ValueError("features_by_panel is empty: nothing to draw")
    labels = np.asarray(labels)
    if any(len(x) != len(labels) for x in features_by_panel):
        raise ValueError(f"every feature matrix needs one row per label ({len(labels)})")
    if max_points is not None and len(labels) > max_points:
        keep = np.sort(np.random.default_rng(0).choice(len(labels), max_points, replace=False))
        features_by_panel, labels = [x[keep] for x in features_by_panel], labels[keep]
    fig, axes = _panel_grid(len(features_by_panel))
    cmap = plt.get_cmap("tab10")
    for i, (ax, x) in enumerate(zip(axes, features_by_panel)):
        if method == "pca":
            xy = PCA(n_components=2, random_state=0).fit_transform(x)
        else:
            xy = TSNE(
                n_components=2, random_state=0, perplexity=min(30, max(5, len(x) // 10)), init="pca"
            ).fit_transform(x)
        for c in np.unique(labels):
            m = labels == c
            ax.scatter(xy[m, 0], xy[m, 1], s=4, alpha=0.6, color=cmap(int(c) % 10), label=label_names[int(c)])
        ax.set_title(titles[i] if titles else f"panel {i}")
        ax.set_xticks([])
        ax.set_yticks([])
    axes[-1].legend(fontsize=7, markerscale=3, loc="best")
    fig.suptitle(f"latent codes ({method.upper()}), coloured by rule")
    save_figure(fig, out, dpi=110)
    return out, len(axes)


def rule_heatmaps(
    mean_codes_LxRxH, rule_names: list[str], out: Path, title: str = "mean latent code per rule"
) -> tuple[Path, int]:
    """Mean latent code per rule (rows) and head (columns), one panel per layer."""
    fig, axes = _panel_grid(len(mean_codes_LxRxH), width=3.8, height=3.0)
    for layer, (ax, m) in enumerate(zip(axes, mean_codes_LxRxH)):
        lim = float(abs(m).max()) or 1.0
        im = ax.imshow(m, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
        ax.set_yticks(range(len(rule_names)), rule_names, fontsize=7)
        heads = m.shape[1]
        ax.set_xticks(range(0, heads, max(1, heads // 8)))
        ax.set_xlabel("head")
        ax.set_title(f"layer {layer}")
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.suptitle(title)
    save_figure(fig, out, dpi=110)
    return out, len(axes)


def sweep_plot(
    series: dict[str, tuple[list, list, list]],
    xlabel: str,
    ylabel: str,
    out: Path,
    title: str = "",
    paper: dict[str, tuple[float, float, float]] | None = None,
) -> Path:
    """``series[name] = (x, mean, s.e.)``: one line with error bars per attention variant; ``paper[name] =
    (x, mean, s.e.)``: the paper's value there, a hollow marker in the variant's colour."""
    fig, ax = plt.subplots(figsize=(5, 3.6))
    colours = {name: f"C{i % 10}" for i, name in enumerate(dict.fromkeys([*series, *(paper or {})]))}
    for name, (x, mean, se) in series.items():
        ax.errorbar(x, mean, yerr=se, marker="o", capsize=3, label=name, color=colours[name])
    for name, (x, mean, se) in (paper or {}).items():
        ax.errorbar(
            [x],
            [mean],
            yerr=[se],
            marker="s",
            markerfacecolor="none",
            capsize=3,
            linestyle="none",
            color=colours[name],
            label=f"{name} (paper)",
        )
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=9)
    return save_figure(fig, out)


def scatter_plot(
    x: list[float], y: list[float], names: list[str], xlabel: str, ylabel: str, out: Path, title: str = ""
) -> Path:
    """One labelled point per run (e.g. topographic similarity against OOD accuracy)."""
    fig, ax = plt.subplots(figsize=(5, 3.8))
    ax.scatter(x, y)
    for xi, yi, name in zip(x, y, names):
        ax.annotate(name, (xi, yi), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title, fontsize=9)
    return save_figure(fig, out)


def probe_by_layer_plot(
    accuracy: dict[str, list[float]],
    chance: float,
    out: Path,
    ylabel: str = "OOD rule accuracy (%)",
    baseline_label: str = "chance",
) -> Path:
    """Fig. 5F: ``accuracy[run] = [layer 0, layer 1, ..., all layers]`` (%), one line per run, chance dashed
    (or any score per layer, with its no-information level as ``chance``)."""
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for name, values in accuracy.items():
        ax.plot(range(len(values)), values, marker="o", label=name)
    num = max(len(v) for v in accuracy.values())
    ax.axhline(chance, color="grey", linestyle="--", label=baseline_label)
    ax.set_xticks(range(num), [f"layer {i}" for i in range(num - 1)] + ["all"])
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, out)


def sraven_latent_figures(
    latents: dict,
    out_dir: Path,
    prefix: str = "",
    methods: tuple[str, ...] = ("pca", "tsne"),
    max_points: int = 2000,
) -> dict[str, Path]:
    """The latent-code pictures of one SRAVEN run from ``collect_latents`` arrays,
    by kind (``latents_pca``, ``latents_tsne``, ``mean_code_per_rule``).

    ``{prefix}latents_{method}.png``: one panel per layer, every answer slot's code at that layer (both
    keys, all heads) embedded in 2-D, coloured by the slot's rule. ``{prefix}mean_code_per_rule.png``: one
    panel per layer, the mean code (over slots and both keys) per rule (rows) and head (columns), minus
    the mean over rules (the head profile all rules share would hide what differs between rules)."""
    import numpy as np

    from hyla.analysis.probes import slot_features

    if "query_rule" not in latents:
        raise ValueError("latents need SRAVEN 'codes' and 'query_rule' (from collect_latents)")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    names = [str(n) for n in latents.get("rule_names", [f"rule {i}" for i in range(8)])]
    labels = latents["query_rule"].reshape(-1)
    codes = latents["codes"]  # (N, F, L, K, H)
    num_layers = codes.shape[2]
    per_layer = [slot_features(codes, layer) for layer in range(num_layers)]
    titles = [f"layer {i}" for i in range(num_layers)]
    paths: dict[str, Path] = {}
    for method in methods:
        path = paths[f"latents_{method}"] = out_dir / f"{prefix}latents_{method}.png"
        embedding_panels(per_layer, labels, names, path, method, titles, max_points=max_points)
    slot_codes = codes.reshape(-1, *codes.shape[2:]).mean(axis=2)  # (slots, L, H): mean over the keys
    present = np.unique(labels)
    means_LxRxH = np.stack([slot_codes[labels == r].mean(0) for r in present], axis=1)
    path = paths["mean_code_per_rule"] = out_dir / f"{prefix}mean_code_per_rule.png"
    rule_heatmaps(
        means_LxRxH - means_LxRxH.mean(axis=1, keepdims=True),
        [names[r] for r in present],
        path,
        title="mean latent code per rule, minus the mean over rules",
    )
    return paths


def first_steps_beside_records(
    out: Path,
    runs: dict[str, RunRecord],
    records: dict[str, RunRecord],
    at_stop: dict[str, float],
    steps: int,
    split: str,
    metric: str,
) -> Path:
    """``hyla demo``'s figure. Left: each run's training loss over its first ``steps`` and its record's.
    Right: the records' ``split`` ``metric`` over their whole schedule; each run's value at ``steps`` a star."""
    fig, (loss_ax, curve_ax) = plt.subplots(1, 2, figsize=(10, 3.6))
    for i, name in enumerate(runs):
        colour = f"C{i}"
        first = [(s, v) for s, v in zip(*records[name].curve("train_batch", "loss")) if s <= steps]
        loss_ax.plot(*zip(*first), color=colour, alpha=0.5, lw=3, label=f"{name} (record)")
        loss_ax.plot(*runs[name].curve("train_batch", "loss"), color=colour, lw=1, ls="--", label=f"{name} (yours)")
        curve_ax.plot(*records[name].curve(split, metric), color=colour, marker="o", ms=3, label=f"{name} (record)")
        curve_ax.plot([steps], [at_stop[name]], color=colour, marker="*", ms=12, ls="none")
    loss_ax.set(title=f"training loss, first {steps} steps", xlabel="step", yscale="log")
    curve_ax.set(title=f"{split} {metric}: records (lines), yours (stars)", xlabel="step")
    for ax in (loss_ax, curve_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return save_figure(fig, out)
