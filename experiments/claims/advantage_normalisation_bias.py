"""Std-normalised advantages and 1/|o| length normalisation bias behaviour (why Dr. GRPO drops both)."""
from c2jax.workflow.claims import Claim

CLAIM = Claim(
    name="advantage_normalisation_bias",
    claim="Dividing advantages by the group std over-weights near-all-correct/near-all-wrong groups, and 1/|o| length normalisation favours long wrong and short right responses.",
    source="Composer 2 report, section 4.1, citing Dr. GRPO (claims digest section 6, items 5 and 6)",
    test="experiments/configs/rl_quickstart.py presets default vs std_norm vs token_mean, 3 seeds each",
    metric="mean response length of failed rollouts (token_mean minus constant) and per-group update weight spread (std_norm minus default)",
    direction="greater",
    command="for p in default std_norm token_mean; do python experiments/sweep.py "
            "--config experiments/configs/rl_quickstart.py:$p --seeds 3 --workdir runs/claims/advantage_normalisation_bias/$p; done",
    scale="expensive",
    scale_note="nine rl_quickstart runs; the length split by success is in rl/train.jsonl, not yet in summary.json",
)
