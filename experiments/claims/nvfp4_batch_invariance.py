"""Per-token NVFP4 is batch-invariant; per-tensor NVFP4 is not."""
import os

from c2jax.workflow import probes
from c2jax.workflow.claims import Claim, Verdict, decide

CLAIM = Claim(
    name="nvfp4_batch_invariance",
    claim="Per-token NVFP4 quantisation is batch-invariant (a token's bits do not depend on its batch mates); per-tensor NVFP4 is not.",
    source="Composer 2 report, section 6.1 (claims digest section 6, item 19)",
    test="c2jax.workflow.probes.batch_invariance: 128 trials, batch mates rescaled, first row compared bit for bit",
    metric="share of trials where the row changed: per tensor minus per token (Newcombe 95% CI); the per-token count is in the detail",
    direction="greater",
    command="python experiments/claims.py run nvfp4_batch_invariance",
    scale="cheap", scale_note="under a minute on CPU",
    run_scale="exact: 128 trials per format, 8 rows x 64 values, batch mates rescaled by 1/16..16",
)


def run(out_dir: str) -> Verdict:
    tensor = probes.batch_invariance("nvfp4", trials=128, seed=0)
    token = probes.batch_invariance("nvfp4_per_token", trials=128, seed=0)
    effect, lo, hi = probes.newcombe_diff(tensor["changed"], tensor["trials"], token["changed"], token["trials"])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    for i, r in enumerate((tensor, token)):
        ax.bar(i, r["rate"], yerr=[[r["rate"] - r["ci95"][0]], [r["ci95"][1] - r["rate"]]], capsize=4)
    ax.set_xticks([0, 1], ["nvfp4 (per tensor)", "nvfp4_per_token"])
    ax.set_ylabel("share of trials where the row changed")
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "batch_invariance.png"), dpi=110)
    plt.close(fig)
    verdict = decide(effect, lo, hi, CLAIM.direction)
    return Verdict(verdict, effect, (lo, hi), tensor["trials"] + token["trials"],
                   {"per_tensor": tensor, "per_token": token}, os.path.join(out_dir, "batch_invariance.png"))
