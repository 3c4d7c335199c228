"""Cold start for RL: ``agent_sft`` stage, supervised training on scripted agent demonstrations.

    config.stages = ["cpt", "agent_sft", "rl"]
    config.agent_sft = dict(steps=300, batch_size=8, seq_len=1024, peak_lr=3e-3, warmup_steps=20,
                            max_demos=256, synth_code_steps=600)

The demonstrations are real harness episodes: `c2jax.agent.policies.ScriptedPolicy` plays a scripted
expert (read the module named in the task, fix the line with the edit tool, run the reproducer,
finish; `c2jax.envs.synth.toyfix.demo_messages`) in a real sandbox on the *demo* slice of the task
family, which is disjoint from the RL tasks and from the held-out tasks. Each episode's exact token
ids (system prompt, tool declarations, tool outputs) become one `Trajectory`; `pad_batch` packs them
and the loss is next-token cross entropy on policy tokens only (``loss_mask``), through the same
`c2jax.train.step.make_train_step` the pretraining stages use. Demonstrations are cached beside the
task family, keyed by the tokenizer and harness settings.

Before the demonstrations, ``synth_code_steps`` steps of next-token training on synthetic
copy-heavy code (`c2jax.data.synth_code`, training words only) give a tiny model the in-context
copying (induction) it needs to edit a line it has read; without it a ~3M-parameter model only
memorises the training names and never copies an unseen one.
"""
from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import os
import time
from typing import Any

import jax
import numpy as np

from c2jax.atomic import atomic_path, atomic_write_json
from c2jax.config import Checker, ConfigError, register_validator, to_plain
from c2jax.train.stages import STAGES

log = logging.getLogger(__name__)

AGENT_SFT_DEFAULTS: dict[str, Any] = dict(
    steps=300, batch_size=8, seq_len=1024, peak_lr=3e-3, warmup_steps=20, min_lr_ratio=0.1,
    weight_decay=0.0, clip_norm=1.0, max_demos=256, split="demo", log_every=10,
    # Phase 1 (before the demonstrations): next-token training on synthetic copy-heavy code
    # (c2jax.data.synth_code: programs over the training word list only), so a tiny model can copy
    # names it reads. `synth_code_drill_words`: the copy drills' words, "train" (TRAIN_WORDS) or "all"
    # (both lists; bare word lists, no task content: see c2jax.data.synth_code).
    synth_code_steps=0, synth_code_batch=16, synth_code_seq_len=256, synth_code_lr=3e-3,
    synth_code_drill_words="train", synth_code_drill_share=0.5,
    # The scripted expert's style: "read_replace" (read_file the module named in the statement, then
    # search_replace the buggy line), "shell_lines" (grep -n the module, sed the line by number) or
    # "shell_ops" (grep -nE the lines with a binary operator, sed the line by number) or "shell_locate"
    # (shell_ops + grep -nF the operator to change, so the sed copies the number just printed) or
    # "shell_locate_qf" (shell_locate whose sed span widens rightward where the leftward one needs a
    # quote, so string-repeat fixes like `s + '#' + 3` -> `s + '#' * 3` are demonstrated) or "shell_retry"
    # (a scripted search that knows no fix: shell_locate_qf attempts in the order of the fixes most
    # frequent on the split's tasks, each sed followed by the task's repro.py, a failed attempt undone by
    # restoring the workspace, at most 3 attempts) or "shell_locate_nth" (shell_locate whose edit of a
    # string repeat substitutes the operator's Nth occurrence, `s/+/*/2`: no quote, no constant to copy);
    # the shell styles are c2jax.envs.synth.toyfix_shell_demos,
    # difficulties 0-1 only.
    demo_style="read_replace",
    # True: rows as long as the demonstrations need (c2jax.batching.fit_row_length, <= seq_len), not
    # seq_len: the same loss on fewer padding positions (1024-token rows hold one ~530-token
    # shell_locate demonstration each, 52% of their positions; rows of 576 hold it at 92%)
    fit_rows=False,
    # How the demonstrations are weighted in SFT: "none" (as the split gives them: on toyfix the most
    # common fix, `+` -> `*`, is ~45% of them and `!=` -> `==` ~2%) or "kind" (each kind of fix, the
    # task's (old, new) operator, equally often: the rare kinds' demonstrations repeated until every
    # kind has as many as the most common one), so the cold start gives every kind some probability,
    # which is what RL needs to lift best-of-k on it (docs/rl_experiments.md)
    balance="none",
    # Where SFT starts: "previous" (the previous stage's checkpoint, e.g. CPT), "ckpt:DIR" (a checkpoint
    # directory of this model config) or "run:WORKDIR" (the cold start a finished experiments/run.py run
    # trained: its summary.json's agent_sft build directory), e.g. to fine-tune a converged cold start on
    # another family (preset `imitation_gap` of rl_quickstart). The build cache keys on this string, not
    # on the checkpoint's bytes: a cold start retrained in place under the same path is not noticed
    init_from="previous",
)
BALANCE_MODES = ("none", "kind")


