"""Training metrics: JSONL + TensorBoard event files, a progress bar, and the loss-curve PNG.

`MetricsLogger(dir)` appends one JSON object per record to ``dir/<stream>.jsonl`` (streams:
``train``, ``eval``) and mirrors every scalar to TensorBoard (``dir/tb``). A resumed run appends
again from its checkpoint step, so a step can appear twice; `read_jsonl` keeps the last record of
each step (the killed run's records up to the crash are kept on disk, never rewritten).

`plot_loss_curves` draws train loss and held-out loss against tokens or steps on a log x axis.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any, Iterable, Mapping, Optional

import numpy as np

from c2jax.atomic import atomic_path


def _scalar(v: Any) -> Any:
    if isinstance(v, (int, float, str, bool)) or v is None:
        return v
    a = np.asarray(v)
    if a.size == 1:
        x = a.item()
        return float(x) if isinstance(x, float) else x
    return a.tolist()


class MetricsLogger:
    """JSONL streams + TensorBoard scalars under one directory."""

    def __init__(self, directory: str, tensorboard: bool = True):
        self.directory = directory
        os.makedirs(directory, exist_ok=True)
        self._files: dict[str, Any] = {}
        self._tb = None
        if tensorboard:
            try:
                from tensorboardX import SummaryWriter

                self._tb = SummaryWriter(os.path.join(directory, "tb"), flush_secs=10)
            except Exception:  # noqa: BLE001 - TensorBoard is optional; JSONL is the record
                self._tb = None

    def path(self, stream: str) -> str:
        return os.path.join(self.directory, f"{stream}.jsonl")

    def log(self, stream: str, step: int, metrics: Mapping[str, Any]) -> dict:
        rec = {"step": int(step), "time": time.time()}
        rec.update({k: _scalar(v) for k, v in metrics.items()})
        f = self._files.get(stream)
        if f is None:
            f = self._files[stream] = open(self.path(stream), "a")
        f.write(json.dumps(rec, allow_nan=True) + "\n")
        f.flush()
        if self._tb is not None:
            for k, v in rec.items():
                if k not in ("step", "time") and isinstance(v, (int, float)) and not isinstance(v, bool):
                    self._tb.add_scalar(f"{stream}/{k}", v, int(step))
        return rec

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files = {}
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()
            self._tb = None


def read_jsonl(path: str) -> list[dict]:
    """Records of a metrics stream, one per step (the last written wins), sorted by step.

    A torn last line (the process was killed mid-write) is skipped.
    """
    by_step: dict[int, dict] = {}
    if not os.path.exists(path):
        return []
    with open(path) as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            by_step[int(rec["step"])] = rec
    return [by_step[s] for s in sorted(by_step)]


class Progress:
    """tqdm bar showing loss, tokens/s and ETA (tqdm's own), or nothing when disabled."""

    def __init__(self, total: int, initial: int = 0, desc: str = "", enabled: Optional[bool] = None):
        if enabled is None:
            enabled = os.environ.get("C2JAX_PROGRESS", "1") != "0"
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, desc=desc, unit="step", dynamic_ncols=True,
                            file=sys.stderr, mininterval=1.0, smoothing=0.1)

    def update(self, n: int = 1, **postfix: Any) -> None:
        if self.bar is None:
            return
        if postfix:
            self.bar.set_postfix({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in postfix.items()},
                                 refresh=False)
        self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def plot_loss_curves(path: str, train: Iterable[tuple[float, float]], held_out: Mapping[str, Iterable[tuple[float, float]]],
                     *, xlabel: str = "tokens", title: str = "", baselines: Optional[Mapping[str, float]] = None,
                     stage_starts: Optional[Mapping[str, float]] = None) -> str:
    """Write a PNG: train loss and held-out losses (per source) against x on a log axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=110)
    tr = [(x, y) for x, y in train if x > 0 and y is not None and math.isfinite(y)]
    if tr:
        ax.plot(*zip(*tr), lw=0.8, alpha=0.35, color="C0")
        ema, sm = None, []
        for x, y in tr:  # exponential moving average of the logged train losses
            ema = y if ema is None else 0.8 * ema + 0.2 * y
            sm.append((x, ema))
        ax.plot(*zip(*sm), lw=1.5, color="C0", label="train (EMA)")
    for i, (name, pts) in enumerate(held_out.items()):
        pts = [(x, y) for x, y in pts if x > 0 and y is not None and math.isfinite(y)]
        if pts:
            ax.plot(*zip(*pts), marker="o", ms=3, lw=1.5, color=f"C{1 + i}", label=f"held-out {name}")
    for i, (name, v) in enumerate((baselines or {}).items()):
        ax.axhline(v, ls="--", lw=1.0, color=f"C{7 + i}", label=f"{name} baseline {v:.3f}")
    for name, x in (stage_starts or {}).items():
        if x > 0:
            ax.axvline(x, ls=":", lw=0.8, color="k")
            ax.text(x, ax.get_ylim()[1], f" {name}", va="top", ha="right", rotation=90, fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("loss (nat/token)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp)
    plt.close(fig)
    return path
