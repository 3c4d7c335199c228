"""CPT budget -> RL reward at micro scale, with the real train step, engine and RL learner.

One "language": token sequences that follow t[i+1] = (MUL t[i] + ADD) mod V, with a share ``noise``
of tokens replaced at random. Continued pretraining (`c2jax.train.step.make_train_step`, xent, AdamW
at a constant learning rate, the rl_quickstart:smoke model shape with vocabulary V) runs to the
largest budget, and the parameters are kept at every budget on the way: with a constant learning
rate the first B steps of a longer run *are* the B-step run. For each budget: the held-out CPT loss
(fixed held-out batches), then an identical RL run from those weights (the sampling engine rolls out
groups of continuations of rule prompts, reward = share of generated tokens that follow the rule,
`pad_batch`, the real learner's update, new weights to the engine) and the mean reward of the final
policy on held-out prompts (temperature 1). The task the RL stage rewards is the one CPT teaches,
as in the report (code pretraining, code RL); whether RL from a weaker base catches up is what the
correlation can show, and the detail keeps the reward before RL for that.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

MUL, ADD = 7, 3


def rule_batch(rng: np.random.Generator, vocab: int, batch: int, seq: int, noise: float) -> np.ndarray:
    """[batch, seq + 1] int32 token rows following the rule, a share `noise` replaced at random."""
    t = np.empty((batch, seq + 1), np.int64)
    t[:, 0] = rng.integers(0, vocab, batch)
    for j in range(1, seq + 1):
        t[:, j] = (MUL * t[:, j - 1] + ADD) % vocab
    flip = rng.random(t.shape) < noise
    return np.where(flip, rng.integers(0, vocab, t.shape), t).astype(np.int32)


def rule_reward(prompt_last: int, completion: Sequence[int], vocab: int) -> float:
    """Share of completion tokens equal to the rule applied to the token before them."""
    prev, ok = int(prompt_last), 0
    for tok in completion:
        ok += int(tok) == (MUL * prev + ADD) % vocab
        prev = int(tok)
    return ok / max(len(completion), 1)


def _lm_batch(rows: np.ndarray) -> dict:
    import jax.numpy as jnp

    b, s1 = rows.shape
    s = s1 - 1
    return {"tokens": jnp.asarray(rows[:, :-1]), "targets": jnp.asarray(rows[:, 1:]),
            "loss_mask": jnp.ones((b, s), jnp.float32), "segment_ids": jnp.ones((b, s), jnp.int32),
            "positions": jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))}


def cpt_snapshots(cfg: Any, seed: int, budgets: Sequence[int], *, lr: float, batch: int, seq: int,
                  noise: float, eval_batches: int = 4) -> list[tuple[int, Any, float]]:
    """[(budget, params, held-out xent)] along one constant-lr CPT run of max(budgets) steps."""
    import jax

    from c2jax.losses import masked_mean, token_nll
    from c2jax.model import init
    from c2jax.model.params_spec import logical_axes, trainable_mask
    from c2jax.train import optim
    from c2jax.train.pretrain import model_apply_fn
    from c2jax.train.state import TrainState
    from c2jax.train.step import make_train_step

    if not budgets or min(budgets) < 0:
        raise ValueError(f"cpt budgets must be a non-empty list of steps >= 0, got {list(budgets)}")
    params = init(cfg, jax.random.PRNGKey(seed))
    sched = optim.make_schedule({"name": "constant", "peak_lr": lr}, 1_000_000)
    tx = optim.make_optimizer({"name": "adamw", "clip_norm": 1.0, "weight_decay": 0.0}, sched, params,
                              trainable=trainable_mask(cfg), axes=logical_axes(cfg))
    state = TrainState.create(params, tx)
    apply_fn = model_apply_fn(cfg)
    step = jax.jit(make_train_step(apply_fn, {"xent": 1.0}, bias_update_rate=1e-3))
    held = [_lm_batch(rule_batch(np.random.default_rng(10**6 + i), cfg.vocab_size, batch, seq, noise))
            for i in range(eval_batches)]
    xent = jax.jit(lambda p, b: masked_mean(token_nll(apply_fn(p, b)["logits"], b["targets"]), b["loss_mask"]))
    rng = np.random.default_rng(seed)
    out, done = [], 0
    for budget in sorted(set(int(b) for b in budgets)):
        while done < budget:
            state, _ = step(state, _lm_batch(rule_batch(rng, cfg.vocab_size, batch, seq, noise)))
            done += 1
        loss = float(np.mean([float(xent(state.params, b)) for b in held]))
        out.append((budget, jax.tree_util.tree_map(lambda x: x, state.params), loss))
    return out


def _rule_requests(rng: np.random.Generator, vocab: int, prompts: int, group: int, prompt_len: int, new: int) -> list:
    from c2jax.sampling import Request, SamplingParams

    reqs = []
    for i in range(prompts):
        ids = rule_batch(rng, vocab, 1, prompt_len - 1, 0.0)[0].tolist()
        for j in range(group):
            reqs.append(Request(ids, SamplingParams(temperature=1.0, max_new_tokens=new,
                                                    seed=int(rng.integers(0, 2**31))), id=f"p{i}g{j}"))
    return reqs


def _mean_reward(results: list, vocab: int) -> list[float]:
    return [rule_reward(r.tokens[r.prompt_len - 1], r.tokens[r.prompt_len:], vocab) for r in results]


def cpt_then_rl(seed: int, budgets: Sequence[int], *, vocab: int = 256, cpt_lr: float = 3e-3, cpt_batch: int = 8,
                cpt_seq: int = 64, noise: float = 0.1, rl_steps: int = 6, rl_lr: float = 3e-4, prompts: int = 4,
                group_size: int = 4, prompt_len: int = 8, new_tokens: int = 8, eval_prompts: int = 32) -> list[dict]:
    """One row per budget: {budget, cpt_loss, reward_before, reward_after} (see the module docstring)."""
    from c2jax.batching import pad_batch
    from c2jax.sampling import Engine, EngineConfig
    from c2jax.train.rl_learner import make_learner
    from c2jax.train.state import TrainState
    from c2jax.workflow.rl_probes import smoke_setup, trajectories

    if rl_steps < 1 or vocab < 16:
        raise ValueError(f"cpt_then_rl: rl_steps >= 1 and vocab >= 16 needed, got {rl_steps}, {vocab}")
    cfg, rl, _ = smoke_setup(seed, learning_rate=float(rl_lr), group_size=group_size, warmup_steps=0, steps=rl_steps)
    cfg = cfg.replace(vocab_size=vocab)
    rl["rewards"] = {"task": {"weight": 1.0}}
    snaps = cpt_snapshots(cfg, seed, budgets, lr=cpt_lr, batch=cpt_batch, seq=cpt_seq, noise=noise)
    learner = make_learner(cfg, rl, snaps[0][1])
    n, max_len = prompts * group_size, prompt_len + new_tokens + 8
    engine = Engine(snaps[0][1], cfg, EngineConfig(max_slots=max(n, eval_prompts), max_len=max_len,
                                                   prefix_reuse=False), version=0)
    rows, version = [], 0

    def evaluate(rng):
        res = engine.generate(_rule_requests(rng, vocab, eval_prompts, 1, prompt_len, new_tokens))
        return float(np.mean(_mean_reward(res, vocab)))

    try:
        for budget, params, loss in snaps:
            version += 1
            engine.update_weights(params, version)
            before = evaluate(np.random.default_rng(7_000 + seed))
            state = TrainState.create(params, learner.tx)
            rng = np.random.default_rng(seed * 1000 + 1)  # the same RL prompts and seeds for every budget
            for step in range(rl_steps):
                res = engine.generate(_rule_requests(rng, vocab, prompts, group_size, prompt_len, new_tokens))
                trajs = trajectories(res, group_size, f"b{budget}s{step}")
                for t, r in zip(trajs, _mean_reward(res, vocab)):
                    t.reward_terms["task"] = r
                batch = pad_batch(trajs, max_len, num_rows=n, max_trajectories=n, pack=False)
                state, _ = learner.update(state, batch, None, step)
                version += 1
                engine.update_weights(state.params, version)
            rows.append({"seed": seed, "budget": budget, "cpt_loss": loss, "reward_before": before,
                         "reward_after": evaluate(np.random.default_rng(7_000 + seed))})
    finally:
        engine.shutdown()
    return rows