def resolve(section: Any) -> dict:
    out = dict(AGENT_SFT_DEFAULTS)
    out.update(dict(to_plain(section) or {}))
    return out


@register_validator("agent_sft")
def validate_agent_sft(check: Checker, section: Any, full: Any) -> None:
    from c2jax.envs.synth import toyfix_shell_demos

    d = dict(to_plain(section) or {})
    for k in d:
        if k not in AGENT_SFT_DEFAULTS:
            check.error(k, f"unknown option; known: {sorted(AGENT_SFT_DEFAULTS)}")
    c = resolve(d)
    for k in ("steps", "batch_size", "seq_len", "max_demos", "log_every", "synth_code_batch", "synth_code_seq_len"):
        check.int_range(c, k, 1)
    check.int_range(c, "synth_code_steps", 0)
    check.float_range(c, "synth_code_lr", 0.0, lo_open=True)
    check.int_range(c, "warmup_steps", 0)
    check.float_range(c, "peak_lr", 0.0, lo_open=True)
    check.float_range(c, "min_lr_ratio", 0.0, 1.0)
    check.float_range(c, "weight_decay", 0.0)
    check.float_range(c, "clip_norm", 0.0, lo_open=True)
    check.choice(c, "split", ("demo", "train"))
    check.choice(c, "synth_code_drill_words", ("train", "all"))
    check.choice(c, "demo_style", ("read_replace",) + toyfix_shell_demos.STYLES)
    check.choice(c, "balance", BALANCE_MODES)
    if not isinstance(c["fit_rows"], bool):
        check.error("fit_rows", f"must be True or False, got {c['fit_rows']!r}")
    check.float_range(c, "synth_code_drill_share", 0.0, 1.0)
    try:
        init_checkpoint_dir(c["init_from"])
    except ValueError as e:
        check.error("init_from", str(e))
    # the expert's tools must be enabled in the harness (else every demonstration fails mid-episode)
    need = {"read_replace": {"read_file", "search_replace"}}.get(c["demo_style"], {"run_terminal_cmd"})
    agent = dict(to_plain(full.get("agent") if full is not None else None) or {})
    enabled = (agent.get("tools") or {}).get("enabled")
    if enabled is not None and not need <= set(enabled):
        check.error("demo_style", f"{c['demo_style']!r} demonstrations call {sorted(need)}; "
                                  f"agent.tools.enabled is {list(enabled)}")


