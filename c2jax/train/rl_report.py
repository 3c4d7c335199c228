"""The RL stage's plot and report: ``rl_curve.png`` (reward, pass rate, KL, mismatch per step) and
``report.md`` (held-out pass@k before/after with CIs, the paired differences, the time breakdown,
the lift restricted to well-formed tool calls, and the evaluation command)."""
from __future__ import annotations

import os
from typing import Any


def plot_curve(out_dir: str, rows: list[dict]) -> str | None:
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    panels = [("reward/total", "reward (total)"), ("pass_rate", "train pass rate"),
              ("kl/k1", "KL k1 to reference"), ("mismatch/with_replay/mean", "|logp learner - sampler|")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.2))
    for ax, (key, title) in zip(axes, panels):
        ys = [r.get(key) for r in rows]
        pts = [(s, y) for s, y in zip(steps, ys) if isinstance(y, (int, float))]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3)
        if key == "mismatch/with_replay/mean":
            ys2 = [(s, r.get("mismatch/no_replay/mean")) for s, r in zip(steps, rows)]
            ys2 = [p for p in ys2 if isinstance(p[1], (int, float))]
            if ys2:
                ax.plot([p[0] for p in ys2], [p[1] for p in ys2], marker="x", ms=3, label="no replay")
                ax.legend(fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("RL step")
    fig.tight_layout()
    path = os.path.join(out_dir, "rl_curve.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    if isinstance(v, dict) and "lo" in v:
        return f"[{v['lo']:.3f}, {v['hi']:.3f}]"
    return str(v)


def write_report(out_dir: str, summary: dict, train_jsonl: str) -> str:
    from c2jax.train.metrics import read_jsonl

    rows = read_jsonl(train_jsonl) if os.path.exists(train_jsonl) else []
    plot_curve(out_dir, rows)
    lines = ["# RL stage report", ""]
    keys = [k for k in sorted(summary) if k.startswith("pass_at_") or k.startswith("masked_rate")]
    if keys:
        lines += ["## Held-out evaluation (same command before and after)", "", "| metric | value |", "|---|---|"]
        lines += [f"| {k} | {_fmt(summary[k])} |" for k in keys]
        lines += ["", f"Command: `{summary.get('eval_command', '')}`", ""]
        blind = summary.get("blind_edit_baseline")
        if blind and blind.get("edit"):
            lines += [f"Blind baseline (never reads the code): the most common training fix `{blind['edit']}` "
                      f"replayed on every held-out task fixes {blind['resolved_share']:.3f} of them.", ""]
    if rows:
        def tot(key: str) -> float:
            return float(sum(r.get(key, 0.0) or 0.0 for r in rows))
        lines += ["## Time breakdown (sum over steps, seconds)", "", "| part | s |", "|---|---|"]
        for key in ("time/rollout_s", "time/grading_s_sum", "time/diagnostics_s", "time/learner_s", "time/publish_s",
                    "time/step_s"):
            lines.append(f"| {key[5:]} | {tot(key):.1f} |")
        lines += ["", "Grading runs inside the rollout time (overlapping episodes); `grading_s_sum` adds the "
                  "per-sample grader durations.", ""]
        first, last = rows[0], rows[-1]
        lines += ["## Training signals (first step -> last step)", "", "| metric | first | last |", "|---|---|---|"]
        for key in ("reward/total", "pass_rate", "pass_rate/wellformed", "tools/wellformed_share", "tools/malformed_mean",
                    "kl/k1", "kl/k3", "mismatch/with_replay/mean", "mismatch/no_replay/mean", "route_flip_rate",
                    "rollouts/masked", "effort/turns", "effort/tool_calls"):
            if key in first or key in last:
                lines.append(f"| {key} | {_fmt(first.get(key))} | {_fmt(last.get(key))} |")
    if summary.get("pass_at_1_by_difficulty"):
        from c2jax.train.rl_difficulty import report_lines

        lines += [""] + report_lines(summary["pass_at_1_by_difficulty"])
    wf = summary.get("wellformed")
    if wf:
        lines += ["", "## Lift restricted to well-formed tool calls", ""]
        lines += [f"- {k}: {_fmt(v)}" for k, v in wf.items()]
    gap = summary.get("imitation_gap")
    if gap:
        from c2jax.train.rl_imitation_gap import report_lines

        lines += [""] + report_lines(gap)
    t = summary.get("time") or {}
    if t:
        lines += ["", "## Stage wall time", ""] + [f"- {k}: {v:.1f}" for k, v in t.items()]
    path = os.path.join(out_dir, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path
