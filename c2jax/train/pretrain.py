"""Continued-pretraining stages: ``cpt`` (base length), ``long_context`` (longer sequences, YaRN
factor raised, fewer steps) and ``sft`` (chat-formatted examples, loss on assistant tokens only).

    python experiments/run.py --config experiments/configs/quickstart.py --workdir runs/quickstart

Config (``config.train`` holds the defaults; ``config.cpt`` / ``config.long_context`` /
``config.sft`` hold per-stage overrides of the same keys):

    init_from        'scratch' | 'hf:PATH' (HF DeepSeek-V3/Kimi dir, `c2jax.model.from_pretrained`)
                     | 'ckpt:PATH' (a c2jax checkpoint dir, or a stage dir holding checkpoints/)
    steps, batch_size (global rows), seq_len, accum_steps
    loss             {term: weight or {weight, ...}} from `c2jax.losses.LOSSES`
    mtp_start_step   MTP loss terms are off before this step (MTP from a mid-run checkpoint)
    optimizer        {name: adamw | muon, b1, b2, eps, weight_decay, clip_norm}
    schedule         {name: wsd | cosine | constant, peak_lr, warmup_steps, decay_frac, min_lr_ratio, ...}
    bias_update_rate aux-loss-free router-bias step (0 = off)
    mix              {source: weight} for this stage (default: the data's text sources for
                     cpt/long_context, its chat sources for sft, weights from config.data.sources)
    yarn_factor      (long_context) the YaRN factor: rope_scaling.factor is raised to it and
                     max_position_embeddings to original_max_position_embeddings * factor
    log_every, eval_every, ckpt_every, keep_checkpoints
    eval             {batch_size, max_batches, primary ('code'|'chat'|[sources]), probe_packages,
                      probe_max_tokens, bigram_baseline}

The first stage starts from ``init_from``; every later stage starts from the previous stage's final
checkpoint (params only: a fresh optimizer and schedule). Each stage writes to
``workdir/<stage>/``: ``checkpoints/`` (Orbax, resumable), ``train.jsonl``, ``eval.jsonl``, ``tb/``,
``loss_curve.png`` and ``summary.json``; the run writes ``workdir/summary.json`` (via
`c2jax.train.stages.run_stages`), ``workdir/loss_curve.png`` over all stages, and
``workdir/data.json`` (the exact data artefacts, reused when the run is resumed).

Everything that can be wrong with the inputs (missing or empty source, corrupt shard, tokenizer
larger than the model's vocabulary, sequence length beyond the model's positions, a workdir
holding a different run) is checked for every stage before the first step, and reported as a
`ConfigError` naming the key; nothing written earlier is touched.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import os
import time
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from c2jax.atomic import atomic_write_json
from c2jax.config import ConfigError, to_plain
from c2jax.train.pretrain_config import TRAIN_DEFAULTS, merge
from c2jax.train.stages import STAGES

log = logging.getLogger(__name__)

PRETRAIN_STAGES = ("cpt", "long_context", "sft")

MTP_TERMS = ("mtp_distill", "mtp_xent")


# ---- config ----------------------------------------------------------------------------------------

def stage_config(config: Any, name: str) -> dict:
    """``TRAIN_DEFAULTS`` <- ``config.train`` <- ``config.<name>`` (dicts merged key by key)."""
    train = to_plain(config.get("train", {}) if hasattr(config, "get") else config["train"]) or {}
    over = to_plain(config.get(name, None) if hasattr(config, "get") else None) or {}
    return merge(merge(TRAIN_DEFAULTS, train), over)


def base_model_config(config: Any):
    from c2jax.model.config import ModelConfig

    m = to_plain(config["model"])
    m.pop("preset", None)
    return ModelConfig.from_config(m)


def stage_model_config(base, scfg: dict):
    """The model config of a stage: YaRN factor raised (positions extended) when ``yarn_factor`` is set."""
    from c2jax.model.config import RopeScaling

    f = scfg.get("yarn_factor")
    if not f:
        return base
    rs = base.attention.rope_scaling
    orig = rs.original_max_position_embeddings if rs else base.max_position_embeddings
    new_rs = dataclasses.replace(rs, factor=float(f)) if rs else RopeScaling(
        factor=float(f), original_max_position_embeddings=orig)
    return base.replace(**{"attention.rope_scaling": new_rs,
                           "max_position_embeddings": max(base.max_position_embeddings, int(orig * float(f)))})


def model_fingerprint(cfg) -> str:
    """Hash of what the parameter shapes depend on (not rope settings: stages may change those)."""
    d = cfg.to_dict()
    d["attention"] = {k: v for k, v in d["attention"].items() if k not in ("rope_scaling", "rope_theta")}
    d.pop("max_position_embeddings", None)
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ---- model ----------------------------------------------------------------------------------------

def model_apply_fn(cfg: Any):
    """``fn(params, batch) -> outputs``: the model forward pass on a packed batch."""
    from c2jax.model import apply

    def fn(params, batch):
        return apply(params, batch["tokens"], cfg, segment_ids=batch.get("segment_ids"),
                     positions=batch.get("positions"))

    return fn


def _abstract_params(cfg) -> Any:
    from c2jax.model.params_spec import ParamSpec, param_specs

    dt = jnp.dtype(cfg.param_dtype)
    return jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s.shape, dt), param_specs(cfg),
                                  is_leaf=lambda x: isinstance(x, ParamSpec))


def _check_params(params: Any, cfg, where: str) -> Any:
    """Cast ``params`` to the spec's dtypes; a structure/shape mismatch is a clear error."""
    want = _abstract_params(cfg)
    ws, _ = jax.tree_util.tree_flatten_with_path(want)
    try:
        gs = jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda w, g: g, want, params))
    except ValueError as e:
        raise ConfigError([("train.init_from", f"{where}: parameter tree does not match config.model ({e})")])
    out = []
    for (path, w), g in zip(ws, gs):
        if tuple(np.shape(g)) != tuple(w.shape):
            raise ConfigError([("train.init_from", f"{where}: {jax.tree_util.keystr(path)} has shape "
                                f"{tuple(np.shape(g))}, config.model needs {tuple(w.shape)}")])
        out.append(jnp.asarray(g, w.dtype))
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(want), out)


