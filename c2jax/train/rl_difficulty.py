"""Held-out pass@1 against the task family's difficulty knob: the plot ``report.md`` shows.

The RL stage evaluates its policies on the held-out split at the configured difficulty
(``rl.tasks.difficulty``). This module adds the other difficulties of ``rl.eval.difficulties``: for
each one it builds (or finds, content-addressed in the build cache) a toyfix family with the same
seed and generator but that difficulty, and scores every policy on its first
``rl.eval.difficulty_n_tasks`` held-out tasks with ``rl.eval.difficulty_k`` samples each, through
the same `c2jax.train.rl_eval.evaluate` as the main evaluation (harness, engine, grader; masked samples
count as failures). The configured difficulty reuses the main evaluation's rows.

    python -m c2jax.train.rl_difficulty --config experiments/configs/rl_quickstart.py --workdir runs/rl

scores the serving checkpoints an RL run left (``rl/policy_init``, ``rl/policy_final``) and writes
``rl/difficulty/summary.json`` and ``rl/pass_at_1_by_difficulty.png``.
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Any, Mapping

from c2jax.atomic import atomic_write_json

TAG_LABELS = {"before": "SFT policy (before RL)", "after": "final RL policy"}


def family_for_difficulty(config: Any, rl: dict, difficulty: int) -> dict:
    """The toyfix family of the run's task settings at `difficulty` (held-out split only matters)."""
    import hashlib

    from c2jax.envs.synth.toyfix import build_toyfix, materialize_envs
    from c2jax.envs.tasks import load_tasks
    from c2jax.train.rl_family import cache_root, family_flags

    t = rl["tasks"]
    n = int(rl["eval"]["difficulty_n_tasks"])
    flags = family_flags(t)
    if int(difficulty) != 0:  # the imitation-gap variant exists at difficulty 0 only: the others are plain
        flags.pop("ambiguous", None)
    args = {"difficulty": int(difficulty), "n_train": 8, "n_eval": n, "n_demo": 0, "seed": int(t["seed"]),
            **flags}
    h = hashlib.sha256(json.dumps(args, sort_keys=True).encode()).hexdigest()[:12]
    out = os.path.join(cache_root(config), "tasks", f"toyfix-d{difficulty}-{h}")
    info = dict(build_toyfix(out, n_train=args["n_train"], n_eval=n, n_demo=0, difficulty=int(difficulty),
                             seed=args["seed"], docstrings=bool(args.get("docstrings")),
                             repro=bool(args.get("repro")), ambiguous=float(args.get("ambiguous", 0.0)),
                             workers=2))
    info["dir"] = out
    materialize_envs(load_tasks(info["eval"]))
    return info


def sweep(policies: Mapping[str, Any], cfg: Any, tokenizer: Any, config: Any, rl: dict, seed: int, out_dir: str,
          main: Mapping[str, dict] | None = None) -> dict:
    """{difficulty: {tag: {"pass@1", "ci95", "samples", "tasks", "malformed_tool_call_rate"}}} for every
    difficulty of ``rl.eval.difficulties``; `main` holds the configured difficulty's evaluations."""
    from c2jax.train.rl_eval import evaluate
    from c2jax.train.rl_family import load_split

    ev = rl["eval"]
    sub_rl = dict(rl, eval=dict(ev, k=int(ev["difficulty_k"]), samples=None))  # difficulty_k samples, not eval.samples
    out: dict = {}
    for d in [int(x) for x in ev["difficulties"]]:
        out[d] = {}
        for tag, params in policies.items():
            if main is not None and d == int(rl["tasks"]["difficulty"]) and tag in main:
                res = main[tag]["results"]["overall"]
            else:
                fam = family_for_difficulty(config, rl, d)
                tasks = load_split(fam, "eval")[: int(ev["difficulty_n_tasks"])]
                got = evaluate(params, cfg, tokenizer, config, sub_rl, tasks, os.path.join(out_dir, f"d{d}_{tag}"), seed)
                res = got["results"]["overall"]
            out[d][tag] = {"pass@1": res.get("pass@1"), "ci95": res.get("pass@1_ci95"), "samples": res.get("samples"),
                           "tasks": res.get("tasks"), "malformed_tool_call_rate": res.get("malformed_tool_call_rate")}
    return out


