"""The jitted train step and eval step: pure functions of (state, batch), built from the loss registry.

    step_fn = make_train_step(apply_fn, loss_cfg, accum_steps=2, bias_update_rate=1e-3)
    state, metrics = jax.jit(step_fn, donate_argnums=0)(state, batch)

``apply_fn(params, batch) -> outputs`` is the model's forward pass on a packed batch (see
`c2jax.losses` for the batch and output layouts). Nothing here reads Python globals or devices, so
the same function runs under a mesh: jit it with in/out shardings for ``state`` and ``batch``.

* Gradient accumulation: the [B, S] batch is split into ``accum_steps`` micro-batches of
  B / accum_steps rows, scanned with `lax.scan`; gradients and metrics are averaged.
* Clipping, AdamW / Muon and the frozen-parameter mask live in ``state.tx`` (`c2jax.train.optim`).
* Aux-loss-free balancing (DeepSeek-V3): after the optimizer update, each MoE layer's router bias
  moves by ``rate * sign(mean load - load_e)`` using the step's ``expert_counts``; it never sees a
  gradient.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

import jax
import jax.numpy as jnp
import optax

from c2jax.losses import combined_loss, token_nll
from c2jax.train.state import TrainState

ApplyFn = Callable[[Any, Mapping[str, jax.Array]], Mapping[str, Any]]
BiasUpdateFn = Callable[[Any, Any, float], Any]


def aux_free_bias_update(params: Any, expert_counts: Any, rate: float) -> Any:
    """Default bias rule: the model's own aux-loss-free update (`c2jax.model.update_router_bias`),
    one implementation for the trainer and the model. ``expert_counts``: [L, E] token counts per
    MoE layer, or ``{'moe_layers': [L, E], 'mtp': [D, E]}``."""
    from c2jax.model.moe_router import update_router_bias

    return update_router_bias(params, expert_counts, rate)


def _split_micro(batch: Mapping[str, jax.Array], accum: int) -> dict:
    """[B, ...] -> [accum, B / accum, ...] for every batch leaf."""
    def split(x):
        if x.shape[0] % accum:
            raise ValueError(f"batch size {x.shape[0]} is not divisible by accum_steps={accum}")
        return x.reshape((accum, x.shape[0] // accum) + x.shape[1:])
    return {k: split(v) for k, v in batch.items()}


def make_train_step(apply_fn: ApplyFn, loss_cfg: Any, *, accum_steps: int = 1,
                    bias_update_rate: float = 0.0, bias_update_fn: Optional[BiasUpdateFn] = None,
                    schedule: Optional[optax.Schedule] = None,
                    term_start_steps: Optional[Mapping[str, int]] = None) -> Callable[[TrainState, Mapping[str, jax.Array]], tuple[TrainState, dict]]:
    """Build ``train_step(state, batch) -> (state, metrics)`` (not yet jitted).

    ``term_start_steps``: ``{term: step}`` turns a loss term on only from that step (MTP
    self-distillation started from a mid-run checkpoint).
    """
    bias_update_fn = bias_update_fn or aux_free_bias_update
    starts = dict(term_start_steps or {})

    def loss_fn(params, micro, step):
        outputs = apply_fn(params, micro)
        gates = {k: (step >= v).astype(jnp.float32) for k, v in starts.items()}
        loss, metrics = combined_loss(outputs, micro, loss_cfg, gates)
        counts = outputs.get("expert_counts")
        if outputs.get("mtp_expert_counts") is not None:
            counts = {"moe_layers": counts, "mtp": outputs["mtp_expert_counts"]}
        if counts is not None:
            counts = jax.tree_util.tree_map(lambda c: c.astype(jnp.float32), counts)
        return loss, (metrics, counts)

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def train_step(state: TrainState, batch: Mapping[str, jax.Array]) -> tuple[TrainState, dict]:
        if accum_steps == 1:
            (loss, (metrics, counts)), grads = grad_fn(state.params, batch, state.step)
        else:
            micro = _split_micro(batch, accum_steps)
            first = jax.tree_util.tree_map(lambda x: x[0], micro)
            shapes = jax.eval_shape(grad_fn, state.params, first, state.step)
            zeros = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

            def body(acc, mb):
                out = grad_fn(state.params, mb, state.step)
                return jax.tree_util.tree_map(jnp.add, acc, out), None

            acc, _ = jax.lax.scan(body, zeros, micro)
            (loss, (metrics, counts)), grads = acc
            scale = 1.0 / accum_steps
            loss = loss * scale
            grads = jax.tree_util.tree_map(lambda g: g * scale, grads)
            metrics = jax.tree_util.tree_map(lambda m: m * scale, metrics)
            if "xent/tokens" in metrics:  # token counts add up rather than average
                metrics["xent/tokens"] = metrics["xent/tokens"] * accum_steps
        updates, opt_state = state.tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        if bias_update_rate and counts is not None:
            params = bias_update_fn(params, counts, bias_update_rate)
        metrics = dict(metrics)
        metrics["loss"] = loss
        metrics["grad_norm"] = optax.global_norm(grads)
        metrics["update_norm"] = optax.global_norm(updates)
        if schedule is not None:
            metrics["lr"] = jnp.asarray(schedule(state.step), jnp.float32)
        if counts is not None:
            c = jnp.asarray(jax.tree_util.tree_leaves(counts)[0], jnp.float32)
            if c.size:
                metrics["moe/max_over_mean_load"] = jnp.max(
                    c / jnp.maximum(jnp.mean(c, -1, keepdims=True), 1e-9))
        return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

    return train_step


def make_eval_step(apply_fn: ApplyFn) -> Callable[[Any, Mapping[str, jax.Array]], tuple[jax.Array, jax.Array]]:
    """``eval_step(params, batch) -> (sum of masked NLL, number of masked tokens)`` (float32 [])."""

    def eval_step(params, batch):
        outputs = apply_fn(params, batch)
        nll = token_nll(outputs["logits"], batch["targets"])  # [B, S]
        m = batch["loss_mask"].astype(jnp.float32)
        return jnp.sum(nll * m), jnp.sum(m)

    return eval_step