def init_checkpoint_dir(init_from: Any) -> str | None:
    """The checkpoint directory `agent_sft.init_from` names (None for "previous"); ValueError saying
    what is wrong otherwise (checked by the validator, so a bad value fails before any compute)."""
    if init_from == "previous":
        return None
    kind, _, path = str(init_from).partition(":")
    if kind not in ("ckpt", "run") or not path or not isinstance(init_from, str):
        raise ValueError(f"must be 'previous', 'ckpt:DIR' or 'run:WORKDIR', got {init_from!r}")
    if kind == "ckpt":
        if not os.path.isdir(path):
            raise ValueError(f"checkpoint directory {path} does not exist")
        return os.path.abspath(path)
    summary = os.path.join(path, "summary.json")
    try:
        with open(summary) as f:
            build_dir = (json.load(f).get("agent_sft") or {}).get("build_dir")
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{summary} is not a finished run's summary ({e})") from None
    ckpt = os.path.join(build_dir or path, "agent_sft", "checkpoints")  # run_agent_sft's layout
    if not os.path.isdir(ckpt):
        raise ValueError(f"run {path} records no agent_sft checkpoint ({ckpt} does not exist)")
    return os.path.abspath(ckpt)


def demo_trajectories(config: Any, fam: dict, tokenizer: Any, split: str, max_demos: int,
                      max_in_flight: int = 4, style: str = "read_replace") -> list:
    """Scripted expert episodes on `split` tasks (cached JSONL beside the family); `style` picks the
    expert (see AGENT_SFT_DEFAULTS["demo_style"]); tasks the style cannot demonstrate are skipped."""
    from c2jax.agent.policies import ScriptedPolicy
    from c2jax.envs.synth import toyfix_shell_demos
    from c2jax.envs.synth.toyfix import demo_messages as read_replace_messages
    from c2jax.train.rl_family import load_split, make_harness
    from c2jax.trajectory import load_jsonl, save_jsonl

    harness, fmt = make_harness(config, tokenizer)
    key = hashlib.sha256(json.dumps({"tok": tokenizer.fingerprint(), "agent": dict(to_plain(config.get("agent")) or {}),
                                     "split": split, "n": max_demos, **({"style": style} if style != "read_replace" else {})},
                                    sort_keys=True, default=str).encode()).hexdigest()[:12]
    path = os.path.join(fam["dir"], "demos", f"{split}-{key}.jsonl")
    if os.path.exists(path):
        return load_jsonl(path)
    tasks = load_split(fam, split)
    shell = style in toyfix_shell_demos.STYLES
    prior = None
    if shell:
        tasks = [t for t in tasks if toyfix_shell_demos.applies(t, style)]
    if style in toyfix_shell_demos.RETRY_STYLES:  # the search's order: the fixes most frequent on the split's tasks first
        prior = toyfix_shell_demos.change_prior(tasks)
        tasks = [t for t in tasks if toyfix_shell_demos.search_attempts(t, prior) is not None]
    tasks = tasks[:max_demos]
    demo_messages = functools.partial(toyfix_shell_demos.shell_demo_messages, style=style, prior=prior) if shell \
        else read_replace_messages

    async def one(task, sem):
        from c2jax.envs import start

        async with sem:
            policy = ScriptedPolicy(fmt, demo_messages(task))
            sb = await asyncio.to_thread(start, task.env_id, **dict(task.limits))
            try:
                ep = await harness.arun(policy, sb, task.problem_statement, task_id=task.instance_id,
                                        group_id=task.instance_id, sample_id=f"{task.instance_id}#demo")
            finally:
                await asyncio.to_thread(sb.close)
            return ep

    async def run_all():
        sem = asyncio.Semaphore(max_in_flight)
        return await asyncio.gather(*(one(t, sem) for t in tasks))

    eps = asyncio.run(run_all())
    trajs = [e.trajectory for e in eps if not e.trajectory.infra_failed and e.diff]
    if len(trajs) < len(eps):
        log.warning("agent_sft: %d of %d demonstrations failed and were dropped", len(eps) - len(trajs), len(eps))
    if not trajs:
        return trajs
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with atomic_path(path) as tmp:
        save_jsonl(trajs, tmp)
    return trajs


