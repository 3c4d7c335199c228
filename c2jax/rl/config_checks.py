"""Validator of the `rl` config section: names exist, ranges hold, and known pitfalls warn.

Errors (fail before compute): group size < 2 (no baseline), unknown advantage / objective /
aggregation / KL estimator / reward-term names, keyword arguments a piece does not take,
out-of-range clip ranges, caps, coefficients, and length-penalty parameters.
Warnings (legal, probably unintended): k1 placed in the loss (zero expected gradient), k3 in the
loss (gradient of the reverse KL), k2 in the reward (biased). k2 in the loss is accepted: its
gradient is the per-token KL gradient with the state distribution held fixed (see kl.py), std-normalised advantages and
sequence-mean-token-mean aggregation (the biases Dr. GRPO removes), a truncated-IS cap < 1.
"""
from __future__ import annotations

import inspect
from typing import Any, Mapping

from c2jax.config import Checker, register_validator, to_plain
from c2jax.rl.advantages import ADVANTAGES
from c2jax.rl.aggregation import AGGREGATIONS
from c2jax.rl.kl import KL_ESTIMATORS, KL_PLACEMENTS
from c2jax.rl.stage_config import STAGE_KEYS, validate_rl_stage
from c2jax.rl.loss import resolve_rl_config
from c2jax.rl.objectives import POLICY_LOSSES
from c2jax.rl.rewards import REWARD_TERMS, term_spec
from c2jax.trajectory import EFFORT_FIELDS

_NOT_KWARGS = {"rewards", "group_index", "valid", "logp", "adv", "mask", "behaviour_logp", "per_token",
               "traj_index", "num_traj", "batch", "old_logp"}


def _kwargs_ok(check: Checker, key: str, fn: Any, kwargs: Mapping[str, Any]) -> None:
    params = inspect.signature(fn).parameters
    allowed = {p for p, v in params.items() if v.kind == v.KEYWORD_ONLY} - _NOT_KWARGS
    for k in kwargs:
        if k not in allowed:
            check.error(f"{key}.{k}", f"not an option of {fn.__name__}; options: {sorted(allowed)}")


def _num(check: Checker, key: str, v: Any, lo: float | None = None, lo_open: bool = False, hi: float | None = None,
         allow_none: bool = False) -> float | None:
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
        check.error(key, f"must be a number, got {v!r}")
        return None
    if lo is not None and (v <= lo if lo_open else v < lo):
        check.error(key, f"must be {'>' if lo_open else '>='} {lo}, got {v}")
        return None
    if hi is not None and v > hi:
        check.error(key, f"must be <= {hi}, got {v}")
        return None
    return float(v)


def _named(check: Checker, key: str, section: Mapping[str, Any], registry) -> tuple[Any, dict] | None:
    if not isinstance(section, Mapping):
        check.error(key, f"must be a dict with a 'name', got {section!r}")
        return None
    kwargs = dict(section)
    name = kwargs.pop("name", None)
    if name not in registry:
        check.error(f"{key}.name", f"unknown {registry.kind} {name!r}; known: {registry.names()}")
        return None
    fn = registry.get(name)
    _kwargs_ok(check, key, fn, kwargs)
    return name, kwargs


