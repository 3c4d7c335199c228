"""The ``rl`` stage: Composer 2's RL phase end to end, synchronous and staleness-ready.

    python experiments/run.py --config experiments/configs/rl_quickstart.py --workdir runs/rl

Per step (`c2jax.train.rl_step.rl_step`): the next ``tasks_per_step`` tasks of a single-epoch stream
(`rl_tasks.TaskStream`, hard-task upsampling after ``curriculum.upsample_after_step``), ``group_size``
graded rollouts each through the real harness, engine policy and sandbox pool, rewards from named
terms, `pad_batch`, the learner forward with router replay, ``make_rl_loss``, full-parameter Adam,
and ``update_weights`` to the engine (version + 1; later tokens carry it).

Around the steps: the frozen reference policy is the stage's initial (SFT) weights; held-out
evaluation of the initial and of the final policy (pass@1 / pass@k, bootstrap CIs, paired bootstrap
of the difference, resampling tasks) through `c2jax.bench.agent_eval` with the same settings both
times, each policy also saved as a serving checkpoint so ``python -m c2jax.bench run ... --checkpoint``
reproduces the numbers (the command is written to the summary). Step checkpoints (params, Adam
state, task stream, versions, the engine's weights) make a killed run resume where it stopped; the
sampling seeds depend on (seed, step, task, sample, turn) only.

Outputs under ``workdir/rl/``: ``train.jsonl`` + ``tb/`` (every metric each step), ``checkpoints/``,
``policy_init/`` and ``policy_final/`` (serving checkpoints), ``eval_before/`` and ``eval_after/``
(per-task rows + results), ``rl_curve.png``, ``report.md``, ``summary.json``.
"""
from __future__ import annotations

import logging
import os
import shlex
import time
from typing import Any

import jax
import numpy as np

from c2jax.atomic import atomic_write_json
from c2jax.compile_cache import active_compile_cache
from c2jax.config import ConfigError, to_plain
from c2jax.train.stages import STAGES
from c2jax.train.rl_eval import evaluate  # noqa: F401  (re-exported: sft_matched, the CLI)

log = logging.getLogger(__name__)


def resolved_rl(config: Any) -> dict:
    from c2jax.rl.loss import resolve_rl_config
    from c2jax.rl.stage_config import resolve_stage

    raw = to_plain(config.get("rl")) or {}
    out = resolve_rl_config({k: v for k, v in raw.items() if k not in resolve_stage({})})
    out.update(resolve_stage(raw))
    return out


def stage_setup(config: Any, workdir: str, prev: dict, name: str) -> tuple[dict, int, str, Any, Any]:
    """(resolved rl section, seed, the stage's output dir, tokenizer, model config) for a stage that
    runs the policy in the harness (rl, sft_matched); checks rl.max_len against the model."""
    from c2jax.train.pretrain import base_model_config, load_data

    rl = resolved_rl(config)
    out_dir = os.path.join(workdir, name)
    os.makedirs(out_dir, exist_ok=True)
    tokenizer = prev.get("tokenizer") or load_data(config, workdir).tokenizer()
    cfg = base_model_config(config)
    if int(rl["max_len"]) > cfg.max_position_embeddings:
        raise ConfigError([("rl.max_len", f"{rl['max_len']} > model.max_position_embeddings "
                            f"({cfg.max_position_embeddings})")])
    return rl, int(config.get("seed", 0)), out_dir, tokenizer, cfg


def initial_params(config: Any, rl: dict, prev: dict, cfg: Any):
    from c2jax.checkpoint import Checkpointer
    from c2jax.train.pretrain import init_params

    src = rl["init_from"]
    if src == "previous":
        if not prev.get("checkpoint_dir"):
            raise ConfigError([("rl.init_from", "'previous' needs an earlier stage that leaves a checkpoint "
                                "(e.g. stages=['cpt', 'agent_sft', 'rl'])")])
        got = Checkpointer(prev["checkpoint_dir"]).restore_params()
        if got is None:
            raise ConfigError([("rl.init_from", f"no usable checkpoint in {prev['checkpoint_dir']}")])
        return jax.tree_util.tree_map(np.asarray, got[1])
    return jax.tree_util.tree_map(np.asarray, init_params(src, cfg, int(config.get("seed", 0))))


