"""``sft_matched`` stage: the control for the RL stage. It spends the RL stage's wall time on more
supervised training over scripted demonstrations of the SAME train tasks RL sees, starting from the
same SFT checkpoint, and is evaluated on the same held-out tasks with the same command. If RL's
held-out pass@1 beats it, the lift is RL's and not just more supervised data.

    python experiments/run.py --config experiments/configs/rl_quickstart.py:sft_matched --workdir runs/sft_matched

Config: ``config.sft_matched = dict(max_wall_s=..., max_steps=..., peak_lr=..., batch_size=...,
tasks_from=..., match_rl_wall=...)``. The control trains for the RL stage's measured time: with
``match_rl_wall=True`` and ``tasks_from`` naming an RL run, exactly that run's ``time.rl_s`` (RL
training, evaluations excluded), so a faster RL configuration gives its control less time too;
otherwise ``max_wall_s`` seconds (the preset's figure, measured on this machine type).

Which demonstrations: those of the tasks the RL stage trains on, no others (RL takes
``steps x tasks_per_step`` tasks from a single-epoch stream, not the whole train split):
``tasks_from`` = an RL run's workdir (or its ``rl/summary.json``) uses that run's ``trained_tasks``,
exactly; ``tasks_from=None`` uses the first ``steps x tasks_per_step`` tasks of the stream's seeded
order, which are RL's tasks until hard-task upsampling starts (``rl.curriculum.upsample_after_step``)
and the pool it picks among afterwards, so a few may differ. Tasks the scripted expert cannot
demonstrate have no demonstration, for the control as for the cold start.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any

import jax
import numpy as np

from c2jax.config import Checker, ConfigError, register_validator, to_plain
from c2jax.train.stages import STAGES

SFT_MATCHED_DEFAULTS = dict(max_wall_s=600.0, max_steps=100000, peak_lr=3e-4, batch_size=4, tasks_from=None,
                            match_rl_wall=True)


def _trained_tasks_path(tasks_from: str) -> str:
    """An RL run's workdir, its rl/ directory or its summary.json -> the summary.json path."""
    for cand in (tasks_from, os.path.join(tasks_from, "summary.json"), os.path.join(tasks_from, "rl", "summary.json")):
        if os.path.isfile(cand):
            return cand
    return os.path.join(tasks_from, "rl", "summary.json")


def _rl_summary(tasks_from: str) -> tuple[str, Any]:
    path = _trained_tasks_path(tasks_from)
    try:
        with open(path) as f:
            return path, json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"no RL summary with trained_tasks at {path} ({type(e).__name__})") from None


def rl_trained_task_ids(tasks_from: str) -> list[str]:
    """The ``trained_tasks`` an RL run's summary.json records (ValueError naming the file if absent)."""
    path, d = _rl_summary(tasks_from)
    ids = d.get("trained_tasks") or (d.get("rl") or {}).get("trained_tasks") if isinstance(d, dict) else None
    if not ids:
        raise ValueError(f"{path} has no trained_tasks (expected an RL run's summary.json)")
    return list(ids)


def rl_training_seconds(tasks_from: str) -> float:
    """The RL stage's measured training time (``time.rl_s`` of its summary.json; ValueError if absent)."""
    path, d = _rl_summary(tasks_from)
    if isinstance(d, dict) and "time" not in d:
        d = d.get("rl")  # a workdir's {stage: summary}
    t = (d.get("time") or {}).get("rl_s") if isinstance(d, dict) else None
    if not isinstance(t, (int, float)) or not t > 0:
        raise ValueError(f"{path} has no time.rl_s (the RL stage's training time)")
    return float(t)


def training_budget_s(c: dict) -> tuple[float, str]:
    """(seconds of SFT, where the figure comes from) for the resolved ``sft_matched`` section."""
    if c["match_rl_wall"] and c["tasks_from"] is not None:
        return rl_training_seconds(c["tasks_from"]), f"time.rl_s of {_trained_tasks_path(c['tasks_from'])}"
    return float(c["max_wall_s"]), "sft_matched.max_wall_s"


