"""Teacher-forced probe of a toyfix policy's edit: is the `sed` line number read, is the substitution?

The shell-style demonstrations (`c2jax.envs.synth.toyfix_shell_demos`) end in
``sed -i 'Ns/PAT/REP/' */[!_]*.py``: N must be copied from a tool output, PAT/REP read from it. A
held-out pass@k evaluation takes minutes and mixes every failure; this probe runs the scripted
demonstrations of held-out tasks through the real harness and sandboxes, feeds each one to the model
up to its `sed -i` command (teacher forcing) and reports, greedy, how often the line number token is
right, how often every token of the substitution is right, and both. One forward per demonstration:
about a minute on CPU for 128 tasks.

    python -m c2jax.train.sed_probe --config experiments/configs/rl_quickstart.py \
        --checkpoint runs/rl/rl/policy_init [--style shell_locate] [--split eval] [--n 128]

Why: a failed episode of the tiny CPU model mostly edits nothing because the line number it writes is
not the one it was shown (see README, "The task family's difficulty"); this measures that directly.
"""
from __future__ import annotations

import argparse
import json
from typing import Any, Sequence

import numpy as np

SED_PREFIX = "sed -i '"


def _edit_span(tokenizer: Any, completion: Sequence[int]) -> tuple[int, int] | None:
    """(start, end) token indices in `completion` of the `Ns/PAT/REP/` span after ``sed -i '``: start
    is the line number's first token, end the first token after the closing quote's start."""
    ids = list(completion)
    start = None
    for j in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:j])
        if start is None and text.endswith(SED_PREFIX):
            start = j
        elif start is not None and "'" in text[len(tokenizer.decode(ids[:start])):]:
            return start, j - 1
    return None


def probe(params: Any, cfg: Any, tokenizer: Any, trajectories: Sequence[Any]) -> dict[str, Any]:
    """Greedy teacher-forced accuracy of the `sed -i` edit in each demonstration (see module docstring).

    Returns {"n", "line_number", "substitution", "both"} (shares of demonstrations) and "rows"."""
    import jax
    import jax.numpy as jnp

    from c2jax.model import transformer

    fwd = jax.jit(lambda p, t: transformer.apply(p, t, cfg)["logits"])
    rows = []
    for traj in trajectories:
        for seg in traj.segments:
            comp = [int(x) for x in np.asarray(seg.completion_ids)]
            span = _edit_span(tokenizer, comp)
            if span is None:
                continue
            prompt = [int(x) for x in np.asarray(seg.prompt_ids)]
            full = prompt + comp
            logits = np.asarray(fwd(params, jnp.asarray([full], jnp.int32)))[0]  # [S, V]
            s, e = span
            pos = [len(prompt) + j - 1 for j in range(s, e)]  # the logits predicting comp[s:e]
            pred = logits[pos].argmax(-1)
            want = np.asarray(comp[s:e])
            # The line number is the span's first token (one token for 1-3 digit numbers in our BPE);
            # the substitution is everything after it up to the closing quote.
            rows.append({"task_id": traj.task_id, "edit": tokenizer.decode(comp[s:e]),
                         "line_ok": bool(pred[0] == want[0]), "sub_ok": bool((pred[1:] == want[1:]).all()),
                         "line_pred": tokenizer.decode([int(pred[0])])})
            break
    n = len(rows)
    share = (lambda k: sum(r[k] for r in rows) / n) if n else (lambda k: 0.0)
    both = sum(r["line_ok"] and r["sub_ok"] for r in rows) / n if n else 0.0
    return {"n": n, "line_number": share("line_ok"), "substitution": share("sub_ok"), "both": both, "rows": rows}


def main(argv: Sequence[str] | None = None) -> dict:
    from c2jax.bench.agent_eval import load_experiment_config
    from c2jax.sampling.checkpoint import load_serving_checkpoint
    from c2jax.train.agent_sft import demo_trajectories
    from c2jax.train.rl_family import ensure_family

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="experiments/configs/NAME.py[:preset] (its agent and rl.tasks)")
    p.add_argument("--checkpoint", required=True, help="a serving checkpoint (e.g. runs/rl/rl/policy_init)")
    p.add_argument("--style", default=None, help="demo style (default: the config's agent_sft.demo_style)")
    p.add_argument("--split", default="eval", choices=("eval", "train", "demo"))
    p.add_argument("--n", type=int, default=128)
    p.add_argument("--out", default=None, help="write the result (with per-demo rows) as JSON here")
    a = p.parse_args(argv)
    config = load_experiment_config(a.config)
    style = a.style or config.agent_sft.demo_style
    params, cfg, tok = load_serving_checkpoint(a.checkpoint)
    fam = ensure_family(config)
    trajs = demo_trajectories(config, fam, tok, a.split, a.n, style=style)
    res = probe(params, cfg, tok, trajs)
    print(json.dumps({k: v for k, v in res.items() if k != "rows"} | {"style": style, "split": a.split}))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