def demo_kind(task: Any, style: str | None = None) -> str:
    """The kind of fix a demonstration's task needs: toyfix's (old, new) operator where one operator
    swap is the fix (`toyfix_shell_demos.gold_change`), else the task's subcategory. For a style whose
    edit can carry sed's occurrence flag (`shell_locate_nth`), a fix of the operator's Nth occurrence
    (`s/+/*/2`, the string repeats) is a kind of its own: a different command to learn."""
    from c2jax.envs.synth import toyfix_shell_demos

    try:
        change = toyfix_shell_demos.gold_change(task)
    except (KeyError, IndexError, TypeError, ValueError):  # not a one-module toyfix task
        change = None
    if not change:
        return f"other:{task.subcategory}"
    kind = f"{change[0]} -> {change[1]}"
    if style in toyfix_shell_demos.NTH_STYLES:
        bug = task.provenance["bugs"][0]
        try:
            n = toyfix_shell_demos.sed_edit(bug["old"], bug["new"], nth=True).rsplit("/", 1)[1]
        except ValueError:  # (no demonstrable edit: the task has no demonstration to weigh)
            n = ""
        kind += f" #{n}" if n else ""
    return kind


def balance_by_kind(trajs: list, kind_of: dict[str, str], seed: int) -> tuple[list, dict[str, int]]:
    """Every kind (`kind_of[traj.task_id]`) as often as the most common one: each kind's demonstrations
    in a seeded order, cycled until it has that many (the common kind's are kept once each). Returns
    (trajectories, {kind: distinct demonstrations}); the order is by kind, SFT shuffles the rows."""
    by: dict[str, list] = {}
    for t in trajs:
        by.setdefault(kind_of[t.task_id], []).append(t)
    target = max(len(v) for v in by.values())
    rng = np.random.default_rng(seed)
    out: list = []
    for kind in sorted(by):
        group = [by[kind][i] for i in rng.permutation(len(by[kind]))]
        out += [group[i % len(group)] for i in range(target)]
    return out, {k: len(v) for k, v in sorted(by.items())}


def warmup_on_synth_code(params: Any, cfg: Any, tokenizer: Any, c: dict, seed: int, out_dir: str) -> tuple[Any, dict]:
    """Phase 1: `synth_code_steps` steps of next-token loss on synthetic copy-heavy code."""
    from c2jax.data.synth_code import ALL_WORDS, synth_code_rows
    from c2jax.data.words import TRAIN_WORDS
    from c2jax.model.params_spec import trainable_mask
    from c2jax.train import optim
    from c2jax.train.metrics import MetricsLogger
    from c2jax.train.pretrain import model_apply_fn
    from c2jax.train.state import TrainState
    from c2jax.train.step import make_train_step

    steps, B, S = int(c["synth_code_steps"]), int(c["synth_code_batch"]), int(c["synth_code_seq_len"])
    drill_words = ALL_WORDS if c["synth_code_drill_words"] == "all" else TRAIN_WORDS
    rows = synth_code_rows(tokenizer, steps * B, S, seed=seed, drill_words=drill_words,
                           drill_share=float(c["synth_code_drill_share"]))  # [steps * B, S + 1]
    sched = optim.make_schedule({"name": "constant", "peak_lr": float(c["synth_code_lr"]), "warmup_steps": 20}, steps)
    tx = optim.make_optimizer({"name": "adamw", "b1": 0.9, "b2": 0.95, "eps": 1e-8, "weight_decay": 0.0,
                               "clip_norm": float(c["clip_norm"])}, sched, params, trainable=trainable_mask(cfg))
    state = TrainState.create(params, tx)
    fn = jax.jit(make_train_step(model_apply_fn(cfg), {"xent": 1.0}, schedule=sched))
    fixed = {"loss_mask": np.ones((B, S), np.float32), "segment_ids": np.ones((B, S), np.int32),
             "positions": np.tile(np.arange(S, dtype=np.int32), (B, 1))}
    logger = MetricsLogger(out_dir, tensorboard=False)
    t0, loss = time.time(), float("nan")
    for i in range(steps):
        r = rows[i * B:(i + 1) * B]
        state, m = fn(state, dict(fixed, tokens=r[:, :-1], targets=r[:, 1:]))
        if (i + 1) % int(c["log_every"]) == 0 or i + 1 == steps:
            loss = float(jax.device_get(m["loss"]))
            logger.log("synth_code", i + 1, {"loss": loss})
    logger.close()
    return state.params, {"synth_code_steps": steps, "synth_code_loss_final": loss,
                          "synth_code_tokens": steps * B * S, "synth_code_s": time.time() - t0}