@register_validator("sft_matched")
def validate_sft_matched(check: Checker, section: Any, full: Any) -> None:
    d = dict(to_plain(section) or {})
    for k in d:
        if k not in SFT_MATCHED_DEFAULTS:
            check.error(k, f"unknown option; known: {sorted(SFT_MATCHED_DEFAULTS)}")
    c = dict(SFT_MATCHED_DEFAULTS, **d)
    check.float_range(c, "max_wall_s", 0.0, lo_open=True)
    check.float_range(c, "peak_lr", 0.0, lo_open=True)
    check.int_range(c, "max_steps", 1)
    check.int_range(c, "batch_size", 1)
    if not isinstance(c["match_rl_wall"], bool):
        check.error("match_rl_wall", f"must be True or False, got {c['match_rl_wall']!r}")
    if c["tasks_from"] is not None:
        if not isinstance(c["tasks_from"], str):
            check.error("tasks_from", f"must be None or an RL run's workdir, got {c['tasks_from']!r}")
        else:
            try:
                rl_trained_task_ids(c["tasks_from"])
            except ValueError as e:
                check.error("tasks_from", str(e))
            else:
                if c["match_rl_wall"] is True:
                    try:
                        rl_training_seconds(c["tasks_from"])
                    except ValueError as e:
                        check.error("tasks_from", f"{e} (or set sft_matched.match_rl_wall=False)")


def run_sft_matched(config: Any, workdir: str, prev: dict) -> tuple[dict, dict]:
    from c2jax.train.agent_sft import demo_trajectories, resolve, train_on_demos
    from c2jax.compile_cache import active_compile_cache
    from c2jax.train.rl import eval_command, evaluate, initial_params, save_policy, stage_setup, write_agent_config
    from c2jax.train.rl_family import ensure_family, load_split

    c = dict(SFT_MATCHED_DEFAULTS, **dict(to_plain(config.get("sft_matched")) or {}))
    rl, seed, out_dir, tokenizer, cfg = stage_setup(config, workdir, prev, "sft_matched")
    fam = ensure_family(config)
    params0 = initial_params(config, rl, prev, cfg)
    trajs = demo_trajectories(config, fam, tokenizer, "train", int(rl["tasks"]["n_train"]),
                              style=resolve(config.get("agent_sft"))["demo_style"])  # the cold start's expert
    wanted = matched_task_ids(fam, rl, seed, c["tasks_from"])
    trajs = [t for t in trajs if t.task_id in wanted]
    if not trajs:
        raise ConfigError([("sft_matched", "no demonstration of the RL stage's train tasks succeeded")])
    sc = dict(resolve(config.get("agent_sft")), batch_size=int(c["batch_size"]))
    budget_s, budget_from = training_budget_s(c)
    t0 = time.time()
    params, tsum = train_on_demos(params0, cfg, trajs, sc, seed, out_dir, int(c["max_steps"]),
                                  max_wall_s=budget_s,
                                  schedule={"name": "constant", "peak_lr": float(c["peak_lr"]), "warmup_steps": 0})
    train_s = time.time() - t0
    params = jax.tree_util.tree_map(np.asarray, params)
    save_policy(os.path.join(out_dir, "policy_final"), params, cfg, tokenizer)
    eval_tasks = load_split(fam, "eval")[: int(rl["eval"]["n_tasks"])]
    after = evaluate(params, cfg, tokenizer, config, rl, eval_tasks, os.path.join(out_dir, "eval_after"), seed)
    res = after["results"]["overall"]
    k = int(rl["eval"]["k"])
    summary = {"train": tsum, "train_s": train_s, "tasks_from": c["tasks_from"], "rl_tasks": len(wanted),
               "demonstrated_tasks": len({t.task_id for t in trajs}), "max_wall_s": budget_s,
               "max_wall_s_from": budget_from, "pass_at_1_after": res.get("pass@1"), f"pass_at_{k}_after": res.get(f"pass@{k}"),
               "pass_at_1_after_ci": res.get("pass@1_ci95"), "masked_rate_after": res.get("masked_rate"),
               "eval_command": eval_command(fam["dir"], os.path.join(out_dir, "policy_final"), rl, seed, "OUT",
                                             write_agent_config(config, out_dir), active_compile_cache())}
    if rl["tasks"].get("ambiguous"):  # the imitation-gap variant: which fix each sample wrote
        from c2jax.train.rl_imitation_gap import stage_summary

        summary["imitation_gap"] = stage_summary(rl, eval_tasks, load_split(fam, "demo"), {"after": after})
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2, default=str)
    return prev, summary


def matched_task_ids(fam: dict, rl: dict, seed: int, tasks_from: str | None) -> set[str]:
    """The ids of the tasks the RL stage trains on (see the module docstring)."""
    if tasks_from is not None:
        return set(rl_trained_task_ids(tasks_from))
    from c2jax.train.rl_family import load_split
    from c2jax.train.rl_tasks import TaskStream

    order = TaskStream(load_split(fam, "train"), seed=seed).order
    return set(order[: int(rl["steps"]) * int(rl["tasks_per_step"])])


@STAGES.register("sft_matched")
def sft_matched_stage(config: Any, workdir: str, state: dict) -> tuple[dict, dict]:
    """More SFT instead of RL, for the same wall time (see c2jax.train.sft_matched)."""
    return run_sft_matched(config, workdir, state)
