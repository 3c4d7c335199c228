"""Small figures for the claims ledger: one panel per measured quantity, one bar per arm with every
seed's value on top, so a reader sees the effect next to the seed-to-seed spread."""
from __future__ import annotations

from typing import Mapping, Sequence


def arms_figure(panels: Mapping[str, Mapping[str, Sequence[float]]], path: str, title: str = "") -> str:
    """``panels = {panel title: {arm: per-seed values}}`` -> a PNG at `path` (returned)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.4), squeeze=False)
    for ax, (name, arms) in zip(axes[0], panels.items()):
        labels = list(arms)
        for i, arm in enumerate(labels):
            v = np.asarray(arms[arm], float)
            ax.bar(i, v.mean(), color=f"C{i}", alpha=0.6)
            ax.plot(np.full(v.size, i) + np.linspace(-0.15, 0.15, v.size), v, "k.", ms=4)
        ax.set_xticks(range(len(labels)), labels, fontsize=7, rotation=15)
        ax.set_title(name, fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
