"""The "smoke" stage: build the model from ``config.model``, run a forward pass and a few AdamW
steps on a fixed batch of random tokens, and report the losses.

It proves the whole path (config -> ModelConfig -> jit init -> apply -> loss -> grad -> optax ->
aux-loss-free bias update) works for a config, on any backend, in seconds for `tiny`:

    python experiments/run.py --config experiments/configs/tiny.py --workdir /tmp/tiny

``config.smoke``: batch_size (>= 1), seq_len (>= 2, <= model.max_position_embeddings),
steps (>= 0), learning_rate (> 0), optional mtp_loss_weight (>= 0, default 0.3).
The loss is next-token cross-entropy (+ mtp_loss_weight x the MTP cross-entropy, + the
sequence-wise balance loss when enabled); on a fixed batch it must fall. The router correction
bias is excluded from the optimizer (`trainable_mask`) and moved by `update_router_bias`.
Summary keys: n_params, n_active_params, initial_loss, losses, final_loss, log_vocab,
loss_decreased, tokens_per_s (train steps after compile), dropped_fraction, moe_impl.
"""
from __future__ import annotations

import math
import time
from typing import Any

from c2jax.config import Checker, register_validator
from c2jax.train.stages import STAGES

_DEFAULT_MTP_WEIGHT = 0.3


@register_validator("smoke")
def validate_smoke(check: Checker, s: Any, full: Any) -> None:
    check.int_range(s, "batch_size", 1)
    seq = check.int_range(s, "seq_len", 2)
    check.int_range(s, "steps", 0)
    check.float_range(s, "learning_rate", 0.0, lo_open=True)
    if hasattr(s, "get") and s.get("mtp_loss_weight") is not None:
        check.float_range(s, "mtp_loss_weight", 0.0)
    try:
        maxpos = full["model"]["max_position_embeddings"]
    except (KeyError, TypeError):
        maxpos = None
    if seq is not None and isinstance(maxpos, int) and seq > maxpos:
        check.error("seq_len", f"must be <= model.max_position_embeddings={maxpos}, got {seq}")


def _xent(logits, targets, mask):
    """Mean cross-entropy of logits [B, S, V] against targets [B, S] where mask [B, S]."""
    import jax
    import jax.numpy as jnp

    lse = jax.nn.logsumexp(logits, axis=-1)
    tgt = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    m = mask.astype(jnp.float32)
    return jnp.sum((lse - tgt) * m) / jnp.maximum(m.sum(), 1.0)


def smoke_loss(params, tokens, cfg, mtp_weight: float):
    """Next-token loss (+ MTP, + balance) on tokens [B, S]; returns (loss, (main_loss, out))."""
    import jax.numpy as jnp

    from c2jax.model.transformer import apply

    out = apply(params, tokens, cfg)
    b, s = tokens.shape
    targets = jnp.pad(tokens[:, 1:], ((0, 0), (0, 1)))
    pos = jnp.arange(s)[None]
    main = _xent(out["logits"], targets, jnp.broadcast_to(pos < s - 1, (b, s)))
    loss = main + out["balance_loss"]
    if out["mtp_logits"] is not None and mtp_weight > 0:
        mtp = 0.0
        for k in range(cfg.mtp_depth):  # depth k+1 predicts t[i + k + 2]
            tk = jnp.pad(tokens[:, k + 2:], ((0, 0), (0, k + 2)))
            mtp = mtp + _xent(out["mtp_logits"][k], tk, jnp.broadcast_to(pos < s - k - 2, (b, s)))
        loss = loss + mtp_weight * mtp / cfg.mtp_depth
    return loss, (main, out)


@STAGES.register("smoke")
def smoke_stage(config: Any, workdir: str, state: dict) -> tuple[dict, dict]:
    import jax
    import jax.numpy as jnp
    import optax

    from c2jax.model.config import ModelConfig, count_active_params, count_params
    from c2jax.model.moe_router import update_router_bias
    from c2jax.model.params_spec import trainable_mask
    from c2jax.model.transformer import init

    cfg = ModelConfig.from_config(config.model)
    sm = config.smoke
    mtp_weight = float(sm.get("mtp_loss_weight", _DEFAULT_MTP_WEIGHT) if hasattr(sm, "get") else _DEFAULT_MTP_WEIGHT)
    seed = int(config.get("seed", 0)) if hasattr(config, "get") else 0
    k_init, k_data = jax.random.split(jax.random.key(seed))
    t0 = time.time()
    params = init(cfg, k_init)
    tokens = jax.random.randint(k_data, (sm.batch_size, sm.seq_len), 0, cfg.vocab_size, jnp.int32)

    tx = optax.masked(optax.adamw(sm.learning_rate, weight_decay=0.0), trainable_mask(cfg))
    opt_state = tx.init(params)
    rate = cfg.moe.bias_update_rate

    @jax.jit
    def train_step(params, opt_state):
        (loss, (main, out)), grads = jax.value_and_grad(smoke_loss, has_aux=True)(params, tokens, cfg, mtp_weight)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        counts = {"moe_layers": out["expert_counts"], "mtp": out["mtp_expert_counts"]}
        params = update_router_bias(params, counts, rate)
        return params, opt_state, loss, main, jnp.mean(out["dropped_fraction"]) if cfg.n_moe_layers else 0.0

    fwd = jax.jit(lambda p: smoke_loss(p, tokens, cfg, mtp_weight)[1][0])
    initial = float(fwd(params))
    compile_s = time.time() - t0
    losses, dropped, t_steps = [], [], 0.0
    for i in range(sm.steps):
        t1 = time.time()
        params, opt_state, loss, main, drop = train_step(params, opt_state)
        loss = float(loss)
        if i > 0:
            t_steps += time.time() - t1
        losses.append(loss)
        dropped.append(float(drop))
        if not math.isfinite(loss):
            raise FloatingPointError(f"smoke: non-finite loss {loss} at step {i}")
    final = float(fwd(params))
    timed = max(sm.steps - 1, 0)
    summary = {
        "n_params": count_params(cfg, include_mtp=True),
        "n_active_params": count_active_params(cfg),
        "moe_impl": cfg.moe.impl,
        "initial_loss": initial,
        "log_vocab": math.log(cfg.vocab_size),
        "losses": losses,
        "final_loss": final,
        "loss_decreased": bool(final < initial),
        "dropped_fraction": dropped,
        "tokens_per_s": (timed * tokens.size / t_steps) if t_steps > 0 else None,
        "init_and_forward_compile_s": compile_s,
    }
    print(f"smoke: {cfg.num_layers} layers, {summary['n_params']:,} params; loss {initial:.4f} -> "
          f"{final:.4f} (ln V = {summary['log_vocab']:.4f}) after {sm.steps} steps")
    return {"params": params, "model_config": cfg}, summary