@register_validator("rl")
def validate_rl(check: Checker, rl: Any, full: Any) -> None:
    c = resolve_rl_config(rl)
    known = {"group_size", "behaviour_logprobs", "overlong_mask", "advantage", "objective", "aggregation", "kl",
             "rewards", "token_filter"} | set(STAGE_KEYS)
    raw = to_plain(rl) or {}
    for k in raw:
        if k not in known:
            check.error(k, f"unknown rl option; known: {sorted(known)}")
    validate_rl_stage(check, raw, full)
    tf = c.get("token_filter")
    if not isinstance(tf, dict):
        check.error("token_filter", f"must be a dict(name=..., fraction=...), got {tf!r}")
    else:
        from c2jax.rl.loss import TOKEN_FILTERS

        for k in tf:
            if k not in ("name", "fraction"):
                check.error(f"token_filter.{k}", "unknown option; known: ['fraction', 'name']")
        if tf.get("name") not in TOKEN_FILTERS:
            check.error("token_filter.name", f"must be one of {list(TOKEN_FILTERS)}, got {tf.get('name')!r}")
        _num(check, "token_filter.fraction", tf.get("fraction"), lo=0.0, lo_open=True, hi=1.0)

    g = c["group_size"]
    if isinstance(g, bool) or not isinstance(g, int) or g < 2:
        check.error("group_size", f"must be an integer >= 2 (a group of 1 has no baseline), got {g!r}")

    if c["behaviour_logprobs"] not in ("sampling", "raw"):
        check.error("behaviour_logprobs", f"must be 'sampling' or 'raw', got {c['behaviour_logprobs']!r}")
    if not isinstance(c["overlong_mask"], bool):
        check.error("overlong_mask", f"must be a bool, got {c['overlong_mask']!r}")

    adv = _named(check, "advantage", c["advantage"], ADVANTAGES)
    if adv:
        _, kw = adv
        if kw.get("std_normalize"):
            check.warn("advantage.std_normalize", "dividing by the group std amplifies tiny differences in "
                       "near-uniform groups and biases prompt weighting; Composer 2 / Dr. GRPO leave it off")
        if "scale" in kw:
            _num(check, "advantage.scale", kw["scale"], lo=0.0, lo_open=True)
        if "std_eps" in kw:
            _num(check, "advantage.std_eps", kw["std_eps"], lo=0.0, lo_open=True)
        if "positive_weight" in kw:
            _num(check, "advantage.positive_weight", kw["positive_weight"], lo=0.0)
        if "k" in kw:
            kk, g = kw["k"], c["group_size"]
            if isinstance(kk, bool) or not isinstance(kk, int) or kk < 1:
                check.error("advantage.k", f"must be an integer >= 1 (1 = plain mean reward), got {kk!r}")
            elif adv[0] == "rloo" and kk != 1:
                check.error("advantage.k", f"rloo supports k = 1 only, got {kk}; use advantage.name='grpo' for max-of-k")
            elif isinstance(g, int) and not isinstance(g, bool) and kk >= g:
                check.error("advantage.k", f"must be < group_size ({g}): with k >= G every sample's max-of-k "
                            f"is the group max and all advantages are 0, got {kk}")

    obj = _named(check, "objective", c["objective"], POLICY_LOSSES)
    if obj:
        _, kw = obj
        if "clip_low" in kw:
            _num(check, "objective.clip_low", kw["clip_low"], lo=0.0, hi=1.0)
        if "clip_high" in kw:
            _num(check, "objective.clip_high", kw["clip_high"], lo=0.0)
        cap = _num(check, "objective.tis_cap", kw.get("tis_cap"), lo=0.0, lo_open=True, allow_none=True)
        if cap is not None and cap < 1.0:
            check.warn("objective.tis_cap", f"a cap of {cap} < 1 down-weights even on-policy tokens")
        if kw.get("tis_mode", "truncate") not in ("truncate", "mask"):
            check.error("objective.tis_mode", f"must be 'truncate' or 'mask', got {kw.get('tis_mode')!r}")

    agg = _named(check, "aggregation", c["aggregation"], AGGREGATIONS)
    if agg:
        name, kw = agg
        _num(check, "aggregation.constant", kw.get("constant"), lo=0.0, lo_open=True, allow_none=True)
        if name == "seq_mean_token_mean":
            check.warn("aggregation.name", "per-sequence 1/|o| averaging biases towards short correct and long "
                       "wrong answers; Composer 2 / Dr. GRPO use 'constant'")

    kl = c["kl"]
    known_kl = {"coef", "estimator", "placement", "log_ratio_clip"}
    for k in kl:
        if k not in known_kl:
            check.error(f"kl.{k}", f"unknown option; known: {sorted(known_kl)}")
    coef = _num(check, "kl.coef", kl.get("coef", 0.0), lo=0.0)
    est = kl.get("estimator", "k1")
    place = kl.get("placement", "reward")
    if est not in KL_ESTIMATORS:
        check.error("kl.estimator", f"unknown KL estimator {est!r}; known: {KL_ESTIMATORS.names()}")
    if place not in KL_PLACEMENTS:
        check.error("kl.placement", f"must be one of {list(KL_PLACEMENTS)}, got {place!r}")
    _num(check, "kl.log_ratio_clip", kl.get("log_ratio_clip"), lo=0.0, lo_open=True, allow_none=True)
    if coef:
        if est == "k1" and place == "loss":
            check.warn("kl.placement", "k1 in the loss has zero expected gradient (E[grad log pi] = 0): the KL "
                       "term does nothing; put k1 in the reward (placement='reward')")
        if est == "k3" and place == "loss":
            check.warn("kl.placement", "k3 in the loss differentiates to the per-token reverse KL(pi_ref || pi), "
                       "not KL(pi || pi_ref); use k1 in the reward")
        if est == "k2" and place == "reward":
            check.warn("kl.estimator", "k2 is a biased KL estimate; in the reward its gradient is not grad KL")

    rewards = c["rewards"]
    if not isinstance(rewards, Mapping) or not rewards:
        check.error("rewards", "must be a non-empty dict label -> dict(weight=..., fn=..., ...)")
        return
    for label, tcfg in rewards.items():
        key = f"rewards.{label}"
        if not isinstance(tcfg, Mapping):
            check.error(key, f"must be a dict (weight=..., ...), got {tcfg!r}")
            continue
        fn_name, _, kwargs = term_spec(label, tcfg)
        _num(check, f"{key}.weight", tcfg.get("weight", 1.0))
        if fn_name not in REWARD_TERMS:
            check.error(f"{key}.fn", f"unknown reward term {fn_name!r}; known: {REWARD_TERMS.names()}")
            continue
        _kwargs_ok(check, key, REWARD_TERMS.get(fn_name), kwargs)
        if fn_name == "length_penalty":
            for p in ("k", "q", "weights"):
                if p not in kwargs:
                    check.error(f"{key}.{p}", "missing")
            _num(check, f"{key}.k", kwargs.get("k", 1.0), lo=0.0)
            _num(check, f"{key}.q", kwargs.get("q", 0.0), lo=0.0)
            w = kwargs.get("weights", {})
            if not isinstance(w, Mapping) or not w:
                check.error(f"{key}.weights", f"must be a non-empty dict over {list(EFFORT_FIELDS)}")
            else:
                for f, v in w.items():
                    if f not in EFFORT_FIELDS:
                        check.error(f"{key}.weights.{f}", f"unknown effort field; known: {list(EFFORT_FIELDS)}")
                    else:
                        _num(check, f"{key}.weights.{f}", v, lo=0.0)
        if fn_name == "unlikeliness":
            if not isinstance(kwargs.get("of", "task"), str):
                check.error(f"{key}.of", f"must name a reward term of the trajectory (e.g. 'task'), got {kwargs['of']!r}")
            if kwargs.get("logp_key", "behaviour_logp") not in ("behaviour_logp", "raw_logp"):
                check.error(f"{key}.logp_key", f"must be 'behaviour_logp' or 'raw_logp', got {kwargs['logp_key']!r}")
