"""Keys of the ``rl`` config section that belong to the RL *stage* (the loop), beside the loss keys.

The loss keys (``group_size``, ``advantage``, ``objective``, ``aggregation``, ``kl``, ``rewards``,
...) are `c2jax.rl.loss.DEFAULT_RL_CONFIG`; the stage adds what one optimizer step needs around the
loss: how many tasks per step, how many steps, the optimizer, staleness, router replay, the task
family, the policy's sampling settings and the held-out evaluation. `full_rl_defaults()` is the union;
`experiments/configs/rl_quickstart.py` writes every key of it explicitly (a test checks that), so
each one can be overridden with ``--config.rl.KEY=...`` on a locked config.

`validate_rl_stage(check, c)` checks the stage keys (called by the ``rl`` validator in
`c2jax/rl/config_checks.py`), naming each bad key and its allowed values, before any compute.
"""
from __future__ import annotations

import copy
from typing import Any, Mapping

# The stage's defaults. Sections are merged one level deep with the experiment's values.
RL_STAGE_DEFAULTS: dict[str, Any] = dict(
    steps=16,  # optimizer steps of the RL stage
    tasks_per_step=4,  # prompts per step; each gets `group_size` rollouts
    # optimizer updates per step, each on a minibatch of whole groups (1 = one update on the whole batch);
    # minibatch j is j updates off-policy: pair > 1 with objective.tis_cap or ppo
    minibatches=1,
    max_staleness=0,  # policy versions a sample may lag the learner at its update (0 = on-policy)
    learning_rate=1e-5,  # constant (after `warmup_steps`); full-parameter Adam
    warmup_steps=0,
    # Full-parameter optimizer: "adamw", or "muon" (Newton-Schulz on matrices, AdamW elsewhere; b1/b2/eps
    # are its AdamW part) as in c2jax.train.optim.
    optimizer=dict(name="adamw", b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0, clip_norm=1.0),
    # parameters the RL updates leave as they are: globs over '/'-joined parameter paths
    # (c2jax.rl.stage_config.param_paths), a group or path prefix freezing everything below it, e.g.
    # ("lm_head",) or ("*/attn/*",): the attention of every layer
    frozen=(),
    router_replay=True,  # learner forward replays the sampler's routed experts
    replay_margin=None,  # plausibility filter: None = replay as recorded; delta >= 0 = replace implausible
    learner_moe_impl="dropless",  # learner MoE implementation (never 'capacity': it drops tokens)
    temperature=1.0,  # rollout sampling temperature (the learner's logprobs use the same)
    top_p=1.0,
    max_len=1024,  # positions per learner row and per engine slot (prompt + generation)
    # > 0: each step's learner rows are as long as its trajectories need, a multiple of this (<= max_len;
    # c2jax.batching.fit_row_length): the same loss on fewer padded positions, attention ~ length^2.
    # 0: every row holds max_len positions (one jit shape per row count).
    learner_row_multiple=0,
    max_in_flight=32,  # episodes running concurrently (engine slots and sandboxes)
    reference="init",  # frozen reference policy for the KL metrics/term: the stage's initial (SFT) weights
    init_from="previous",  # 'previous' (the previous stage's checkpoint) | 'ckpt:PATH' | 'hf:PATH' | 'scratch'
    ckpt_every=1,  # step checkpoints (resume point after a kill)
    keep_checkpoints=2,
    log_every=1,
    replay_metrics=True,  # also run the learner without replay to measure mismatch and route flips
    grade_cache=True,  # grade each distinct (task, diff) once per run / evaluation (c2jax.envs.grade_cache)
    # Single-epoch task stream; after `upsample_after_step`, tasks are drawn with weights from the
    # heuristics of their (earlier) rollouts: mean turns and thinking tokens (report 3.2).
    curriculum=dict(upsample_after_step=8, weights=dict(turns=1.0, thinking_tokens=0.01), pool=4),
    # Each task's weight in the update (its group's advantages times it): "none" (1), or "kind" (the
    # stream's tasks grouped by the kind of fix, c2jax.train.agent_sft.demo_kind; weight proportional to
    # count(kind) ** -power, normalised to mean 1 over the stream: power 1 gives every kind the same total
    # weight, so the common fix's groups do not outvote the rare ones)
    task_weights=dict(by="none", power=1.0),
    # The learnable task family (c2jax.envs.synth.toyfix) built for the stage (cached).
    # ambiguous = q in (0, 1): the imitation-gap variant (difficulty 0; c2jax.envs.synth.toyfix); 0.0: off
    tasks=dict(suite="toyfix", difficulty=0, n_train=128, n_eval=64, n_demo=256, seed=0, docstrings=False,
               repro=False, ambiguous=0.0),
    # Held-out evaluation before and after RL (same command both times), and pass@1 against the
    # family's difficulty knob (c2jax.train.rl_difficulty: `difficulty_n_tasks` held-out tasks x
    # `difficulty_k` samples at each of `difficulties`; the configured difficulty reuses the main rows).
    # `samples` per task (None: k; else >= k): pass@k is the unbiased estimate from them, so more samples
    # than k narrow its interval (16 instead of 8 narrowed the quickstart's paired pass@8 interval by ~20%).
    eval=dict(enabled=True, k=8, samples=None, temperature=1.0, n_tasks=64, max_in_flight=32, difficulties=(0, 1, 2, 3),
              difficulty_n_tasks=16, difficulty_k=4),
    # Asynchronous services (c2jax.train.async_rl): off = the synchronous step loop.
    services=dict(enabled=False, backend="local", ray_address=None, inflight_updates=True, max_retries=2,
                  eval_every=0, health_check_s=5.0),
    # How the learner's weights reach the engine (c2jax.sync.engine_sync): 'direct' hands the arrays
    # over; 'delta' publishes zstd XOR deltas (a full snapshot every `full_every`) in the background
    # and the engine gets the rebuilt, hash-verified weights. dir None = <workdir>/rl/weights.
    weight_sync=dict(mode="direct", full_every=10, dir=None, wire_dtype=None, keep_full=2, level=3),
)

