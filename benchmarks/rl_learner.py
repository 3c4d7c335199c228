"""The RL learner's device work per step, timed alone: the update (forward + backward + Adam, with
the logprobs the step's diagnostics read) and the two diagnostic forwards (the other routing mode
and the frozen reference), on a batch shaped like the quickstart's RL steps.

    python benchmarks/rl_learner.py                                  # default vs --variants logits-at=all
    python benchmarks/rl_learner.py --variants logits-at=all,layer-loop=python
    python benchmarks/rl_learner.py --rows 16 --row-len 384          # smaller batch (smoke)

Why: in the quickstart's RL stage the learner and its diagnostics take about 60% of each step
(`time/learner_s` + `time/diagnostics_s` in train.jsonl), and `benchmarks/rl_step.py` times them
only inside whole steps with rollouts around them. This script times them alone so a change to the
learner's forward can be judged on its own.

What runs: `c2jax.train.rl_learner.make_learner` for the model of ``--config`` (the rl_quickstart
policy's shape, random init: the time does not depend on the weights) and its resolved ``rl``
section, on a `pad_batch` of ``--rows`` synthetic trajectories (one per row, like the quickstart's
steps: prompts of 250-350 tokens, completions of 150-320 tokens of which ~80% are policy tokens (about 30% of the positions, as in the quickstart: 12.6k policy tokens in 64 x 640), sampler
routes for replay) padded to ``--row-len`` positions. One timed call = `update_with_logp`
(replayed routes) + `logp` without replay + `logp` of the reference parameters, as `rl_step.learn`
calls them.

Variants (``--variants NAME=VALUE,...``, NAME in VARIANTS: a module switch set while the variant's
learner traces and runs) are compiled, then checked against the default on the same batch before
any timing (parity gate: logprobs at the loss positions within
2e-6, loss and gradient norm within 1e-5 relative, and every gradient element within GRAD_RTOL of
its parameter leaf's largest entry), and timed interleaved, repeat by repeat.
Printed: the median over ``--repeats`` (at least 5) with min and max, and each variant's median
over the default's (> 1: the variant is slower).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [p for p in (os.path.dirname(_HERE), _HERE) if p not in sys.path]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import perf  # noqa: E402

DEFAULT_CONFIG = "experiments/configs/rl_quickstart.py"
# name -> (module, attribute); the value comes from the command line
VARIANTS = {
    # where the LM head runs: "loss_positions" (default since 2026-12-07) or "all" (before)
    "logits-at": ("c2jax.train.rl_learner", "LOGITS_AT"),
    # the layer loops: 1 (lax.scan, default), True (unrolled scan) or "python" (no scan)
    "layer-loop": ("c2jax.model.transformer", "SCAN_UNROLL"),
    # attention's backward: "recompute" (default since 2026-12-07, c2jax/model/attention_recompute.py)
    # or "autodiff" (before)
    "attn-backward": ("c2jax.model.mla", "ATTN_BACKWARD"),
    # attention's heads in this many independent groups (mla.ATTN_HEAD_GROUPS; 1 = one call)
    "head-groups": ("c2jax.model.mla", "ATTN_HEAD_GROUPS"),
}


def parse_variants(text: str) -> list[tuple[str, str, str, object]]:
    """'logits-at=all,layer-loop=python' -> [(label, module, attr, value)]; bad names fail here."""
    return perf.parse_variants(text, VARIANTS)


def synthetic_batch(cfg, rows: int, row_len: int, seed: int = 0) -> dict:
    """pad_batch of `rows` one-segment trajectories shaped like the quickstart's rollouts."""
    from c2jax.batching import pad_batch
    from c2jax.trajectory import Segment, Trajectory

    rng = np.random.default_rng(seed)
    nl, k, e = cfg.n_moe_layers, cfg.moe.top_k, cfg.moe.n_routed_experts
    trajs = []
    for i in range(rows):
        p = int(rng.integers(250, 350))
        c = min(int(rng.integers(150, 320)), row_len + 1 - p)
        n = p + c - 1
        routes = np.argsort(rng.random((n, nl, e)), axis=-1)[..., :k].astype(np.int32)  # distinct experts
        seg = Segment(prompt_ids=rng.integers(1, cfg.vocab_size, p).tolist(),
                      completion_ids=rng.integers(1, cfg.vocab_size, c).tolist(),
                      loss_mask=(rng.random(c) < 0.8).astype(int).tolist(), behaviour_logprobs=[-8.0] * c,
                      policy_versions=[0] * c, raw_logprobs=[-8.0] * c, routes=routes)
        trajs.append(Trajectory(segments=[seg], task_id=f"t{i // 8}", group_id=f"g{i // 8}",
                                reward_terms={"task": float(i % 3 == 0)}))
    return pad_batch(trajs, row_len, num_rows=rows, max_trajectories=rows, reward_names=("task",))


# The gate's gradient check: every parameter's gradient element within this fraction of the largest
# entry of its own leaf (measured ~1e-6 for the attention backward and LM-head variants; the model's A/B
# switch tests hold 1e-5).
GRAD_RTOL = 2e-5


