"""The concave length penalty (q > 0) hurts hard tasks less than the linear one and raises parallel tool calls."""
from c2jax.workflow.claims import Claim

CLAIM = Claim(
    name="length_penalty_q",
    claim="The nonlinear length penalty (q > 0) hurts hard tasks less than the linear one (q = 0) and raises the share of turns with parallel tool calls.",
    source="Composer 2 report, section 4.2 (claims digest section 6, item 12)",
    test="experiments/configs/rl_quickstart.py, rl.rewards.length.q=[0,0.5] x 3 seeds, pass rate split by task difficulty",
    metric="pass@1 on the hardest task tercile (q=0.5 minus q=0) and the share of multi-call turns",
    direction="greater",
    command="python experiments/sweep.py --config experiments/configs/rl_quickstart.py "
            "--grid 'rl.rewards.length.q=[0,0.5]' --seeds 3 --workdir runs/claims/length_penalty_q/sweep "
            "--metric rl.pass_at_1_after",
    scale="needs_gpu",
    scale_note="the effect needs a policy that plans multi-step work and can call tools in parallel; the CPU-scale "
               "toyfix policy has neither; no per-difficulty or parallel-call metric in summary.json yet",
)
