"""The KL-estimator experiment of the Composer 2 report (Figure 4): k1, k2, k3 for two unit Gaussians.

x ~ q = N(0, 1), p = N(mu, 1), r = p(x) / q(x); the true KL(q || p) = mu^2 / 2. For each mu the
script draws n samples, evaluates the library's `c2jax.rl.kl.kl_estimate` (the code the RL loss
uses), and prints the empirical mean and standard deviation of each estimator next to the closed
forms (k1: var mu^2; k2: mean mu^2/2 + mu^4/8, var mu^4/2 + mu^6/4; k3: var e^{mu^2} - 1 - mu^2).
It saves a two-panel plot (means vs the true KL; standard deviations on a log scale).

    python benchmarks/kl_estimators.py [--n 1000000] [--out workdirs/benchmarks/kl_estimators.png]

For large mu the empirical k3 variance is itself unreliable (r is log-normal with a heavy tail):
that is the point of the experiment; the closed-form column is the ground truth.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax.numpy as jnp  # noqa: E402

from c2jax.rl.kl import kl_estimate  # noqa: E402

KINDS = ("k1", "k2", "k3")


def closed_form(mu: float) -> dict[str, tuple[float, float]]:
    """(mean, variance) of each estimator under x ~ N(0, 1)."""
    kl = mu ** 2 / 2
    return {"k1": (kl, mu ** 2), "k2": (kl + mu ** 4 / 8, mu ** 4 / 2 + mu ** 6 / 4),
            "k3": (kl, float(np.expm1(mu ** 2) - mu ** 2))}


def run(mus, n: int, seed: int) -> list[dict]:
    rows = []
    for i, mu in enumerate(mus):
        x = np.random.default_rng(seed + i).standard_normal(n)
        logq = jnp.asarray(-0.5 * x ** 2, jnp.float32)
        logp = jnp.asarray(-0.5 * (x - mu) ** 2, jnp.float32)
        row = {"mu": mu, "kl": mu ** 2 / 2}
        cf = closed_form(mu)
        for k in KINDS:
            v = np.asarray(kl_estimate(logq, logp, k), np.float64)
            row[k] = (v.mean(), v.std(ddof=1), cf[k][0], np.sqrt(cf[k][1]))
        rows.append(row)
    return rows


def print_table(rows: list[dict], n: int) -> None:
    print(f"KL(N(0,1) || N(mu,1)) = mu^2/2; {n} samples per mu; mean / std: empirical (closed form)")
    head = f"{'mu':>5} {'true KL':>8} | " + " | ".join(f"{k + ' mean':>17} {k + ' std':>19}" for k in KINDS)
    print(head)
    print("-" * len(head))
    for r in rows:
        cells = []
        for k in KINDS:
            m, s, cm, cs = r[k]
            cells.append(f"{m:8.4f} ({cm:7.4f}) {s:9.3f} ({cs:8.3f})")
        print(f"{r['mu']:5.2f} {r['kl']:8.4f} | " + " | ".join(cells))
    last = rows[-1]
    for r in rows:
        if r["mu"] in (0.5, 1.0, 2.0, 3.0):
            print(f"mu={r['mu']}: variance ratio k3/k1 closed form {(r['k3'][3] / r['k1'][3]) ** 2:9.2f}x, "
                  f"empirical {(r['k3'][1] / r['k1'][1]) ** 2:9.2f}x; k2 relative bias {r['k2'][2] / r['kl'] - 1:+.0%}")


def plot(rows: list[dict], out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mu = np.array([r["mu"] for r in rows])
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.plot(mu, mu ** 2 / 2, "k-", lw=2, label="true KL = mu^2/2")
    for k, c in zip(KINDS, ("C0", "C1", "C2")):
        a.plot(mu, [r[k][0] for r in rows], "o", color=c, label=f"{k} (empirical mean)")
        a.plot(mu, [r[k][2] for r in rows], "--", color=c, lw=1)
        b.semilogy(mu, [r[k][3] for r in rows], "-", color=c, label=f"{k} closed form")
        b.semilogy(mu, [r[k][1] for r in rows], "o", color=c, label=f"{k} empirical")
    a.set_xlabel("mu"), a.set_ylabel("estimator mean"), a.legend(), a.set_title("bias")
    b.set_xlabel("mu"), b.set_ylabel("std of one sample"), b.legend(fontsize=8), b.set_title("spread")
    fig.suptitle("KL estimators, q = N(0,1), p = N(mu,1) (Composer 2 report, Fig. 4)")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=120)
    print(f"plot saved to {out}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="samples per mu")
    ap.add_argument("--mus", type=float, nargs="+", default=[0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="workdirs/benchmarks/kl_estimators.png")
    args = ap.parse_args(argv)
    rows = run(args.mus, args.n, args.seed)
    print_table(rows, args.n)
    plot(rows, args.out)


if __name__ == "__main__":
    main()