def _ckpt_dir(path: str) -> str:
    return os.path.join(path, "checkpoints") if os.path.isdir(os.path.join(path, "checkpoints")) else path


def init_params(init_from: str, cfg, seed: int) -> Any:
    """Parameters from 'scratch', 'hf:PATH' or 'ckpt:PATH' (see module docstring)."""
    if init_from == "scratch":
        from c2jax.model import init

        return init(cfg, jax.random.PRNGKey(seed))
    kind, _, path = init_from.partition(":")
    if kind == "hf":
        from c2jax.model.hf.io import from_pretrained

        params, _ = from_pretrained(path, dtype=cfg.param_dtype)
        return _check_params(params, cfg, f"hf checkpoint {path}")
    if kind == "ckpt":
        from c2jax.checkpoint import Checkpointer

        got = Checkpointer(_ckpt_dir(path)).restore_params()
        if got is None:
            raise ConfigError([("train.init_from", f"no usable checkpoint under {path}")])
        return _check_params(got[1], cfg, f"checkpoint {path} step {got[0]}")
    raise ConfigError([("train.init_from", f"must be 'scratch', 'hf:PATH' or 'ckpt:PATH', got {init_from!r}")])


# ---- data -----------------------------------------------------------------------------------------

def load_data(config: Any, workdir: str):
    """The run's `BuiltData`: pinned in ``workdir/data.json`` after the first build, so a resumed run
    uses exactly the same artefacts."""
    from c2jax.data.build import BuiltData, build

    pin = os.path.join(workdir, "data.json")
    if os.path.exists(pin):
        return BuiltData.load(pin)
    built = build(config["data"], progress=os.environ.get("C2JAX_PROGRESS", "1") != "0")
    built.save(pin)
    return built