def train_on_demos(params: Any, cfg: Any, trajs: list, c: dict, seed: int, out_dir: str, steps: int,
                   max_wall_s: float | None = None, schedule: dict | None = None) -> tuple[Any, dict]:
    """Cross entropy on policy tokens of packed demonstrations: `steps` Adam steps, or fewer if
    `max_wall_s` (seconds of training) runs out first."""
    from c2jax.model.params_spec import trainable_mask
    from c2jax.train import optim
    from c2jax.train.metrics import MetricsLogger, Progress
    from c2jax.train.pretrain import model_apply_fn
    from c2jax.train.state import TrainState
    from c2jax.train.step import make_train_step
    from c2jax.batching import fit_row_length, pad_batch

    S, B = int(c["seq_len"]), int(c["batch_size"])
    if c.get("fit_rows"):
        S = fit_row_length(trajs, S)
    packed = pad_batch(trajs, S)
    keys = ("tokens", "targets", "loss_mask", "segment_ids", "positions")
    rows = {k: packed[k] for k in keys}
    R = rows["tokens"].shape[0]
    sched = optim.make_schedule(schedule or {"name": "cosine", "peak_lr": float(c["peak_lr"]),
                                             "warmup_steps": int(c["warmup_steps"]),
                                             "min_lr_ratio": float(c["min_lr_ratio"]), "init_lr_ratio": 0.0}, steps)
    tx = optim.make_optimizer({"name": "adamw", "b1": 0.9, "b2": 0.95, "eps": 1e-8,
                               "weight_decay": float(c["weight_decay"]), "clip_norm": float(c["clip_norm"])},
                              sched, params, trainable=trainable_mask(cfg))
    state = TrainState.create(params, tx)
    step_fn = jax.jit(make_train_step(model_apply_fn(cfg.replace(mtp_depth=0) if cfg.mtp_depth else cfg),
                                      {"xent": 1.0}, schedule=sched))
    rng = np.random.default_rng(seed)
    logger = MetricsLogger(out_dir)
    bar = Progress(steps, desc="agent_sft")
    order = rng.permutation(R)
    pos, t0, loss = 0, time.time(), float("nan")
    done = 0
    for step in range(steps):
        if max_wall_s is not None and time.time() - t0 > max_wall_s:
            break
        done = step + 1
        if pos + B > R:
            order, pos = rng.permutation(R), 0
        idx = order[pos: pos + B] if R >= B else rng.integers(0, R, B)
        pos += B
        batch = {k: v[idx] for k, v in rows.items()}
        state, m = step_fn(state, batch)
        if (step + 1) % int(c["log_every"]) == 0 or step + 1 == steps:
            m = jax.device_get(m)
            loss = float(m["loss"])
            logger.log("train", step + 1, {"loss": loss, "lr": float(m.get("lr", 0.0))})
            bar.update(int(c["log_every"]) if (step + 1) % int(c["log_every"]) == 0 else 0, loss=loss)
    bar.close()
    logger.close()
    fill = float((packed["segment_ids"] > 0).mean())
    return state.params, {"steps": done, "rows": int(R), "row_len": S, "row_fill": fill, "demos": len(trajs),
                          "train_loss_final": loss,
                          "policy_tokens": float(packed["loss_mask"].sum()), "wall_time_s": time.time() - t0}


