"""Defaults and validators of the pretraining config sections: ``train`` (defaults for every stage)
and the per-stage overrides ``cpt``, ``long_context``, ``sft`` (same keys; see
`c2jax.train.pretrain` for what each key means).

The validators check types and ranges, loss-term / optimizer / schedule names against their
registries, and that each stage's ``seq_len`` fits the model's positions (after the stage's YaRN
factor), so these mistakes exit with status 2 before anything runs. Data-dependent checks (empty
sources, corrupt shards, tokenizer vs model vocabulary) run in `c2jax.train.pretrain.preflight`.
"""
from __future__ import annotations

import copy
from typing import Any

from c2jax.config import Checker, cfg_get, register_validator, to_plain

TRAIN_DEFAULTS: dict[str, Any] = {
    "init_from": "scratch",
    "steps": 100,
    "batch_size": 8,
    "seq_len": 128,
    "accum_steps": 1,
    "loss": {"xent": 1.0},
    "mtp_start_step": 0,
    "optimizer": {"name": "adamw", "b1": 0.9, "b2": 0.95, "eps": 1e-8, "weight_decay": 0.1, "clip_norm": 1.0},
    "schedule": {"name": "wsd", "peak_lr": 3e-3, "warmup_steps": 10, "decay_frac": 0.2, "min_lr_ratio": 0.1},
    "bias_update_rate": 1e-3,
    "mix": None,
    "yarn_factor": None,
    "log_every": 10,
    "eval_every": 50,
    "ckpt_every": 50,
    "keep_checkpoints": 3,
    "eval": {"batch_size": 8, "max_batches": 8, "primary": None, "probe_packages": 4,
             "probe_max_tokens": 4096, "bigram_baseline": True},
}
STAGE_SECTIONS = ("cpt", "long_context", "sft")
OPTIMIZER_KEYS = {"name", "b1", "b2", "eps", "weight_decay", "clip_norm", "beta", "ns_steps", "adam_lr_ratio"}
SCHEDULE_KEYS = {"name", "peak_lr", "warmup_steps", "decay_frac", "min_lr_ratio", "decay_shape", "init_lr_ratio"}
EVAL_KEYS = set(TRAIN_DEFAULTS["eval"])


def merge(base: dict, over: Any) -> dict:
    """Recursive dict merge; ``loss`` and ``mix`` are replaced as a whole, not merged."""
    out = copy.deepcopy(base)
    for k, v in (to_plain(over) or {}).items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k not in ("loss", "mix"):
            out[k] = merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _check_keys(check: Checker, section: dict) -> None:
    for k in section:
        if k not in TRAIN_DEFAULTS:
            check.error(k, f"unknown key; known: {sorted(TRAIN_DEFAULTS)}")
    for sub, known in (("optimizer", OPTIMIZER_KEYS), ("schedule", SCHEDULE_KEYS), ("eval", EVAL_KEYS)):
        v = section.get(sub)
        if isinstance(v, dict):
            for k in v:
                if k not in known:
                    check.error(f"{sub}.{k}", f"unknown key; known: {sorted(known)}")