def save_policy(path: str, params: Any, cfg: Any, tokenizer: Any) -> str:
    """Serving checkpoint written once, atomically (a resumed run finds it complete and keeps it)."""
    import shutil

    from c2jax.sampling.checkpoint import save_serving_checkpoint

    if os.path.exists(os.path.join(path, "tokenizer.json")):
        return path
    tmp = path + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    save_serving_checkpoint(tmp, params, cfg, tokenizer)
    os.replace(tmp, path)
    return path


def write_agent_config(config: Any, out_dir: str) -> str:
    """Write the run's resolved ``config.agent`` (command-line overrides included) to
    out_dir/agent.json, the harness the evaluation command must use; returns its path."""
    path = os.path.join(out_dir, "agent.json")
    atomic_write_json(path, to_plain(config.get("agent")) or {}, indent=2, sort_keys=True)
    return path


def eval_command(suite_dir: str, ckpt: str, rl: dict, seed: int, out: str, agent_config: str,
                 compile_cache: str | None = None) -> str:
    """The `python -m c2jax.bench run` command that reproduces an in-stage evaluation exactly.
    agent_config: the run's `write_agent_config` file (the config file the run was started with would
    miss any ``--config.agent.*`` override, e.g. a larger max_turns). compile_cache: the run's JAX
    compilation cache (`compile_cache.active_compile_cache()`), passed on as ``--compile-cache`` so the
    command loads the engine's executables the run compiled (same executables, same results) instead
    of compiling them again; None leaves the flag out."""
    from c2jax.train.rl_eval import eval_samples

    ev = rl["eval"]
    n = eval_samples(ev)
    ks = f" --ks 1,{ev['k']}" if n != int(ev["k"]) else ""
    return (f"python -m c2jax.bench run --suite {suite_dir} --split eval --limit {ev['n_tasks']} --policy engine "
            f"--checkpoint {ckpt} --k {n}{ks} --temperature {ev['temperature']} --seed {seed} "
            f"--max-in-flight {ev['max_in_flight']} --max-len {rl['max_len']} --agent-config {agent_config} --out {out}"
            + (f" --compile-cache {shlex.quote(compile_cache)}" if compile_cache else ""))