def run_agent_sft(config: Any, workdir: str, prev: dict) -> tuple[dict, dict]:
    from c2jax.sampling.checkpoint import save_serving_checkpoint
    from c2jax.checkpoint import Checkpointer
    from c2jax.train.pretrain import base_model_config, load_data
    from c2jax.train.rl_family import ensure_family

    c = resolve(config.get("agent_sft"))
    out_dir = os.path.join(workdir, "agent_sft")
    os.makedirs(out_dir, exist_ok=True)
    ckpt = Checkpointer(os.path.join(out_dir, "checkpoints"), keep=1, async_save=False)
    done = os.path.join(out_dir, "summary.json")
    tokenizer = load_data(config, workdir).tokenizer()
    cfg = base_model_config(config)
    if os.path.exists(done) and ckpt.all_steps():  # finished earlier: reuse
        with open(done) as f:
            summary = json.load(f)
        # Reused (a second seed): run_stages records this call's own wall time.
        summary = dict(summary, reused=True, first_build_wall_time_s=summary.pop("wall_time_s", None))
        ckpt.close()
        return dict(prev, checkpoint_dir=os.path.join(out_dir, "checkpoints"), tokenizer=tokenizer), summary
    if not prev.get("checkpoint_dir"):
        raise ConfigError([("stages", "agent_sft needs a previous stage (e.g. cpt) that leaves a checkpoint")])
    got = Checkpointer(prev["checkpoint_dir"]).restore_params()
    if got is None:
        raise ConfigError([("agent_sft", f"no usable checkpoint in {prev['checkpoint_dir']}")])
    params = jax.tree_util.tree_map(np.asarray, got[1])
    start_dir = init_checkpoint_dir(c["init_from"])
    if start_dir is not None:  # another cold start to fine-tune: same parameter tree as the previous stage's
        other = Checkpointer(start_dir).restore_params()
        if other is None:
            raise ConfigError([("agent_sft.init_from", f"no usable checkpoint in {start_dir}")])
        other_params = jax.tree_util.tree_map(np.asarray, other[1])
        shapes = lambda t: jax.tree_util.tree_map(lambda x: (x.shape, str(x.dtype)), t)  # noqa: E731
        if shapes(other_params) != shapes(params):
            raise ConfigError([("agent_sft.init_from", f"{start_dir}: parameter tree differs from config.model's")])
        params = other_params
    t0 = time.time()
    fam = ensure_family(config)
    trajs = demo_trajectories(config, fam, tokenizer, c["split"], int(c["max_demos"]), style=c["demo_style"])
    if not trajs:
        raise ConfigError([("agent_sft", "no demonstration succeeded (see the log)")])
    build_s = time.time() - t0
    kinds: dict[str, int] = {}
    if c["balance"] == "kind":
        from c2jax.train.rl_family import load_split

        kind_of = {t.instance_id: demo_kind(t, c["demo_style"]) for t in load_split(fam, c["split"])}
        trajs, kinds = balance_by_kind(trajs, kind_of, int(config.get("seed", 0)))
    warm: dict = {}
    if int(c["synth_code_steps"]) > 0:
        params, warm = warmup_on_synth_code(params, cfg, tokenizer, c, int(config.get("seed", 0)), out_dir)
    params, summary = train_on_demos(params, cfg, trajs, c, int(config.get("seed", 0)), out_dir, int(c["steps"]))
    summary.update(warm)
    summary["demo_build_s"] = build_s
    summary["init_from"] = start_dir or "previous"
    if kinds:
        summary["balance"] = {"kinds": kinds, "per_kind": len(trajs) // len(kinds)}
    ckpt.save(int(c["steps"]), {"params": params})
    ckpt.close()
    save_serving_checkpoint(os.path.join(out_dir, "policy"), params, cfg, tokenizer)
    atomic_write_json(done, summary, indent=2, sort_keys=True)
    return dict(prev, checkpoint_dir=os.path.join(out_dir, "checkpoints"), tokenizer=tokenizer), summary


@STAGES.register("agent_sft")
def agent_sft_stage(config: Any, workdir: str, state: dict) -> tuple[dict, dict]:
    """Cold-start SFT on scripted harness demonstrations (see c2jax.train.agent_sft)."""
    return run_agent_sft(config, workdir, state)