def _check_values(check: Checker, m: dict, full: Any, stage: str | None) -> None:
    from c2jax.losses import LOSSES
    from c2jax.train.optim import OPTIMIZERS, SCHEDULES

    steps = check.int_range(m, "steps", 1)
    B = check.int_range(m, "batch_size", 1)
    S = check.int_range(m, "seq_len", 2)
    A = check.int_range(m, "accum_steps", 1)
    if B is not None and A is not None and B % A:
        check.error("batch_size", f"must be divisible by accum_steps={A}, got {B}")
    for k in ("log_every", "eval_every", "ckpt_every", "keep_checkpoints"):
        check.int_range(m, k, 1)
    check.int_range(m, "mtp_start_step", 0)
    check.float_range(m, "bias_update_rate", 0.0)
    init = m.get("init_from")
    if not isinstance(init, str) or not (init == "scratch" or init.startswith(("hf:", "ckpt:"))) \
            or init in ("hf:", "ckpt:"):
        check.error("init_from", f"must be 'scratch', 'hf:PATH' or 'ckpt:PATH', got {init!r}")
    loss = m.get("loss")
    if not isinstance(loss, dict) or not loss:
        check.error("loss", f"must be a non-empty dict {{term: weight}} over {LOSSES.names()}, got {loss!r}")
    else:
        for name, spec in loss.items():
            if name not in LOSSES:
                check.error(f"loss.{name}", f"unknown loss term; known: {LOSSES.names()}")
            w = spec.get("weight", 1.0) if isinstance(spec, dict) else spec
            if isinstance(w, bool) or not isinstance(w, (int, float)) or w < 0:
                check.error(f"loss.{name}", f"weight must be a number >= 0, got {w!r}")
    opt = m.get("optimizer") or {}
    if opt.get("name", "adamw") not in OPTIMIZERS:
        check.error("optimizer.name", f"must be one of {OPTIMIZERS.names()}, got {opt.get('name')!r}")
    for k, lo, hi in (("b1", 0.0, 1.0), ("b2", 0.0, 1.0), ("weight_decay", 0.0, None), ("clip_norm", 0.0, None)):
        if k in opt:
            _num(check, f"optimizer.{k}", opt[k], lo, hi)
    sch = m.get("schedule") or {}
    if sch.get("name", "wsd") not in SCHEDULES:
        check.error("schedule.name", f"must be one of {SCHEDULES.names()}, got {sch.get('name')!r}")
    _num(check, "schedule.peak_lr", sch.get("peak_lr"), 0.0, None, lo_open=True)
    if "warmup_steps" in sch:
        w = sch["warmup_steps"]
        if isinstance(w, bool) or not isinstance(w, int) or w < 0 or (steps is not None and w > steps):
            check.error("schedule.warmup_steps", f"must be an integer in [0, steps={steps}], got {w!r}")
    for k in ("decay_frac", "min_lr_ratio", "init_lr_ratio"):
        if k in sch:
            _num(check, f"schedule.{k}", sch[k], 0.0, 1.0)
    if sch.get("decay_shape", "linear") not in ("linear", "cosine", "sqrt"):
        check.error("schedule.decay_shape", f"must be linear, cosine or sqrt, got {sch.get('decay_shape')!r}")
    yf = m.get("yarn_factor")
    if yf is not None:
        _num(check, "yarn_factor", yf, 1.0, None)
    mix = m.get("mix")
    if mix is not None:
        if not isinstance(mix, dict) or not mix:
            check.error("mix", f"must be None or a non-empty dict {{source: weight}}, got {mix!r}")
        else:
            for k, v in mix.items():
                _num(check, f"mix.{k}", v, 0.0, None)
    ev = m.get("eval") or {}
    eb = ev.get("batch_size", 1)
    if isinstance(eb, bool) or not isinstance(eb, int) or eb < 1:
        check.error("eval.batch_size", f"must be an integer >= 1, got {eb!r}")
    if ev.get("max_batches") is not None and (not isinstance(ev["max_batches"], int) or ev["max_batches"] < 1):
        check.error("eval.max_batches", f"must be None or an integer >= 1, got {ev['max_batches']!r}")
    # seq_len within the model's positions (after this stage's YaRN factor).
    model = cfg_get(full, "model")
    if S is not None and model is not None:
        md = to_plain(model)
        mpe = md.get("max_position_embeddings")
        att = md.get("attention") or {}
        rs = att.get("rope_scaling") or {}
        if isinstance(mpe, int) and (yf is None or isinstance(yf, (int, float))):
            limit = mpe
            if yf:
                orig = rs.get("original_max_position_embeddings", mpe) if rs else mpe
                limit = max(mpe, int(orig * float(yf)))
            if S > limit:
                check.error("seq_len", f"{S} is beyond the model's positions ({limit}"
                            f"{' with yarn_factor ' + str(yf) if yf else ''}; model.max_position_embeddings "
                            f"= {mpe}); shorten seq_len or raise the positions")


def _num(check: Checker, key: str, v: Any, lo, hi, lo_open: bool = False) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v \
            or (lo is not None and (v <= lo if lo_open else v < lo)) or (hi is not None and v > hi):
        rng = f"{'>' if lo_open else '>='} {lo}" + (f" and <= {hi}" if hi is not None else "")
        check.error(key, f"must be a number {rng}, got {v!r}")


@register_validator("train")
def validate_train(check: Checker, section: Any, full: Any) -> None:
    d = to_plain(section) or {}
    if not isinstance(d, dict):
        check.error("", f"must be a dict of training settings, got {type(section).__name__}")
        return
    _check_keys(check, d)
    _check_values(check, merge(TRAIN_DEFAULTS, d), full, None)


def _stage_validator(stage: str):
    def validate_stage(check: Checker, section: Any, full: Any) -> None:
        d = to_plain(section) or {}
        if not isinstance(d, dict):
            check.error("", f"must be a dict of overrides of config.train, got {type(section).__name__}")
            return
        _check_keys(check, d)
        merged = merge(merge(TRAIN_DEFAULTS, cfg_get(full, "train")), d)
        sub = Checker(check.prefix)
        _check_values(sub, merged, full, stage)
        # Report only problems the stage section itself introduces (config.train reports its own).
        own = set(d) | {f"{k}.{j}" for k, v in d.items() if isinstance(v, dict) for j in v}
        for key, msg in sub.problems:
            rel = key[len(check.prefix) + 1:] if key.startswith(check.prefix + ".") else key
            if rel in own or rel.split(".")[0] in own or rel == "seq_len":
                check.problems.append((key, msg))
        check.warnings.extend(sub.warnings)

    register_validator(stage)(validate_stage)
    return validate_stage


for _s in STAGE_SECTIONS:
    _stage_validator(_s)
