"""Consecutive RL checkpoints differ in only a few per cent of their bf16 weights."""
from c2jax.workflow.claims import Claim

CLAIM = Claim(
    name="checkpoint_sparse_diffs",
    claim="Consecutive RL checkpoints differ in only a few per cent of their bf16 weights (so weight sync can send sparse diffs).",
    source="Composer 2 report, section 6.2, weight sync (claims digest section 6, item 20)",
    test="the RL stage's step checkpoints of experiments/configs/rl_quickstart.py, cast to bf16, compared step to step",
    metric="share of bf16 weights that changed between consecutive steps (predicted < 0.05)",
    direction="less",
    command="python experiments/run.py --config experiments/configs/rl_quickstart.py --workdir runs/claims/checkpoint_sparse_diffs/run",
    scale="needs_gpu",
    scale_note="the sparsity comes from tiny updates to a large model at a low learning rate; the CPU model (~1M "
               "parameters, lr 3e-4) moves most of its weights every step, so a CPU run does not test the claim",
)
