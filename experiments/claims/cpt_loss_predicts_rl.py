"""Lower continued-pretraining loss gives higher downstream RL reward."""
from c2jax.workflow.claims import Claim, Verdict, decide, spearman_ci

CONFIG = "experiments/configs/rl_quickstart.py"
BUDGETS = "[25,50,100,200,300]"
CLAIM = Claim(
    name="cpt_loss_predicts_rl",
    claim="Lower continued-pretraining loss gives higher reward after RL.",
    source="Composer 2 report, section 3.1 (claims digest section 6, item 1)",
    test=f"{CONFIG}, train.steps={BUDGETS} (5 CPT budgets) x 3 seeds (build.seed = seed, so each seed retrains CPT)",
    metric="Spearman rank correlation of cpt.held_out_loss_final with rl.pass_at_1_after (percentile-bootstrap 95% CI)",
    direction="less",
    command=f"python experiments/sweep.py --config {CONFIG} --grid 'train.steps={BUDGETS}' --seeds 3 "
            "--workdir runs/claims/cpt_loss_predicts_rl/sweep --metric rl.pass_at_1_after",
    scale="expensive",
    scale_note="15 CPT+SFT+RL runs (a day on 2 CPU cores); RL reward at this scale is near 0, so expect inconclusive",
)


def run(out_dir: str) -> Verdict:
    import os

    from c2jax.workflow.results import as_float
    from c2jax.workflow.sweep import collect_rows, plan_sweep, run_sweep

    plan = plan_sweep(CONFIG, os.path.join(out_dir, "sweep"), grid=[f"train.steps={BUDGETS}"], seeds=3)
    res = run_sweep(plan, metric="rl.pass_at_1_after")
    if not res.ok:
        raise RuntimeError(f"cells failed: {res.failed}")
    rows = collect_rows(plan)
    rho, lo, hi = spearman_ci([as_float(r["cpt.held_out_loss_final"]) for r in rows],
                              [as_float(r["rl.pass_at_1_after"]) for r in rows])
    return Verdict(decide(rho, lo, hi, CLAIM.direction), rho, (lo, hi), len(rows), {}, res.plot_path)