def plot(by_difficulty: Mapping[int, Mapping[str, dict]], path: str) -> str:
    """pass@1 (95% bootstrap CI) against difficulty, one line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ds = sorted(int(d) for d in by_difficulty)
    tags = sorted({t for d in by_difficulty.values() for t in d})
    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    for i, tag in enumerate(tags):
        xs, ys, lo, hi = [], [], [], []
        for d in ds:
            r = by_difficulty[d].get(tag)
            if not r or r.get("pass@1") is None:
                continue
            ci = r.get("ci95") or (r["pass@1"], r["pass@1"])
            xs.append(d + 0.05 * (i - (len(tags) - 1) / 2))
            ys.append(r["pass@1"])
            lo.append(r["pass@1"] - ci[0])
            hi.append(ci[1] - r["pass@1"])
        ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=TAG_LABELS.get(tag, tag))
    ax.set_xticks(ds)
    ax.set_xlabel("toyfix difficulty")
    ax.set_ylabel("held-out pass@1 (95% CI)")
    ax.set_ylim(-0.02, 1.0)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def report_lines(by_difficulty: Mapping[Any, Mapping[str, dict]]) -> list[str]:
    """The report.md table: one row per difficulty and policy."""
    lines = ["## Held-out pass@1 by difficulty", "", "| difficulty | policy | pass@1 | 95% CI | samples | malformed |",
             "|---|---|---|---|---|---|"]
    for d in sorted(by_difficulty, key=int):
        for tag, r in sorted(by_difficulty[d].items()):
            ci = r.get("ci95")
            cis = f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "-"
            p1 = r.get("pass@1")
            mal = r.get("malformed_tool_call_rate")
            lines.append(f"| {d} | {tag} | {p1 if p1 is None else f'{p1:.3f}'} | {cis} | {r.get('samples')} | "
                         f"{mal if mal is None else f'{mal:.3f}'} |")
    return lines + ["", "Plot: `pass_at_1_by_difficulty.png`.", ""]


def main(argv: list[str] | None = None) -> int:
    """Score an RL run's serving checkpoints at every difficulty (see the module docstring)."""
    from c2jax.config import to_plain
    from c2jax.data.__main__ import load_config  # PATH[:preset] -> get_config(preset)
    from c2jax.rl.stage_config import resolve_stage
    from c2jax.sampling.checkpoint import load_serving_checkpoint

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="the run's config file[:preset]")
    p.add_argument("--workdir", required=True, help="the run's workdir (holds rl/policy_init, rl/policy_final)")
    p.add_argument("--seed", type=int, default=None)
    a = p.parse_args(argv)
    config = load_config(a.config)
    rl = resolve_stage(to_plain(config.get("rl")) or {})
    seed = int(config.get("seed", 0)) if a.seed is None else a.seed
    rl_dir = os.path.join(a.workdir, "rl")
    policies, cfg, tok = {}, None, None
    for tag, name in (("before", "policy_init"), ("after", "policy_final")):
        path = os.path.join(rl_dir, name)
        if os.path.isdir(path):
            policies[tag], cfg, tok = load_serving_checkpoint(path)
    if not policies:
        raise SystemExit(f"no serving checkpoints under {rl_dir} (policy_init/, policy_final/)")
    main_rows: dict = {}
    for tag in policies:
        res = os.path.join(rl_dir, f"eval_{tag}", "results.json")
        rows = os.path.join(rl_dir, f"eval_{tag}", "rows.json")
        if os.path.exists(res) and os.path.exists(rows):
            with open(res) as f:
                main_rows[tag] = {"results": json.load(f)}
    out_dir = os.path.join(rl_dir, "difficulty")
    by_d = sweep(policies, cfg, tok, config, rl, seed, out_dir, main=main_rows)
    os.makedirs(out_dir, exist_ok=True)
    atomic_write_json(os.path.join(out_dir, "summary.json"), {str(d): v for d, v in by_d.items()}, indent=2)
    plot(by_d, os.path.join(rl_dir, "pass_at_1_by_difficulty.png"))
    print("\n".join(report_lines(by_d)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
