"""Controlled RL experiments: tabular token-level policies trained with the real RL loss.

Some claims of the Composer 2 report are about the RL *objective* (advantage normalisation, length
normalisation, overlong masking, the concave length penalty). Their mechanism is a property of the
gradient estimator, so it can be tested on a small policy whose behaviour statistics have closed
forms or cheap Monte Carlo estimates, trained with exactly the library's loss:
`c2jax.rl.loss.make_rl_loss` (rewards from `c2jax.rl.rewards`, group advantages, the ``pg``
objective, the aggregation) on a batch laid out as `c2jax.batching.pad_batch` lays it out (one
trajectory per row). What is *not* the library's here: the policy (a handful of logits instead of a
transformer) and the optimiser (plain SGD, so the estimator's bias shows directly instead of being
rescaled by Adam's per-parameter normaliser).

Two environments, each a sequence of binary decisions per trajectory (one decision per token):

* `LengthEnv` (an answer, then a body of tokens): token 0 is the answer, right with probability
  ``sigmoid(ans)`` (learnable or fixed); each body token then stops the response with probability
  ``sigmoid(stop[answer])``; a response that has not stopped after ``max_len`` tokens is truncated
  (reward 0, ``truncated=1``). Task reward = right and not truncated; the response length is the
  ``final_message_tokens`` effort field (so the real ``length_penalty`` reward term can price it).
* `EffortEnv` (tool calls by task difficulty): at each step the agent makes another tool call
  with probability ``sigmoid(call[d])`` or finishes; every call after the first joins the previous
  call's turn (a parallel call) with probability ``sigmoid(par[d])``. A serial call is always useful,
  a parallel one with probability ``parallel_useful`` (it cannot react to its turn-mates' results).
  Success iff useful calls >= ``need[d]``. Effort fields: ``tool_calls`` = calls, ``turns`` = serial
  calls + 1 (the final message).

`train` runs ``steps`` on-policy updates (sample a batch of groups, one SGD step on the real loss)
inside one ``lax.scan``; everything is deterministic given the seed.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from c2jax.rl.loss import make_rl_loss
from c2jax.trajectory import EFFORT_FIELDS

Params = dict[str, jax.Array]


def _log_sigmoid_pair(logit: jax.Array, take: jax.Array) -> jax.Array:
    """log sigmoid(logit) where `take` else log(1 - sigmoid(logit)), elementwise."""
    return jnp.where(take, jax.nn.log_sigmoid(logit), jax.nn.log_sigmoid(-logit))


def _effort(n: int, **fields: jax.Array) -> dict[str, jax.Array]:
    """Every EFFORT_FIELDS entry as a float32 [n] array (zeros where not given)."""
    return {f: jnp.asarray(fields.get(f, jnp.zeros((n,))), jnp.float32) for f in EFFORT_FIELDS}


# ---------------------------------------------------------------- environments
@dataclasses.dataclass(frozen=True)
class LengthEnv:
    """Answer then body tokens; see the module docstring. ``p_right`` is the answer probability when
    ``learn_answer`` is False (else the initial one); ``mean_len0`` sets the initial stop logits so
    the expected body length is about ``mean_len0``."""

    groups: int = 16
    group_size: int = 8
    max_len: int = 128
    p_right: float = 0.5
    learn_answer: bool = False
    mean_len0: float = 12.0

    @property
    def n(self) -> int:
        return self.groups * self.group_size

    def init(self) -> Params:
        stop = float(np.log(1.0 / (self.mean_len0 - 1.0)))  # sigmoid(stop) = 1 / mean_len0
        p = {"stop": jnp.full((2,), stop, jnp.float32)}  # [wrong, right]
        if self.learn_answer:
            p["ans"] = jnp.asarray(np.log(self.p_right / (1 - self.p_right)), jnp.float32)
        return p

    def _ans_logit(self, params: Params) -> jax.Array:
        return params["ans"] if self.learn_answer else jnp.asarray(np.log(self.p_right / (1 - self.p_right)))

    def sample(self, params: Params, key: jax.Array) -> dict[str, jax.Array]:
        """Decisions of a batch: answer [N] and body length [N] (tokens before the stop), truncated [N]."""
        params = jax.lax.stop_gradient(params)
        ka, kb = jax.random.split(key)
        right = jax.random.uniform(ka, (self.n,)) < jax.nn.sigmoid(self._ans_logit(params))  # [N]
        p_stop = jax.nn.sigmoid(params["stop"][right.astype(jnp.int32)])  # [N]
        stops = jax.random.uniform(kb, (self.n, self.max_len - 1)) < p_stop[:, None]  # [N, T-1]
        truncated = ~stops.any(-1)
        body = jnp.where(truncated, self.max_len - 1, jnp.argmax(stops, -1))  # [N] continue tokens
        return {"right": right, "body": body, "truncated": truncated}

    def lengths(self, d: dict[str, jax.Array]) -> jax.Array:
        """Response length in tokens [N]: answer + body + the stop token (absent when truncated)."""
        return 1 + d["body"] + (~d["truncated"]).astype(jnp.int32)

    def logp(self, params: Params, d: dict[str, jax.Array]) -> jax.Array:
        """[N, T] log-probability of each sampled decision (0 past the end); differentiable in params."""
        t = jnp.arange(self.max_len)[None, :]  # [1, T]
        lp_ans = _log_sigmoid_pair(self._ans_logit(params), d["right"])  # [N]
        s = params["stop"][d["right"].astype(jnp.int32)][:, None]  # [N, 1]
        k = t - 1  # body position
        body = d["body"][:, None]
        lp_body = jnp.where(k < body, _log_sigmoid_pair(s, False), jnp.where(k == body, jax.nn.log_sigmoid(s), 0.0))
        return jnp.where(t == 0, lp_ans[:, None], lp_body) * self.mask(d)

    def mask(self, d: dict[str, jax.Array]) -> jax.Array:
        return (jnp.arange(self.max_len)[None, :] < self.lengths(d)[:, None]).astype(jnp.float32)  # [N, T]

    def fields(self, d: dict[str, jax.Array]) -> dict[str, Any]:
        n = self.n
        task = (d["right"] & ~d["truncated"]).astype(jnp.float32)
        return {"reward_terms": {"task": task}, "truncated": d["truncated"].astype(jnp.float32),
                "effort": _effort(n, final_message_tokens=self.lengths(d)),
                "tool_stats": {k: jnp.zeros((n,)) for k in ("calls", "malformed", "failed")}}

    def expected(self, params: Params) -> dict[str, float]:
        """Closed forms under `params`: expected length of right / wrong responses, truncation and pass rates."""
        out = {}
        T = self.max_len
        k = np.arange(1, T)
        for i, name in ((0, "wrong"), (1, "right")):
            c = 1.0 - float(jax.nn.sigmoid(params["stop"][i]))  # continue probability
            trunc = c ** (T - 1)
            out[f"len_{name}"] = 1.0 + float(np.sum(c ** k)) + (1.0 - trunc)
            out[f"truncated_{name}"] = trunc
        p = float(jax.nn.sigmoid(self._ans_logit(params)))
        out["p_right"] = p
        out["pass_rate"] = p * (1.0 - out["truncated_right"])
        return out


@dataclasses.dataclass(frozen=True)
class EffortEnv:
    """Tool calls per task difficulty; see the module docstring. Groups cycle over the difficulties."""

    need: tuple[int, ...] = (1, 3, 6)
    groups: int = 24
    group_size: int = 8
    max_calls: int = 24
    parallel_useful: float = 0.75
    call0: float = 0.0  # initial call logit (mean calls ~1 at 0)
    par0: float = 0.0  # initial parallel logit

    @property
    def n(self) -> int:
        return self.groups * self.group_size

    @property
    def max_len(self) -> int:
        return self.max_calls + 1  # one decision token per call, plus the finish decision

    def difficulty(self) -> jax.Array:
        return (jnp.arange(self.n) // self.group_size) % len(self.need)  # [N]

    def init(self) -> Params:
        D = len(self.need)
        return {"call": jnp.full((D,), self.call0, jnp.float32), "par": jnp.full((D,), self.par0, jnp.float32)}

    def sample(self, params: Params, key: jax.Array, diff: jax.Array | None = None) -> dict[str, jax.Array]:
        params = jax.lax.stop_gradient(params)
        diff = self.difficulty() if diff is None else diff
        n, C = diff.shape[0], self.max_calls
        kc, kp, ku = jax.random.split(key, 3)
        p_call = jax.nn.sigmoid(params["call"][diff])[:, None]  # [N, 1]
        stop = jax.random.uniform(kc, (n, C)) >= p_call  # [N, C] finish at step k
        capped = ~stop.any(-1)
        calls = jnp.where(capped, C, jnp.argmax(stop, -1))  # [N]
        par = jax.random.uniform(kp, (n, C)) < jax.nn.sigmoid(params["par"][diff])[:, None]  # [N, C]
        par = par.at[:, 0].set(False)  # the first call opens a turn
        made = jnp.arange(C)[None, :] < calls[:, None]  # [N, C]
        useful = jnp.where(par, jax.random.uniform(ku, (n, C)) < self.parallel_useful, True) & made
        need = jnp.asarray(self.need)[diff]
        return {"diff": diff, "calls": calls, "capped": capped, "par": par & made,
                "success": (useful.sum(-1) >= need) & ~capped}

    def logp(self, params: Params, d: dict[str, jax.Array]) -> jax.Array:
        """[N, T]: token k < calls is 'call' (+ its parallel choice for k >= 1), token `calls` is 'finish'."""
        T = self.max_len
        k = jnp.arange(T)[None, :]  # [1, T]
        c = params["call"][d["diff"]][:, None]  # [N, 1]
        pl = params["par"][d["diff"]][:, None]
        calls = d["calls"][:, None]
        par = jnp.pad(d["par"], ((0, 0), (0, 1)))  # [N, T]
        lp = jnp.where(k < calls, _log_sigmoid_pair(c, True) + jnp.where(k >= 1, _log_sigmoid_pair(pl, par), 0.0),
                       jnp.where(k == calls, _log_sigmoid_pair(c, False), 0.0))
        return lp * self.mask(d)

    def mask(self, d: dict[str, jax.Array]) -> jax.Array:
        length = d["calls"] + (~d["capped"]).astype(jnp.int32)
        return (jnp.arange(self.max_len)[None, :] < length[:, None]).astype(jnp.float32)

    def turns(self, d: dict[str, jax.Array]) -> jax.Array:
        made = jnp.arange(self.max_calls)[None, :] < d["calls"][:, None]
        return (made & ~d["par"]).sum(-1) + 1  # serial calls + the final message

    def fields(self, d: dict[str, jax.Array]) -> dict[str, Any]:
        n = d["calls"].shape[0]
        return {"reward_terms": {"task": d["success"].astype(jnp.float32)},
                "truncated": d["capped"].astype(jnp.float32),
                "effort": _effort(n, tool_calls=d["calls"], turns=self.turns(d)),
                "tool_stats": {k: jnp.zeros((n,)) for k in ("calls", "malformed", "failed")}}

    def behaviour(self, params: Params, key: jax.Array, per_difficulty: int = 4096) -> dict[str, list[float]]:
        """Monte Carlo behaviour under `params`, per difficulty: pass rate, mean calls, the number of
        turns with at least one call and of those with more than one, and their ratio."""
        D = len(self.need)
        diff = jnp.repeat(jnp.arange(D), per_difficulty)
        d = self.sample(params, key, diff)
        made = jnp.arange(self.max_calls)[None, :] < d["calls"][:, None]
        opens = made & ~d["par"]  # a serial call opens a turn
        multi = opens & jnp.pad(d["par"][:, 1:], ((0, 0), (0, 1)))  # the next call joins it
        out: dict[str, list[float]] = {"pass": [], "calls": [], "multi_call_turn_share": [], "turns_with_calls": [],
                                       "multi_call_turns": []}
        for i in range(D):
            sel = np.asarray(d["diff"] == i)
            out["pass"].append(float(np.asarray(d["success"])[sel].mean()))
            out["calls"].append(float(np.asarray(d["calls"])[sel].mean()))
            n_turns, n_multi = float(np.asarray(opens)[sel].sum()), float(np.asarray(multi)[sel].sum())
            out["turns_with_calls"].append(n_turns)
            out["multi_call_turns"].append(n_multi)
            out["multi_call_turn_share"].append(n_multi / max(n_turns, 1.0))
        return out


# ---------------------------------------------------------------- the batch and the training loop
def rl_batch(env: Any, d: dict[str, jax.Array], behaviour_logp: jax.Array) -> dict[str, Any]:
    """The `pad_batch` layout of one trajectory per row (B = N rows, L = env.max_len)."""
    n, T = behaviour_logp.shape
    mask = env.mask(d)  # [N, T]
    traj = jnp.where(mask > 0, jnp.arange(n)[:, None], -1).astype(jnp.int32)
    batch = {"loss_mask": mask, "behaviour_logp": behaviour_logp * mask, "traj_index": traj,
             "traj_valid": jnp.ones((n,), jnp.float32), "infra_failed": jnp.zeros((n,), jnp.float32),
             "group_index": (jnp.arange(n) // env.group_size).astype(jnp.int32)}
    batch.update(env.fields(d))
    return batch


def train(env: Any, rl_cfg: dict, *, steps: int, lr: float, seed: int,
          stats: Callable[[Any, dict], dict] | None = None) -> tuple[Params, dict[str, np.ndarray]]:
    """`steps` on-policy SGD updates of `env`'s policy on ``make_rl_loss(rl_cfg)``.

    Returns the final parameters and the per-step history of ``stats(env, decisions)`` (default: the
    batch's mean reward), the loss and the policy-gradient norm. Raises before any compute on a bad
    `rl_cfg` (the loss's own checks) or a non-positive `steps` / `lr`.
    """
    if steps < 1 or not lr > 0:
        raise ValueError(f"train: steps must be >= 1 and lr > 0, got steps={steps}, lr={lr}")
    loss_fn = make_rl_loss(rl_cfg)
    stats = stats or (lambda e, d: {})

    def one(params, key):
        d = env.sample(params, key)
        beh = jax.lax.stop_gradient(env.logp(params, d))
        batch = rl_batch(env, d, beh)
        (loss, m), g = jax.value_and_grad(lambda p: loss_fn(env.logp(p, d), batch), has_aux=True)(params)
        params = jax.tree_util.tree_map(lambda p, gi: p - lr * gi, params, g)
        rec = {"loss": loss, "reward": m["reward/total"],
               "grad_norm": jnp.sqrt(sum(jnp.sum(x * x) for x in jax.tree_util.tree_leaves(g)))}
        rec.update(stats(env, d))
        return params, rec

    keys = jax.random.split(jax.random.PRNGKey(seed), steps)
    params, hist = jax.jit(lambda p, k: jax.lax.scan(one, p, k))(env.init(), keys)
    return params, {k: np.asarray(v) for k, v in hist.items()}
