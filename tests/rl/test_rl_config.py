"""The ``rl`` section: rl_quickstart writes every RL default explicitly (so every key can be overridden
on the locked config), a bad section fails before any compute naming each bad key and its allowed
values, and the single-epoch task stream is deterministic, resumable and upsamples hard buckets."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import types

import pytest
from _paths import REPO_ROOT  # noqa: E402

ROOT = REPO_ROOT
CONFIG = os.path.join(ROOT, "experiments", "configs", "rl_quickstart.py")


def _module():
    spec = importlib.util.spec_from_file_location("rl_quickstart", CONFIG)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def _paths(d, prefix=""):
    out = set()
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and k != "rewards":
            out |= _paths(v, key + ".")
        else:
            out.add(key)
    return out


@pytest.mark.parametrize("preset", ["default", "smoke", "std_norm", "token_mean", "k3_in_loss", "no_replay", "q0",
                                    "w_reinforce", "mean_reward", "best_of_2", "top_entropy", "unlikely", "sft_matched"])
def test_rl_quickstart_writes_every_rl_default(preset):
    from c2jax.config import validate
    from c2jax.rl.stage_config import full_rl_defaults

    cfg = _module().get_config(preset)
    have = _paths(cfg.rl.to_dict())
    want = _paths(full_rl_defaults())
    assert want <= have, f"keys of the RL defaults missing from rl_quickstart: {sorted(want - have)}"
    validate(cfg, warn=False)


def _leaf_types(cd, prefix=""):
    """(path, declared type) of every leaf of a ConfigDict (the type a command-line override parses to)."""
    import ml_collections

    for k in cd.keys():
        v = cd[k]
        if isinstance(v, ml_collections.ConfigDict):
            yield from _leaf_types(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", cd.get_type(k)


def test_every_rl_key_can_be_overridden_from_the_command_line():
    """A key whose default is None must be a typed placeholder: absl cannot override a NoneType field."""
    cfg = _module().get_config("default")
    untyped = [p for p, t in _leaf_types(cfg.rl) if t is type(None)]
    assert not untyped, f"rl keys that --config.rl.KEY=... cannot set: {untyped}"
    assert cfg.rl.weight_sync.wire_dtype is None and cfg.rl.to_dict()["objective"]["tis_cap"] is None


def test_run_py_takes_an_override_of_a_none_default_and_a_muon_optimizer(tmp_path):
    """The override reaches the validator (here failing on another key, so nothing runs)."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "run.py"), f"--config={CONFIG}:smoke",
                        f"--workdir={tmp_path / 'w'}", "--config.rl.weight_sync.wire_dtype=bfloat16",
                        "--config.rl.objective.tis_cap=2.0", "--config.rl.optimizer.name=muon",
                        "--config.rl.weight_sync.mode=bogus"], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert r.returncode == 2, r.stderr[-2000:]
    assert "rl.weight_sync" in r.stderr and "wire_dtype" not in r.stderr.split("invalid config")[-1]
    assert "rl.optimizer.name" not in r.stderr and "tis_cap" not in r.stderr
    r = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "run.py"), f"--config={CONFIG}:smoke",
                        f"--workdir={tmp_path / 'w'}", "--config.rl.optimizer.name=sgd"],
                       capture_output=True, text=True, timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert r.returncode == 2 and "rl.optimizer.name: must be one of ['adamw', 'muon']" in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "w").exists()


def test_presets_change_what_they_say():
    m = _module()
    assert m.get_config("std_norm").rl.advantage.std_normalize is True
    assert m.get_config("token_mean").rl.aggregation.name == "token_mean"
    k3 = m.get_config("k3_in_loss").rl.kl
    assert (k3.estimator, k3.placement) == ("k3", "loss") and k3.coef > 0
    assert m.get_config("no_replay").rl.router_replay is False
    assert m.get_config("q0").rl.rewards.length.q == 0.0
    assert m.get_config("w_reinforce").rl.advantage.positive_weight == 0.1
    assert m.get_config("default").rl.advantage.positive_weight == 1.0
    assert m.get_config("default").rl.advantage.k == 1 and m.get_config("best_of_2").rl.advantage.k == 2
    assert m.get_config("mean_reward").rl.advantage.k == 1
    assert m.get_config("top_entropy").rl.token_filter.name == "top_entropy"
    u = m.get_config("unlikely").rl.rewards
    assert (u.unlikeliness.fn, u.unlikeliness.weight, u.unlikeliness.of) == ("unlikeliness", 0.25, "task")
    assert m.get_config("default").rl.rewards.unlikeliness.to_dict() == dict(u.unlikeliness.to_dict(), weight=0.375)
    assert m.get_config("default").rl.kl.coef == 0.0 and m.get_config("default").rl.kl.estimator == "k1"


def test_bad_rl_section_names_every_bad_key():
    from c2jax.config import ConfigError, validate

    cfg = _module().get_config("default")
    cfg.rl.steps = 0
    cfg.rl.learner_moe_impl = "capacity"
    cfg.rl.max_staleness = -1
    cfg.rl.tasks.suite = "nope"
    cfg.rl.eval.k = 0
    cfg.rl.curriculum.weights = {"tokens": 1.0}
    cfg.rl.rewards.unlikeliness.logp_key = "sampler"
    with pytest.raises(ConfigError) as e:
        validate(cfg, warn=False)
    keys = {k for k, _ in e.value.problems}
    assert {"rl.steps", "rl.learner_moe_impl", "rl.max_staleness", "rl.tasks.suite", "rl.eval.k",
            "rl.curriculum.weights.tokens", "rl.rewards.unlikeliness.logp_key"} <= keys
    msg = str(e.value)
    assert "['dropless', 'pallas', 'sampler_dense']" in msg and "['toyfix']" in msg  # the exact MoE impls