REFERENCES = ("init", "none")

RL_OPTIMIZERS = ("adamw", "muon")
SERVICE_BACKENDS = ("local", "ray")


def stage_defaults() -> dict[str, Any]:
    return copy.deepcopy(RL_STAGE_DEFAULTS)


def full_rl_defaults() -> dict[str, Any]:
    """Loss defaults + stage defaults: every key the ``rl`` section may hold."""
    from c2jax.rl.loss import DEFAULT_RL_CONFIG

    out = copy.deepcopy(DEFAULT_RL_CONFIG)
    out.update(stage_defaults())
    return out


def resolve_stage(cfg: Mapping[str, Any] | None) -> dict[str, Any]:
    """Stage defaults updated (one level deep per section) with the ``rl`` section's stage keys."""
    out = stage_defaults()
    for k, v in dict(cfg or {}).items():
        if k not in out:
            continue
        if isinstance(v, Mapping) and isinstance(out[k], dict):
            out[k] = {**out[k], **dict(v)}
        else:
            out[k] = v
    return out


def _int(check: Any, key: str, v: Any, lo: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        check.error(key, f"must be an integer >= {lo}, got {v!r}")


def _float(check: Any, key: str, v: Any, lo: float, lo_open: bool = False, hi: float | None = None,
           allow_none: bool = False) -> None:
    if v is None and allow_none:
        return
    ok = not isinstance(v, bool) and isinstance(v, (int, float)) and v == v
    if ok:
        ok = (v > lo if lo_open else v >= lo) and (hi is None or v <= hi)
    if not ok:
        rng = f"{'>' if lo_open else '>='} {lo}" + (f" and <= {hi}" if hi is not None else "")
        check.error(key, f"must be a number {rng}{' or None' if allow_none else ''}, got {v!r}")


def _sub(check: Any, key: str, got: Mapping[str, Any], allowed: Mapping[str, Any]) -> None:
    for k in got:
        if k not in allowed:
            check.error(f"{key}.{k}", f"unknown option; known: {sorted(allowed)}")


def frozen_match(pattern: str, path: str) -> bool:
    """Whether `rl.frozen` entry `pattern` covers the parameter at `path` ('/'-joined, e.g.
    'moe_layers/attn/o_proj/kernel'): an fnmatch glob over the path, or a group / path prefix."""
    import fnmatch

    return fnmatch.fnmatchcase(path, pattern) or path.startswith(pattern.rstrip("/") + "/")


def path_name(keypath: Any) -> str:
    """A JAX key path as the '/'-joined name `rl.frozen` matches ('moe_layers/attn/o_proj/kernel')."""
    return "/".join(str(getattr(k, "key", k)) for k in keypath)


def param_paths(cfg: Any) -> list[str]:
    """'/'-joined paths of every parameter of model config `cfg` (c2jax.model.params_spec)."""
    import jax

    from c2jax.model.params_spec import param_specs

    leaves = jax.tree_util.tree_flatten_with_path(param_specs(cfg), is_leaf=lambda x: hasattr(x, "trainable"))[0]
    return [path_name(p) for p, _ in leaves]


def _model_param_paths(full: Any) -> list[str]:
    """The parameter paths of the full config's model (empty if it has none or it does not build:
    the model validator reports that)."""
    try:
        from c2jax.model.config import ModelConfig

        return param_paths(ModelConfig.from_config(full["model"]).replace(mtp_depth=0))
    except Exception:  # noqa: BLE001 - a broken model section is the model validator's to report
        return []


def validate_rl_stage(check: Any, raw: Mapping[str, Any], full: Any = None) -> None:
    """Check the stage keys of the ``rl`` section (raw: the section as plain dicts; full: the whole
    config, for the model's parameter names)."""
    c = resolve_stage(raw)
    d = RL_STAGE_DEFAULTS
    for key in ("steps", "tasks_per_step", "minibatches", "max_in_flight", "ckpt_every", "keep_checkpoints",
                "log_every"):
        _int(check, key, c[key], 1)
    _int(check, "max_staleness", c["max_staleness"], 0)
    _int(check, "warmup_steps", c["warmup_steps"], 0)
    _int(check, "max_len", c["max_len"], 16)
    _int(check, "learner_row_multiple", c["learner_row_multiple"], 0)
    _float(check, "learning_rate", c["learning_rate"], 0.0, lo_open=True)
    _float(check, "temperature", c["temperature"], 0.0, lo_open=True)
    _float(check, "top_p", c["top_p"], 0.0, lo_open=True, hi=1.0)
    _float(check, "replay_margin", c["replay_margin"], 0.0, allow_none=True)
    for key in ("router_replay", "replay_metrics", "grade_cache"):
        if not isinstance(c[key], bool):
            check.error(key, f"must be a bool, got {c[key]!r}")
    from c2jax.model.moe_impls import exact_moe_impls  # the registry's entries that never drop a token

    learner_impls = exact_moe_impls()
    if c["learner_moe_impl"] not in learner_impls:
        check.error("learner_moe_impl", f"must be one of {learner_impls} (the learner must not drop "
                    f"tokens, so never 'capacity'), got {c['learner_moe_impl']!r}")
    if c["reference"] not in REFERENCES:
        check.error("reference", f"must be one of {list(REFERENCES)}, got {c['reference']!r}")
    init = c["init_from"]
    # hf:PATH: a Hugging Face / serving checkpoint directory, e.g. another run's `policy_final`
    if not isinstance(init, str) or not (init in ("previous", "scratch") or init.startswith(("ckpt:", "hf:"))):
        check.error("init_from", f"must be 'previous', 'scratch', 'ckpt:PATH' or 'hf:PATH', got {init!r}")
    opt = dict(c["optimizer"])
    _sub(check, "optimizer", opt, d["optimizer"])
    if opt.get("name") not in RL_OPTIMIZERS:
        check.error("optimizer.name", f"must be one of {list(RL_OPTIMIZERS)}, got {opt.get('name')!r}")
    for k in ("b1", "b2"):
        _float(check, f"optimizer.{k}", opt.get(k), 0.0, hi=0.999999)
    _float(check, "optimizer.eps", opt.get("eps"), 0.0, lo_open=True)
    _float(check, "optimizer.weight_decay", opt.get("weight_decay"), 0.0)
    _float(check, "optimizer.clip_norm", opt.get("clip_norm"), 0.0, lo_open=True, allow_none=True)
    frozen = c["frozen"]
    if not isinstance(frozen, (list, tuple)) or any(not isinstance(x, str) or not x for x in frozen):
        check.error("frozen", f"must be a list of parameter path globs such as ['lm_head'] or ['*/attn/*'], "
                    f"got {frozen!r}")
    elif frozen:
        paths = _model_param_paths(full)
        if paths:
            for x in frozen:
                if not any(frozen_match(x, q) for q in paths):
                    check.error("frozen", f"{x!r} matches no parameter; the parameters: {paths}")
    cur = dict(c["curriculum"])
    _sub(check, "curriculum", cur, d["curriculum"])
    _int(check, "curriculum.upsample_after_step", cur.get("upsample_after_step"), 0)
    _int(check, "curriculum.pool", cur.get("pool"), 1)
    w = cur.get("weights")
    if not isinstance(w, Mapping):
        check.error("curriculum.weights", f"must be a dict over ['thinking_tokens', 'turns'], got {w!r}")
    else:
        for k, v in dict(w).items():
            if k not in ("turns", "thinking_tokens"):
                check.error(f"curriculum.weights.{k}", "unknown heuristic; known: ['thinking_tokens', 'turns']")
            else:
                _float(check, f"curriculum.weights.{k}", v, 0.0)
    tw = dict(c["task_weights"])
    _sub(check, "task_weights", tw, d["task_weights"])
    if tw.get("by") not in ("none", "kind"):
        check.error("task_weights.by", f"must be one of ['none', 'kind'], got {tw.get('by')!r}")
    _float(check, "task_weights.power", tw.get("power"), 0.0)
    tasks = dict(c["tasks"])
    _sub(check, "tasks", tasks, d["tasks"])
    if tasks.get("suite") != "toyfix":
        check.error("tasks.suite", f"must be one of ['toyfix'], got {tasks.get('suite')!r}")
    _int(check, "tasks.difficulty", tasks.get("difficulty"), 0)
    if isinstance(tasks.get("difficulty"), int) and tasks["difficulty"] > 3:
        check.error("tasks.difficulty", f"must be one of [0, 1, 2, 3], got {tasks['difficulty']}")
    for k in ("n_train", "n_eval", "n_demo"):
        _int(check, f"tasks.{k}", tasks.get(k), 0)
    _int(check, "tasks.seed", tasks.get("seed"), 0)
    for k in ("docstrings", "repro"):
        if not isinstance(tasks.get(k), bool):
            check.error(f"tasks.{k}", f"must be a bool, got {tasks.get(k)!r}")
    amb = tasks.get("ambiguous")
    if isinstance(amb, bool) or not isinstance(amb, (int, float)) or not (amb == 0 or 0.0 < amb < 1.0):
        check.error("tasks.ambiguous", f"must be 0.0 (off) or a probability strictly between 0 and 1, got {amb!r}")
    elif amb and (tasks.get("difficulty") != 0 or tasks.get("docstrings")):
        check.error("tasks.ambiguous", f"the imitation-gap variant needs tasks.difficulty=0 and no docstrings, got "
                                       f"difficulty {tasks.get('difficulty')!r}, docstrings {tasks.get('docstrings')!r}")
    ev = dict(c["eval"])
    _sub(check, "eval", ev, d["eval"])
    if not isinstance(ev.get("enabled"), bool):
        check.error("eval.enabled", f"must be a bool, got {ev.get('enabled')!r}")
    for k in ("k", "n_tasks", "max_in_flight"):
        _int(check, f"eval.{k}", ev.get(k), 1)
    if ev.get("samples") is not None:
        _int(check, "eval.samples", ev.get("samples"), 1)
    if all(isinstance(ev.get(k), int) and not isinstance(ev.get(k), bool) for k in ("k", "samples")) \
            and ev["samples"] < ev["k"]:
        check.error("eval.samples", f"must be >= eval.k ({ev['k']}): pass@k needs k samples per task, got {ev['samples']}")
    _float(check, "eval.temperature", ev.get("temperature"), 0.0)
    for k in ("difficulty_n_tasks", "difficulty_k"):
        _int(check, f"eval.{k}", ev.get(k), 1)
    ds = ev.get("difficulties")
    if not isinstance(ds, (list, tuple)) or any(isinstance(x, bool) or x not in (0, 1, 2, 3) for x in ds):
        check.error("eval.difficulties", f"must be a list of toyfix difficulties from [0, 1, 2, 3], got {ds!r}")
    sv = dict(c["services"])
    _sub(check, "services", sv, d["services"])
    for k in ("enabled", "inflight_updates"):
        if not isinstance(sv.get(k), bool):
            check.error(f"services.{k}", f"must be a bool, got {sv.get(k)!r}")
    if sv.get("backend") not in SERVICE_BACKENDS:
        check.error("services.backend", f"must be one of {list(SERVICE_BACKENDS)}, got {sv.get('backend')!r}")
    addr = sv.get("ray_address")
    if addr is not None and not (isinstance(addr, str) and addr):
        check.error("services.ray_address", f"must be None (start a local cluster) or 'host:port', got {addr!r}")
    _int(check, "services.max_retries", sv.get("max_retries"), 0)
    _int(check, "services.eval_every", sv.get("eval_every"), 0)
    _float(check, "services.health_check_s", sv.get("health_check_s"), 0.0, lo_open=True)
    from c2jax.sync.engine_sync import resolve_weight_sync

    try:
        resolve_weight_sync(c["weight_sync"])
    except ValueError as e:
        check.error("weight_sync", str(e).removeprefix("rl.weight_sync: "))
    # Cross-key checks (only when the pieces are individually fine).
    if isinstance(c["steps"], int) and isinstance(c["tasks_per_step"], int) and isinstance(tasks.get("n_train"), int):
        need = c["steps"] * c["tasks_per_step"]
        if tasks["n_train"] < need:
            check.error("tasks.n_train", f"a single-epoch stream of {need} tasks (steps x tasks_per_step) needs "
                        f"n_train >= {need}, got {tasks['n_train']}")
    mbs, tps = c["minibatches"], c["tasks_per_step"]
    if all(isinstance(x, int) and not isinstance(x, bool) for x in (mbs, tps)) and mbs > tps:
        check.error("minibatches", f"must be <= tasks_per_step ({tps}): a minibatch holds whole groups, got {mbs}")
    if isinstance(ev.get("n_tasks"), int) and isinstance(tasks.get("n_eval"), int) and ev.get("enabled"):
        if ev["n_tasks"] > tasks["n_eval"]:
            check.error("eval.n_tasks", f"must be <= tasks.n_eval ({tasks['n_eval']}), got {ev['n_tasks']}")


STAGE_KEYS = frozenset(RL_STAGE_DEFAULTS)
