"""RL raises pass@1 and pass@k together (not pass@1 at pass@k's expense)."""
from c2jax.workflow.claims import Claim, Verdict, decide, paired_t

CONFIG = "experiments/configs/rl_quickstart.py"
CLAIM = Claim(
    name="rl_pass_at_1_and_k",
    claim="RL raises held-out pass@1 and pass@k together.",
    source="Composer 2 report, section 4.1 and Figure 5 (claims digest section 6, item 4)",
    test=f"{CONFIG} (default preset), 3 seeds; the RL stage's held-out eval before vs after RL (paired by task)",
    metric="min(rl.pass_at_1_diff, rl.pass_at_8_diff) per seed, mean over seeds with its t 95% CI",
    direction="greater",
    command=f"python experiments/sweep.py --config {CONFIG} --seeds 3 --workdir runs/claims/rl_pass_at_1_and_k/sweep "
            "--metric rl.pass_at_8_diff  # then: python experiments/claims.py run rl_pass_at_1_and_k --force",
    scale="expensive",
    scale_note="three full rl_quickstart runs (hours on 2 CPU cores); at this model size held-out pass@k stays near 0 "
               "(README), so a CPU verdict is expected to be inconclusive",
)


def run(out_dir: str) -> Verdict:
    import os

    from c2jax.workflow.results import as_float
    from c2jax.workflow.sweep import collect_rows, plan_sweep, run_sweep

    plan = plan_sweep(CONFIG, os.path.join(out_dir, "sweep"), seeds=3)
    res = run_sweep(plan, metric="rl.pass_at_8_diff")
    if not res.ok:
        raise RuntimeError(f"cells failed: {res.failed}")
    rows = collect_rows(plan)
    effect, lo, hi, n = paired_t([min(as_float(r["rl.pass_at_1_diff"]), as_float(r["rl.pass_at_8_diff"])) for r in rows])
    return Verdict(decide(effect, lo, hi, CLAIM.direction), effect, (lo, hi), n, {"rows": len(rows)}, res.plot_path)
