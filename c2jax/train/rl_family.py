"""The RL stage's task family and harness, shared by the cold-start SFT stage, the RL stage and the
evaluation (one place decides where the family is built and how the agent is configured).

    fam = ensure_family(config)            # builds (or finds) the toyfix suite: {"train", "eval", "demo", "dir"}
    harness, fmt = make_harness(config, tokenizer)

The family is content-addressed by its build arguments under ``config.build.dir`` (default
``runs/cache``) so every run and seed on the machine reuses it.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from c2jax.config import to_plain


def cache_root(config: Any) -> str:
    build = to_plain(config.get("build")) if hasattr(config, "get") else None
    root = (build or {}).get("dir") or os.environ.get("C2JAX_RUN_CACHE") or os.path.join("runs", "cache")
    return os.path.abspath(root)


def family_args(config: Any) -> dict:
    from c2jax.rl.stage_config import resolve_stage

    t = resolve_stage(to_plain(config.get("rl")) or {})["tasks"]
    return {**{k: t[k] for k in ("difficulty", "n_train", "n_eval", "n_demo", "seed")}, **family_flags(t)}


def family_flags(tasks: dict) -> dict:
    """The family knobs that are on ({"docstrings": True, "repro": True, "ambiguous": q} or a part):
    absent when off, so families built before a knob existed keep their key."""
    return {**{k: True for k in ("docstrings", "repro") if tasks.get(k)},
            **({"ambiguous": float(tasks["ambiguous"])} if tasks.get("ambiguous") else {})}


def family_key(config: Any) -> dict:
    """The family's identity: its arguments and the generator that makes it (`generator_key`: version
    and code) and the demonstrator's code. The family directory, the demonstrations' cache and the
    cold-start SFT build directory are keyed by it, so editing the generator or the demonstrator
    builds everything made from them again instead of reusing another generator's tasks."""
    from c2jax.envs.synth import toyfix_shell_demos
    from c2jax.envs.synth.toyfix import generator_key, source_digest

    return {**family_args(config), "generator": generator_key(),
            "demonstrator": source_digest(toyfix_shell_demos.__file__)}


def family_dir(config: Any) -> str:
    args = family_args(config)
    h = hashlib.sha256(json.dumps(family_key(config), sort_keys=True).encode()).hexdigest()[:12]
    return os.path.join(cache_root(config), "tasks", f"toyfix-d{args['difficulty']}-{h}")


def ensure_family(config: Any) -> dict:
    """Build (or find) the toyfix suite for this config; returns its paths and counts."""
    from c2jax.envs.synth.toyfix import build_toyfix

    args = family_args(config)
    out = family_dir(config)
    info = dict(build_toyfix(out, n_train=args["n_train"], n_eval=args["n_eval"], n_demo=args["n_demo"],
                             difficulty=args["difficulty"], seed=args["seed"], docstrings=bool(args.get("docstrings")),
                             repro=bool(args.get("repro")), ambiguous=float(args.get("ambiguous", 0.0)),
                             workers=2))
    info["dir"] = out
    from c2jax.envs.synth.toyfix import materialize_envs
    from c2jax.envs.tasks import load_tasks

    # Environments may have been cleaned from this machine's cache: re-create them from the records.
    materialize_envs([t for s in ("train", "eval", "demo") for t in load_tasks(info[s])])
    return info


def load_split(info: dict, split: str) -> list:
    from c2jax.envs.tasks import load_tasks

    path = info.get(split) or os.path.join(info["dir"], f"{split}.jsonl")
    return load_tasks(path)


def make_harness(config: Any, tokenizer: Any):
    """(Harness, ChatFormat) from ``config.agent`` (tool subset, budgets, context for tiny models)."""
    from c2jax.agent.config import harness_config_from
    from c2jax.agent.harness import Harness
    from c2jax.data.chat_format import ChatFormat

    fmt = ChatFormat(tokenizer)
    return Harness(fmt, harness_config_from(config.get("agent") or {})), fmt