def test_single_epoch_needs_enough_tasks():
    from c2jax.config import ConfigError, validate

    cfg = _module().get_config("default")
    cfg.rl.tasks.n_train = 10
    with pytest.raises(ConfigError, match="rl.tasks.n_train"):
        validate(cfg, warn=False)


def test_run_py_rejects_a_bad_rl_section_before_any_compute(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "run.py"), f"--config={CONFIG}:smoke",
                        f"--workdir={tmp_path / 'w'}", "--config.rl.group_size=1", "--config.rl.top_p=2.0",
                        "--config.rl.objective.name=bogus"], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert r.returncode == 2, r.stderr[-2000:]
    for key in ("rl.group_size", "rl.top_p", "rl.objective.name"):
        assert key in r.stderr
    assert not (tmp_path / "w").exists()  # nothing ran


def _tasks(n, buckets=("a", "b")):
    return [types.SimpleNamespace(instance_id=f"t{i:03d}", metadata={"bucket": buckets[i % len(buckets)]})
            for i in range(n)]


def test_task_stream_single_epoch_deterministic_and_resumable():
    from c2jax.train.rl_tasks import TaskStream

    tasks = _tasks(12)
    a, b = TaskStream(tasks, seed=1), TaskStream(tasks, seed=1)
    first = [t.instance_id for t in a.take(4, 0)]
    assert first == [t.instance_id for t in b.take(4, 0)]
    assert first != [t.instance_id for t in TaskStream(tasks, seed=2).take(4, 0)]
    state = a.state()
    rest = [t.instance_id for t in a.take(8, 1)]
    c = TaskStream(tasks, seed=1)
    c.load_state(state)
    assert [t.instance_id for t in c.take(8, 1)] == rest
    assert sorted(first + rest) == sorted(t.instance_id for t in tasks)  # each task exactly once
    with pytest.raises(RuntimeError, match="exhausted"):
        a.take(1, 3)


def test_task_stream_upsamples_the_harder_bucket_after_the_switch():
    from c2jax.train.rl_tasks import TaskStream

    tasks = _tasks(40)
    s = TaskStream(tasks, seed=0, upsample_after_step=1, weights={"turns": 1.0}, pool=4)
    for t in s.take(4, 0):  # before the switch: permutation order
        s.observe(t.instance_id, turns=9.0 if t.metadata["bucket"] == "b" else 1.0)
    picked = s.take(8, 1)
    share_b = sum(t.metadata["bucket"] == "b" for t in picked) / len(picked)
    assert share_b >= 0.75  # the hard bucket dominates once upsampling starts (0.5 without)


def test_a_demo_style_whose_tools_are_not_enabled_fails_before_compute():
    """The default shell demonstrations need the terminal tool; the read_replace expert needs
    read_file and search_replace, which the quickstart does not declare: validation names the key."""
    from c2jax.config import ConfigError, validate

    cfg = _module().get_config("default")
    assert list(cfg.agent.tools.enabled) == ["run_terminal_cmd"] and cfg.agent_sft.demo_style == "shell_locate"
    validate(cfg, warn=False)
    cfg.agent_sft.demo_style = "read_replace"
    with pytest.raises(ConfigError, match="demo_style"):
        validate(cfg, warn=False)
    cfg.agent.tools.enabled = ["read_file", "search_replace", "run_terminal_cmd"]
    validate(cfg, warn=False)


def test_demo_style_choices_are_validated_before_compute():
    """`shell_locate_qf` (quote-free spans) is a known style and needs only the terminal tool; an
    unknown style is named with the allowed values."""
    from c2jax.config import ConfigError, validate

    cfg = _module().get_config("default")
    cfg.agent_sft.demo_style = "shell_locate_qf"
    validate(cfg, warn=False)
    cfg.agent_sft.demo_style = "shell_locate_quotes"
    with pytest.raises(ConfigError, match="shell_locate_qf"):
        validate(cfg, warn=False)


def test_rl_starts_from_another_runs_policy_with_init_from_hf(tmp_path):
    """`rl.init_from='hf:DIR'` (e.g. an `sft_matched` run's `policy_final`) passes validation and the
    stage starts from exactly the saved parameters; an unknown scheme is rejected before compute."""
    import jax
    import numpy as np

    from c2jax.config import ConfigError, validate
    from c2jax.model import init
    from c2jax.model.config import preset
    from c2jax.model.hf.io import save_pretrained
    from c2jax.train.rl import initial_params

    cfg_m = preset("tiny")
    saved = init(cfg_m, jax.random.PRNGKey(3))
    save_pretrained(saved, cfg_m, str(tmp_path))
    cfg = _module().get_config("default")
    cfg.rl.init_from = f"hf:{tmp_path}"
    validate(cfg, warn=False)
    got = initial_params(cfg, {"init_from": f"hf:{tmp_path}"}, {}, cfg_m)
    fresh = init(cfg_m, jax.random.PRNGKey(4))  # control: another init differs, so equality means something
    leaves = lambda t: jax.tree_util.tree_leaves(t)  # noqa: E731
    assert len(leaves(got)) == len(leaves(saved))
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(leaves(got), leaves(saved)))
    assert not all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(leaves(fresh), leaves(saved)))
    cfg.rl.init_from = f"hub:{tmp_path}"
    with pytest.raises(ConfigError, match="hf:PATH"):
        validate(cfg, warn=False)
