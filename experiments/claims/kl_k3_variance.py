"""k3's variance blows up as the policies diverge while k1's grows only polynomially (report Figure 4)."""
import math
import os

import numpy as np

from c2jax.workflow import probes
from c2jax.workflow.claims import Claim, Verdict, decide, paired_t

CLAIM = Claim(
    name="kl_k3_variance",
    claim="The k3 KL estimator's variance blows up as the policies diverge, while k1's does not.",
    source="Composer 2 report, Figure 4 (claims digest section 6, item 7)",
    test="c2jax.workflow.probes.kl_estimator_spread: q = N(0,1), p = N(mu,1), the RL loss's kl_estimate",
    metric="log[(var k3 / var k1) at mu=2] - log[(var k3 / var k1) at mu=0.5], per seed (5 seeds x 100k samples)",
    direction="greater",
    command="python experiments/claims.py run kl_k3_variance",
    scale="cheap", scale_note="seconds on CPU",
    run_scale="exact: q = N(0,1), p = N(mu,1), mu in {0.5, 1, 1.5, 2}, 5 seeds x 100k samples",
)
MUS = (0.5, 1.0, 1.5, 2.0)


def run(out_dir: str) -> Verdict:
    per_seed = [probes.kl_estimator_spread(MUS, n=100_000, seed=s) for s in range(5)]
    growth = [math.log(r[-1]["k3_var"] / r[-1]["k1_var"]) - math.log(r[0]["k3_var"] / r[0]["k1_var"]) for r in per_seed]
    effect, lo, hi, n = paired_t(growth)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for kind in ("k1", "k3"):
        v = np.array([[row[f"{kind}_var"] for row in r] for r in per_seed])
        ax.errorbar(MUS, v.mean(0), yerr=v.std(0), marker="o", capsize=3, label=f"var {kind} (5 seeds)")
    ax.plot(MUS, [m ** 2 for m in MUS], "k--", lw=1, label="mu^2 (k1 closed form)")
    ax.plot(MUS, [math.expm1(m ** 2) - m ** 2 for m in MUS], "k:", lw=1, label="e^{mu^2}-1-mu^2 (k3)")
    ax.set_yscale("log"), ax.set_xlabel("mu (policy divergence)"), ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "kl_variance.png"), dpi=110)
    plt.close(fig)
    detail = {"k1_var_over_mu2_at_2": float(np.mean([r[-1]["k1_var"] for r in per_seed]) / 4.0),
              "k3_over_k1_var_at_0.5": float(np.mean([r[0]["k3_var"] / r[0]["k1_var"] for r in per_seed])),
              "k3_over_k1_var_at_2": float(np.mean([r[-1]["k3_var"] / r[-1]["k1_var"] for r in per_seed]))}
    return Verdict(decide(effect, lo, hi, CLAIM.direction), effect, (lo, hi), n, detail,
                   os.path.join(out_dir, "kl_variance.png"))