def grad_diff(got, want) -> tuple[float, str]:
    """(max over leaves of max|got - want| / max|want|, that leaf's path): an element-by-element gradient
    comparison, which a loss and a gradient norm that agree cannot stand in for."""
    if jax.tree_util.tree_structure(got) != jax.tree_util.tree_structure(want):
        return float("inf"), "the parameter trees differ"
    worst, where = 0.0, ""
    for (path, w), g in zip(jax.tree_util.tree_flatten_with_path(want)[0], jax.tree_util.tree_leaves(got)):
        w, g = np.asarray(w, np.float64), np.asarray(g, np.float64)
        r = float(np.abs(g - w).max() / max(float(np.abs(w).max()), 1e-30)) if w.size else 0.0
        if r > worst or not where:
            worst, where = r, jax.tree_util.keystr(path)
    return worst, where


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=DEFAULT_CONFIG, help="experiment file[:preset]: config.model and config.rl")
    ap.add_argument("--rows", type=int, default=64, help="trajectories = learner rows (quickstart: 64)")
    ap.add_argument("--row-len", type=int, default=640, help="positions per row (quickstart steps: 640)")
    ap.add_argument("--repeats", type=int, default=perf.MIN_REPEATS)
    ap.add_argument("--variants", default="logits-at=all", help=f"comma list of NAME=VALUE, NAME in {sorted(VARIANTS)}")
    args = ap.parse_args(argv)
    if args.repeats < perf.MIN_REPEATS:
        raise SystemExit(f"--repeats must be >= {perf.MIN_REPEATS} (median of at least {perf.MIN_REPEATS})")
    variants = {"default": None}
    variants.update({v[0]: v for v in parse_variants(args.variants)})
    names = list(variants)

    from c2jax.config import load_config_file
    from c2jax.model import init
    from c2jax.model.config import ModelConfig
    from c2jax.train import rl_learner
    from c2jax.train.rl import resolved_rl
    from c2jax.train.state import TrainState

    config = load_config_file(args.config)
    cfg = ModelConfig.from_config(config.model)
    rl = resolved_rl(config)
    params = init(cfg, jax.random.PRNGKey(0))
    ref_params = jax.tree.map(lambda x: x * 1.0, params)
    batch = synthetic_batch(cfg, args.rows, args.row_len)
    mask = batch["loss_mask"] > 0

    learners, states, outs = {}, {}, {}
    t0 = time.perf_counter()
    for name in names:
        learners[name] = rl_learner.make_learner(cfg, rl, params)
        states[name] = TrainState.create(params, learners[name].tx)  # every call updates from this state

    def one_call(name):
        with perf.switched(variants[name]):
            ln, state = learners[name], states[name]
            lp_free, _ = ln.logp(params, batch, replay=False)
            lp_ref, _ = ln.logp(ref_params, batch, replay=True)
            state, m, (lp, _) = ln.update_with_logp(state, batch, lp_ref, 0)
            return jax.block_until_ready((lp, lp_free, lp_ref, m))

    for name in names:
        outs[name] = jax.device_get(one_call(name))  # compiles

    def grads_of(name, lp_ref):
        """The loss gradient of `name`'s learner at the shared parameters, element by element."""
        with perf.switched(variants[name]):
            return jax.device_get(learners[name].grads(params, batch, lp_ref, 0)[0])
    print(f"model: {args.config} ({cfg.num_layers} layers, d {cfg.hidden_size}, vocab {cfg.vocab_size}); batch "
          f"{args.rows} rows x {args.row_len} positions, {int(mask.sum())} policy tokens "
          f"({mask.mean():.0%}); compiled {len(names)} variant(s) in {time.perf_counter() - t0:.1f} s")
    base = outs["default"]
    base_grads = grads_of("default", base[2]) if len(names) > 1 else None
    for name in names[1:]:
        o = outs[name]
        d = max(float(np.abs(np.asarray(o[i]) - np.asarray(base[i]))[mask].max()) for i in range(3))
        rel = max(abs(float(o[3][k]) - float(base[3][k])) / max(abs(float(base[3][k])), 1e-12)
                  for k in ("loss", "grad_norm"))
        g_rel, g_where = grad_diff(grads_of(name, base[2]), base_grads)
        ok = d <= 2e-6 and rel <= 1e-5 and g_rel <= GRAD_RTOL
        print(f"parity: {name} vs default: logprob max diff {d:.1e}, loss/grad_norm rel diff {rel:.1e}, "
              f"gradient max diff {g_rel:.1e} of its leaf's largest entry (at {g_where}) "
              f"{'ok' if ok else 'FAILED'}")
        if not ok:
            raise SystemExit("parity gate failed: not timing variants that compute something else")

    times = {n: [] for n in names}
    for _ in range(args.repeats):
        for name in names:
            t = time.perf_counter()
            one_call(name)
            times[name].append(time.perf_counter() - t)
    print(f"\nseconds per learner step (update + 2 diagnostic forwards): median of {args.repeats} [min, max], "
          "variants interleaved")
    med0 = float(np.median(times["default"]))
    for name in names:
        ts = np.asarray(times[name])
        ratio = "" if name == "default" else f"   {np.median(ts) / med0:.2f}x the default"
        print(f"{name:24s} {np.median(ts):.3f} s [{ts.min():.3f}, {ts.max():.3f}]{ratio}")


if __name__ == "__main__":
    main()