def stage_mix(built, scfg: dict, name: str) -> dict[str, float]:
    if scfg.get("mix"):
        return {k: float(v) for k, v in dict(scfg["mix"]).items()}
    want = "chat" if name == "sft" else "text"
    w = dict(built.default_weights or {})
    mix = {s: w.get(s, 0.0) for s in built.sources if built.source_kinds.get(s) == want and w.get(s, 0.0) > 0}
    if name == "sft" and not mix:  # chat sources may carry weight 0 in the CPT mix
        mix = {s: 1.0 for s in built.sources if built.source_kinds.get(s) == "chat"
               and built.tokens.get("train", {}).get(s, 0) > 0}
    return mix


def eval_sources(built, name: str, scfg: dict) -> tuple[list[str], list[str]]:
    """(held-out sources to evaluate, the primary ones averaged into ``held_out_loss``)."""
    held = built.tokens.get("heldout", {})
    avail = [s for s in built.sources if held.get(s, 0) > 1]
    primary = scfg["eval"].get("primary") or ("chat" if name == "sft" else "code")
    if isinstance(primary, str):
        if primary == "chat":
            p = [s for s in avail if built.source_kinds.get(s) == "chat"]
        else:
            text = [s for s in avail if built.source_kinds.get(s) == "text"]
            p = [s for s in text if s.endswith("_code")] or text
    else:
        p = [s for s in primary if s in avail]
    return avail, (p or avail)


# ---- preflight --------------------------------------------------------------------------------------

def _data_errors():
    from c2jax.data.corpus import CorpusError
    from c2jax.data.loader import DataError
    from c2jax.data.shards import ShardError

    return (CorpusError, ShardError, DataError)