def run_rl(config: Any, workdir: str, prev: dict) -> tuple[dict, dict]:
    from c2jax.agent.policies import EnginePolicy
    from c2jax.envs.backends import make_pool
    from c2jax.sampling import Engine, EngineConfig
    from c2jax.checkpoint import Checkpointer
    from c2jax.train.metrics import MetricsLogger, Progress
    from c2jax.train.rl_family import ensure_family, load_split, make_harness
    from c2jax.envs.grade_cache import GradeCache
    from c2jax.train.rl_learner import make_learner
    from c2jax.train.rl_rollouts import grade_validated
    from c2jax.train.rl_report import write_report
    from c2jax.train.rl_step import RLContext, rl_step
    from c2jax.train.rl_tasks import TaskStream
    from c2jax.train.state import TrainState

    rl, seed, out_dir, tokenizer, cfg = stage_setup(config, workdir, prev, "rl")
    t_stage = time.time()
    fam = ensure_family(config)
    train_tasks, eval_tasks = load_split(fam, "train"), load_split(fam, "eval")[: int(rl["eval"]["n_tasks"])]
    params0 = initial_params(config, rl, prev, cfg)
    timings: dict[str, float] = {}

    # Held-out evaluation of the initial (SFT) policy.
    before = None
    if rl["eval"]["enabled"]:
        save_policy(os.path.join(out_dir, "policy_init"), params0, cfg, tokenizer)
        t0 = time.time()
        before = evaluate(params0, cfg, tokenizer, config, rl, eval_tasks, os.path.join(out_dir, "eval_before"), seed)
        timings["eval_before_s"] = time.time() - t0

    learner = make_learner(cfg, rl, params0)
    state = TrainState.create(jax.tree_util.tree_map(jax.numpy.asarray, params0), learner.tx)
    stream = TaskStream(train_tasks, seed=seed, upsample_after_step=int(rl["curriculum"]["upsample_after_step"]),
                        weights=dict(rl["curriculum"]["weights"]), pool=int(rl["curriculum"]["pool"]))
    version = engine_version = 0
    engine_params = state.params
    ckpt = Checkpointer(os.path.join(out_dir, "checkpoints"), keep=int(rl["keep_checkpoints"]), async_save=False)
    start = 0
    # {step, params, opt_state} as every stage's checkpoint (restore_params reads 'params'), plus the
    # weights the engine holds (they lag the learner's when rl.max_staleness > 0).
    tree = dict(state.to_tree(), engine_params=engine_params)
    got = ckpt.restore_latest(tree)
    loader_state: dict = {}
    if got is not None:
        start, tree, loader_state, _ = got
        state = state.replace_tree(tree)
        engine_params = tree["engine_params"]
        stream.load_state(loader_state["stream"])
        version, engine_version = int(loader_state["version"]), int(loader_state["engine_version"])
        log.info("rl: resumed at step %d (version %d, engine version %d)", start, version, engine_version)
    from c2jax.sync import WeightSync
    from c2jax.sync.engine_sync import engine_params as engine_params_for

    wcfg = dict(rl["weight_sync"])
    if wcfg["mode"] == "delta" and wcfg["dir"] is None:
        wcfg["dir"] = os.path.join(out_dir, "weights")
    # a delta sync with a wire dtype feeds a sampler holding that dtype (bf16 beside f32 masters)
    engine = Engine(engine_params_for(engine_params, wcfg), cfg,
                    EngineConfig(max_slots=int(rl["max_in_flight"]), max_len=int(rl["max_len"]),
                                 recompute_cache_on_update=True), tokenizer=tokenizer, version=engine_version)
    harness, fmt = make_harness(config, tokenizer)
    policy = EnginePolicy(engine, fmt, temperature=float(rl["temperature"]), top_p=float(rl["top_p"]), seed=seed)
    pool = make_pool(config.get("envs"), max_concurrency=int(rl["max_in_flight"]))  # envs.backend picks it
    ref = jax.tree_util.tree_map(jax.numpy.asarray, params0) if rl["reference"] == "init" else None
    weight_sync = WeightSync(engine, wcfg) if wcfg["mode"] == "delta" else None
    grade_fn = GradeCache(grade_validated) if rl["grade_cache"] else None  # None: grade_validated
    task_weights = by_kind = None
    if rl["task_weights"]["by"] == "kind":
        from c2jax.train.rl_tasks import kind_weights

        task_weights, by_kind = kind_weights(train_tasks, float(rl["task_weights"]["power"]))
    ctx = RLContext(rl=rl, learner=learner, engine=engine, policy=policy, harness=harness, pool=pool,
                    ref_params=ref, seed=seed, weight_sync=weight_sync, grade_fn=grade_fn, task_weights=task_weights)
    logger = MetricsLogger(out_dir)
    steps = int(rl["steps"])
    bar = Progress(steps, initial=start, desc="rl")
    t_rl = time.time()
    services = None
    try:
        if rl["services"]["enabled"]:  # the asynchronous services (c2jax.train.async_rl) drive the steps
            from c2jax.train.async_rl.stage import run_services

            def _eval_fn(params: Any, at: int) -> dict:
                ev = evaluate(params, cfg, tokenizer, config, rl, eval_tasks, os.path.join(out_dir, f"eval_step_{at}"), seed)
                res = ev["results"]["overall"]
                k = int(rl["eval"]["k"])
                return {"eval/pass_at_1": res.get("pass@1"), f"eval/pass_at_{k}": res.get(f"pass@{k}")}

            state, version, services = run_services(
                ctx, state, stream=stream, ckpt=ckpt, logger=logger, start=start, version=version,
                loader_state=loader_state, out_dir=out_dir, eval_fn=_eval_fn,
                on_step=lambda s, m: bar.update(1, reward=m.get("reward/total", float("nan")),
                                                pass_rate=m.get("pass_rate", float("nan"))))
        for step in range(start, steps) if services is None else ():
            tasks = stream.take(int(rl["tasks_per_step"]), step)
            out = rl_step(ctx, state, tasks, step=step, version=version, engine_version=engine_version)
            state, version, engine_version = out.state, out.version, out.engine_version
            if engine_version == version:
                engine_params = state.params
            for t in tasks:
                mine = [s.trajectory for s in out.samples if s.task.instance_id == t.instance_id and not s.mask_reason]
                if mine:
                    stream.observe(t.instance_id, turns=float(np.mean([x.effort.turns for x in mine])),
                                   thinking_tokens=float(np.mean([x.effort.thinking_tokens for x in mine])))
            m = dict(out.metrics, tasks_seen=float(len(stream.used)))
            logger.log("train", step + 1, m)
            bar.update(1, reward=m.get("reward/total", float("nan")), pass_rate=m.get("pass_rate", float("nan")))
            if (step + 1) % int(rl["ckpt_every"]) == 0 or step + 1 == steps:
                ckpt.save(step + 1, dict(state.to_tree(), engine_params=engine_params),
                          loader_state={"stream": stream.state(), "version": version, "engine_version": engine_version},
                          meta={"seed": seed})
    finally:
        bar.close()
        logger.close()
        ckpt.close()
        if weight_sync is not None:
            weight_sync.close()  # flush: the last version is written and delivered
        engine.shutdown()
        pool.close()
    timings["rl_s"] = time.time() - t_rl
    final = jax.tree_util.tree_map(np.asarray, state.params)
    summary: dict[str, Any] = {"steps": steps, "tasks_per_step": int(rl["tasks_per_step"]),
                               "group_size": int(rl["group_size"]), "rollouts": steps * int(rl["tasks_per_step"]) * int(rl["group_size"]),
                               "final_version": version, "family_dir": fam["dir"],
                               "trained_tasks": list(stream.used)}  # in training order (sft_matched.tasks_from)
    if by_kind is not None:
        summary["task_weights"] = by_kind  # {kind: {"tasks": n in the stream, "weight": each task's}}
    if rl["eval"]["enabled"]:
        save_policy(os.path.join(out_dir, "policy_final"), final, cfg, tokenizer)
        t0 = time.time()
        after = evaluate(final, cfg, tokenizer, config, rl, eval_tasks, os.path.join(out_dir, "eval_after"), seed)
        timings["eval_after_s"] = time.time() - t0
        summary.update(eval_summary(before, after, rl, seed))
        from c2jax.envs.synth.toyfix_shell_demos import blind_edit_baseline

        # What never reading earns: the most common training fix replayed on the held-out tasks.
        summary["blind_edit_baseline"] = blind_edit_baseline(train_tasks, eval_tasks)
        if rl["tasks"].get("ambiguous"):  # the imitation-gap variant: which fix each sample wrote
            from c2jax.train.rl_family import load_split
            from c2jax.train.rl_imitation_gap import stage_summary

            summary["imitation_gap"] = stage_summary(rl, eval_tasks, load_split(fam, "demo"),
                                                     {"before": before, "after": after})
        agent_json = write_agent_config(config, out_dir)
        cache = active_compile_cache()
        summary["eval_command"] = eval_command(fam["dir"], "CHECKPOINT", rl, seed, "OUT", agent_json, cache)
        summary["eval_commands"] = {t: eval_command(fam["dir"], os.path.join(out_dir, f"policy_{p}"), rl, seed,
                                                    os.path.join(out_dir, f"bench_{t}"), agent_json, cache)
                                    for t, p in (("before", "init"), ("after", "final"))}
        summary["eval_checkpoints"] = {"before": os.path.join(out_dir, "policy_init"),
                                       "after": os.path.join(out_dir, "policy_final")}
        if [int(d) for d in rl["eval"]["difficulties"]] != [int(rl["tasks"]["difficulty"])]:
            from c2jax.train import rl_difficulty

            t0 = time.time()
            by_d = rl_difficulty.sweep({"before": params0, "after": final}, cfg, tokenizer, config, rl, seed,
                                       os.path.join(out_dir, "difficulty"), main={"before": before, "after": after})
            rl_difficulty.plot(by_d, os.path.join(out_dir, "pass_at_1_by_difficulty.png"))
            summary["pass_at_1_by_difficulty"] = {str(d): v for d, v in by_d.items()}
            timings["eval_difficulty_s"] = time.time() - t0
    if services is not None:
        summary["services"] = services
    summary["time"] = timings
    if grade_fn is not None:
        summary["grade_cache"] = grade_fn.stats()
    summary["stage_wall_time_s"] = time.time() - t_stage
    write_report(out_dir, summary, os.path.join(out_dir, "train.jsonl"))
    atomic_write_json(os.path.join(out_dir, "summary.json"), summary, indent=2, sort_keys=True, default=str)
    return dict(prev, checkpoint_dir=os.path.join(out_dir, "checkpoints")), summary


