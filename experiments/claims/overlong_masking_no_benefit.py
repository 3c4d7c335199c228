"""Masking overlong (truncated) samples out of the loss brings no benefit."""
from c2jax.workflow.claims import Claim, Verdict, decide, sweep_compare

CONFIG = "experiments/configs/rl_quickstart.py"
CLAIM = Claim(
    name="overlong_masking_no_benefit",
    claim="Overlong masking (dropping truncated samples from the loss) brings no benefit.",
    source="Composer 2 report (claims digest section 6, item 8)",
    test=f"{CONFIG}, rl.overlong_mask=[False,True] x 3 seeds",
    metric="rl.pass_at_1_after(masked) - rl.pass_at_1_after(unmasked), paired by seed; equivalence margin 0.05",
    direction="none", equivalence_margin=0.05,
    command=f"python experiments/sweep.py --config {CONFIG} --grid 'rl.overlong_mask=[False,True]' --seeds 3 "
            "--workdir runs/claims/overlong_masking_no_benefit/sweep --metric rl.pass_at_1_after",
    scale="expensive", scale_note="six rl_quickstart runs (hours on 2 CPU cores)",
)


def run(out_dir: str) -> Verdict:
    d, lo, hi, n, plot = sweep_compare(out_dir, CONFIG, "rl.overlong_mask", "True", "False", "rl.pass_at_1_after", 3)
    return Verdict(decide(d, lo, hi, CLAIM.direction, CLAIM.equivalence_margin), d, (lo, hi), n, {}, plot)