def preflight(config: Any, workdir: str) -> dict:
    """Check data, tokenizer, model and every stage's settings before any training; returns the
    prepared context. Raises `ConfigError` listing every problem found."""
    problems: list[tuple[str, str]] = []
    try:
        built = load_data(config, workdir)
        train_reader = built.reader("train")
        held_reader = built.reader("heldout")
    except _data_errors() as e:
        raise ConfigError([("data", str(e))]) from None
    tok = built.tokenizer()
    base = base_model_config(config)
    if tok.vocab_size > base.vocab_size:
        problems.append(("model.vocab_size", f"the tokenizer ({built.tokenizer_path}) has {tok.vocab_size} tokens "
                         f"but the model's vocabulary is {base.vocab_size}: token ids would fall outside the "
                         f"embedding; set model.vocab_size >= {tok.vocab_size}"))
    meta_fp = train_reader.meta.get("tokenizer_fingerprint")
    if meta_fp and meta_fp != tok.fingerprint():
        problems.append(("data", f"shards {built.shards_dir} were tokenised with a different tokenizer "
                         f"({meta_fp} != {tok.fingerprint()})"))
    stages = [s for s in list(config["stages"]) if s in PRETRAIN_STAGES]
    ctx: dict = {"built": built, "train_reader": train_reader, "held_reader": held_reader, "tokenizer": tok,
                 "base_cfg": base, "stages": {}}
    pcount = jax.process_count()
    for name in stages:
        scfg = stage_config(config, name)
        cfg = stage_model_config(base, scfg)
        key = name if name in config else "train"
        S, B, A = int(scfg["seq_len"]), int(scfg["batch_size"]), int(scfg["accum_steps"])
        if S > cfg.max_position_embeddings:
            problems.append((f"{key}.seq_len", f"stage {name}: seq_len {S} is beyond the model's positions "
                             f"(max_position_embeddings {cfg.max_position_embeddings}"
                             f"{', after yarn_factor' if scfg.get('yarn_factor') else ''}); raise "
                             f"model.max_position_embeddings or {name}.yarn_factor, or shorten seq_len"))
        if B % (A * pcount):
            problems.append((f"{key}.batch_size", f"stage {name}: batch_size {B} must be divisible by "
                             f"accum_steps ({A}) x process count ({pcount})"))
        mix = stage_mix(built, scfg, name)
        if not mix:
            problems.append((f"{name}.mix", f"stage {name}: no data source to train on "
                             f"({'no chat/SFT documents' if name == 'sft' else 'no text source with weight > 0'} "
                             f"in {built.shards_dir}/train)"))
        else:
            try:
                built.loader(seq_len=S, batch_size=B, seed=int(config.get("seed", 0)), weights=mix,
                             reader=train_reader)
            except _data_errors() as e:
                problems.append((f"{name}.mix", f"stage {name}: {e}"))
        avail, primary = eval_sources(built, name, scfg)
        if not avail:
            problems.append(("data", f"the held-out split {built.shards_dir}/heldout has no documents to "
                             f"evaluate on; set data.held_out.packages"))
        # A workdir that holds another run's checkpoints for this stage is refused, not overwritten.
        run_cfg = os.path.join(workdir, name, "run_config.json")
        fp = {"model": model_fingerprint(cfg), "optimizer": scfg["optimizer"].get("name", "adamw"),
              "data": built.shard_key, "seq_len": S, "batch_size": B, "steps": int(scfg["steps"])}
        if os.path.exists(run_cfg):
            with open(run_cfg) as f:
                old = json.load(f)
            diff = {k: (old.get(k), v) for k, v in fp.items() if old.get(k) != v}
            if diff:
                problems.append((f"{key}", f"stage {name}: {workdir}/{name} holds a run with different settings "
                                 f"{diff}; use a new --workdir (nothing there was changed)"))
        init_from = scfg["init_from"] if name == stages[0] else None
        if init_from and init_from != "scratch":
            kind, _, path = str(init_from).partition(":")
            if kind not in ("hf", "ckpt") or not path:
                problems.append((f"{key}.init_from", f"must be 'scratch', 'hf:PATH' or 'ckpt:PATH', got {init_from!r}"))
            elif kind == "hf" and not os.path.exists(os.path.join(path, "config.json")):
                problems.append((f"{key}.init_from", f"{path} is not an HF model directory (no config.json)"))
            elif kind == "ckpt" and not os.path.isdir(_ckpt_dir(path)):
                problems.append((f"{key}.init_from", f"checkpoint directory {path} does not exist"))
        ctx["stages"][name] = {"scfg": scfg, "cfg": cfg, "mix": mix, "eval_sources": avail, "primary": primary,
                               "fingerprint": fp}
    if problems:
        raise ConfigError(problems)
    return ctx


# ---- the stage ----------------------------------------------------------------------------------------

def _bigram(ctx: dict, workdir: str, seq_len: int, ecfg: dict, sources: list[str]) -> dict:
    from c2jax.train.evaluation import bigram_baseline

    built = ctx["built"]
    key = hashlib.sha256(json.dumps([built.shard_key, seq_len, ecfg["batch_size"], ecfg["max_batches"],
                                     sources]).encode()).hexdigest()[:16]
    path = os.path.join(workdir, f"bigram_baseline_{key}.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    res = bigram_baseline(ctx["train_reader"], ctx["held_reader"], ctx["base_cfg"].vocab_size, seq_len=seq_len,
                          batch_size=int(ecfg["batch_size"]), max_batches=ecfg["max_batches"],
                          train_sources=[s for s in built.sources if built.source_kinds.get(s) == "text"],
                          held_sources=sources)
    atomic_write_json(path, res)
    return res