def eval_summary(before: dict, after: dict, rl: dict, seed: int) -> dict:
    """pass@1 / pass@k before and after with CIs, and the paired (task-resampled) differences."""
    from c2jax.bench.metrics import paired_bootstrap_diff

    k = int(rl["eval"]["k"])
    out: dict[str, Any] = {}
    for tag, ev in (("before", before), ("after", after)):
        res = ev["results"]["overall"]
        for kk in (1, k):
            out[f"pass_at_{kk}_{tag}"] = res.get(f"pass@{kk}")
            ci = res.get(f"pass@{kk}_ci95")
            if ci:
                out[f"pass_at_{kk}_{tag}_ci"] = {"lo": ci[0], "hi": ci[1]}
        out[f"masked_rate_{tag}"] = res.get("masked_rate")
        out[f"malformed_tool_call_rate_{tag}"] = res.get("malformed_tool_call_rate")
        out[f"mean_tool_calls_{tag}"] = res.get("mean_tool_calls")
    out["wellformed"] = {f"pass_at_1_wellformed_{tag}": wellformed_pass_rate(ev["rows"])
                         for tag, ev in (("before", before), ("after", after))}
    for tag, ev in (("before", before), ("after", after)):
        out[f"median_tool_calls_resolved_{tag}"] = median_tool_calls_resolved(ev["rows"])
    for kk in (1, k):
        d = paired_bootstrap_diff(before["rows"], after["rows"], kk, seed=seed)
        out[f"pass_at_{kk}_diff_ci"] = {"lo": d["lo"], "hi": d["hi"]}
        out[f"pass_at_{kk}_diff"] = d["mean"]
    return out


def median_tool_calls_resolved(rows: list) -> float | None:
    """Median tool calls of the resolved samples (the family needs reading before editing: >= 2)."""
    calls = [float(s.get("tool_calls") or 0) for r in rows for s in r["samples"] if s.get("resolved")]
    return float(np.median(calls)) if calls else None


def wellformed_pass_rate(rows: list) -> float | None:
    """pass@1 over samples whose tool calls were all well-formed (the lift without protocol effects)."""
    ok = [s for r in rows for s in r["samples"] if not s.get("malformed_tool_calls") and not s.get("masked")]
    return (sum(bool(s.get("resolved")) for s in ok) / len(ok)) if ok else None


@STAGES.register("rl")
def rl_stage(config: Any, workdir: str, state: dict) -> tuple[dict, dict]:
    """RL on the task family through the real harness (see c2jax.train.rl)."""
    return run_rl(config, workdir, state)