def run_pretrain_stage(name: str, config: Any, workdir: str, prev: dict) -> tuple[dict, dict]:
    from c2jax.model.params_spec import logical_axes, trainable_mask
    from c2jax.model.parallel.sharded import training_plan
    from c2jax.train import optim
    from c2jax.train.evaluation import codebase_probe, held_out_losses, to_model_batch
    from c2jax.train.loop import train_loop
    from c2jax.train.state import TrainState
    from c2jax.train.step import make_eval_step, make_train_step

    if not os.environ.get("C2JAX_VERBOSE"):  # Orbax logs every save at INFO through absl
        import absl.logging

        absl.logging.set_verbosity(absl.logging.WARNING)
    ctx = prev.get("pretrain_ctx")
    if ctx is None:  # first pretraining stage of this run: check every stage up front
        ctx = preflight(config, workdir)
    st = ctx["stages"][name]
    scfg, cfg, mix = st["scfg"], st["cfg"], st["mix"]
    seed = int(config.get("seed", 0))
    out_dir = os.path.join(workdir, name)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "run_config.json"), "w") as f:
        json.dump(st["fingerprint"], f, indent=1)

    # Parameters: previous stage's final checkpoint, else init_from.
    if prev.get("checkpoint_dir"):
        from c2jax.checkpoint import Checkpointer

        got = Checkpointer(prev["checkpoint_dir"]).restore_params()
        if got is None:
            raise ConfigError([(name, f"previous stage left no usable checkpoint in {prev['checkpoint_dir']}")])
        params = _check_params(got[1], cfg, f"previous stage checkpoint step {got[0]}")
    else:
        params = init_params(str(scfg["init_from"]), cfg, seed)

    steps = int(scfg["steps"])
    schedule = optim.make_schedule(scfg["schedule"], steps)
    tx = optim.make_optimizer(scfg["optimizer"], schedule, params, trainable=trainable_mask(cfg),
                              axes=logical_axes(cfg))
    state = TrainState.create(params, tx)
    S, B = int(scfg["seq_len"]), int(scfg["batch_size"])
    # config.mesh (c2jax.model.parallel.sharding): None = one device; else sharded forward (CP attention,
    # EP dispatch), step jitted with state/batch shardings, state placed on the mesh.
    plan = training_plan(config, cfg, B, S)
    apply_fn = plan.apply_fn() if plan else model_apply_fn(cfg)
    loss_cfg = scfg["loss"]
    starts = {t: int(scfg["mtp_start_step"]) for t in MTP_TERMS if t in loss_cfg and scfg.get("mtp_start_step")}
    step_fn = make_train_step(apply_fn, loss_cfg, accum_steps=int(scfg["accum_steps"]),
                              bias_update_rate=float(scfg["bias_update_rate"]), schedule=schedule,
                              term_start_steps=starts)
    step_fn = plan.jit_step(step_fn, state) if plan else jax.jit(step_fn)
    if plan:
        state = plan.place(state)
    eval_fn = jax.jit(make_eval_step(model_apply_fn(cfg)))  # GSPMD on sharded params, any eval batch
    ecfg = scfg["eval"]
    built = ctx["built"]
    code_held = [s for s in st["eval_sources"] if built.source_kinds.get(s) == "text" and s.endswith("_code")]

    def evaluate(p) -> dict:
        ev = held_out_losses(p, eval_fn, ctx["held_reader"], st["eval_sources"], seq_len=S,
                             batch_size=int(ecfg["batch_size"]), max_batches=ecfg["max_batches"])
        prim = st["primary"]
        num = sum(ev[f"held_out/{s}"] * ev[f"held_out_tokens/{s}"] for s in prim if f"held_out/{s}" in ev)
        den = sum(ev[f"held_out_tokens/{s}"] for s in prim if f"held_out/{s}" in ev)
        ev["held_out_loss"] = num / den if den else float("nan")
        if ecfg.get("probe_packages") and code_held:
            ev.update(codebase_probe(p, eval_fn, ctx["held_reader"], sources=code_held, seq_len=S,
                                     batch_size=int(ecfg["batch_size"]), max_packages=int(ecfg["probe_packages"]),
                                     max_tokens=int(ecfg["probe_max_tokens"])))
        return ev

    loader = built.loader(seq_len=S, batch_size=B, seed=seed, weights=mix, reader=ctx["train_reader"])
    t0 = time.time()
    state, summary = train_loop(
        name=name, out_dir=out_dir, state=state, step_fn=step_fn, loader=loader, evaluate=evaluate,
        total_steps=steps, tokens_per_step=B * S, log_every=int(scfg["log_every"]),
        eval_every=int(scfg["eval_every"]), ckpt_every=int(scfg["ckpt_every"]),
        keep=int(scfg["keep_checkpoints"]), to_device=plan.to_device(to_model_batch) if plan else to_model_batch,
        place=plan.place if plan else None,
        meta={"model_fingerprint": st["fingerprint"]["model"], "manifest_hash": built.manifest_hash})
    summary.update(seq_len=S, batch_size=B, mix=mix, manifest_hash=built.manifest_hash,
                   model_params=int(sum(x.size for x in jax.tree_util.tree_leaves(state.params))),
                   yarn_factor=scfg.get("yarn_factor"), stage_wall_time_s=time.time() - t0)
    if ecfg.get("bigram_baseline") and name != "sft":
        prim_text = [s for s in st["primary"] if built.source_kinds.get(s) == "text"]
        if prim_text:
            bl = _bigram(ctx, workdir, S, ecfg, prim_text)
            summary["bigram_baseline"] = bl
            summary["bigram_held_out_loss"] = bl["bigram_held_out_loss"]
            summary["held_out_minus_bigram"] = summary["held_out_loss_final"] - bl["bigram_held_out_loss"]
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2, sort_keys=True, default=str)
    plot_run(workdir, [s for s in list(config["stages"]) if s in PRETRAIN_STAGES],
             baseline=summary.get("bigram_held_out_loss") or prev.get("bigram_held_out_loss"))
    nxt = dict(prev, pretrain_ctx=ctx, checkpoint_dir=os.path.join(out_dir, "checkpoints"))
    if summary.get("bigram_held_out_loss"):
        nxt["bigram_held_out_loss"] = summary["bigram_held_out_loss"]
    return nxt, summary


def plot_run(workdir: str, stages: list[str], baseline: Optional[float] = None) -> Optional[str]:
    """``workdir/loss_curve.png`` (all stages, x = cumulative tokens, log) + one per stage dir."""
    from c2jax.train.metrics import plot_loss_curves, read_jsonl

    offset = 0
    train_all, held_all, starts = [], {}, {}
    for name in stages:
        d = os.path.join(workdir, name)
        tr = read_jsonl(os.path.join(d, "train.jsonl"))
        ev = read_jsonl(os.path.join(d, "eval.jsonl"))
        if not tr and not ev:
            continue
        tr_pts = [(r["tokens_seen"], r["loss"]) for r in tr if "loss" in r]
        first_x = tr_pts[0][0] if tr_pts else 1
        # The step-0 evaluation is drawn at the first logged step's tokens (log axis has no 0).
        ev_pts = [(r.get("tokens_seen", 0) or first_x, r["held_out_loss"]) for r in ev if "held_out_loss" in r]
        plot_loss_curves(os.path.join(d, "loss_curve.png"), tr_pts, {"primary": ev_pts},
                         title=f"{name}", baselines={"bigram": baseline} if baseline else None)
        starts[name] = offset
        train_all += [(offset + x, y) for x, y in tr_pts]
        held_all.setdefault(f"{name}", []).extend((offset + x, y) for x, y in ev_pts)
        offset += max([x for x, _ in tr_pts] or [0])
    if not train_all:
        return None
    return plot_loss_curves(os.path.join(workdir, "loss_curve.png"), train_all, held_all,
                            title="continued pretraining", baselines={"bigram": baseline} if baseline else None,
                            stage_starts=starts)


def _register(name: str) -> None:
    @STAGES.register(name)
    def stage(config: Any, workdir: str, state: dict) -> tuple[dict, dict]:
        return run_pretrain_stage(name, config, workdir, state)

    stage.__doc__ = f"Continued-pretraining stage {name!r} (see c2jax.train.pretrain)."


for _n in PRETRAIN_STAGES:
    _register(_n)
