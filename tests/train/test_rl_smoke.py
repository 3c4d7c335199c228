"""`experiments/run.py --config experiments/configs/rl_quickstart.py:smoke` end to end (CPT -> agent
SFT -> RL -> held-out evaluation) in a subprocess, and (slow) kill -9 mid-RL + rerun = the
uninterrupted run's parameters, bit for bit."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from _envs_common import needs_bwrap
from _rl_smoke_common import _cmd, _env, _param_hash, kill9_after_first_step_checkpoint

pytestmark = needs_bwrap

STEP_METRICS = ("reward/total", "reward/task", "reward/length", "reward/broken_tool_calls", "pass_rate",
                "adv/abs_mean", "kl/k1", "kl/k3", "mismatch/with_replay/mean", "mismatch/with_replay/p99",
                "mismatch/no_replay/mean", "mismatch/no_replay/p99", "route_flip_rate", "staleness/hist/0",
                "effort/turns", "effort/tool_calls", "tokens/policy", "tokens/learner", "rollouts/graded",
                "time/rollout_s", "time/grading_s_sum", "time/learner_s", "time/publish_s", "version")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("rl_cache")


def test_smoke_preset_end_to_end(tmp_path, cache):
    r = subprocess.run(_cmd(tmp_path / "w", cache), capture_output=True, text=True, timeout=600, env=_env())
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.load(open(tmp_path / "w" / "summary.json"))
    assert set(summary) == {"cpt", "agent_sft", "rl"}
    rl = summary["rl"]
    for key in ("pass_at_1_before", "pass_at_1_after", "pass_at_2_before", "pass_at_2_after"):
        assert 0.0 <= rl[key] <= 1.0
    for key in ("pass_at_1_diff_ci", "pass_at_2_diff_ci"):
        assert rl[key]["lo"] <= rl[key]["hi"]
    assert rl["rollouts"] == 2 * 2 * 2 and rl["final_version"] == 2
    assert "--policy engine" in rl["eval_command"] and "--k 2" in rl["eval_command"]
    assert rl["masked_rate_before"] <= 0.02 and rl["masked_rate_after"] <= 0.02
    rows = [json.loads(line) for line in open(tmp_path / "w" / "rl" / "train.jsonl")]
    assert [r["step"] for r in rows] == [1, 2]
    for key in STEP_METRICS:
        assert key in rows[-1], key
    assert rows[-1]["mismatch/with_replay/mean"] < 1e-4  # replay: learner == sampler up to float noise
    for name in ("rl_curve.png", "report.md", "policy_init/tokenizer.json", "policy_final/model.json"):
        assert (tmp_path / "w" / "rl" / name).exists(), name
    assert "Time breakdown" in (tmp_path / "w" / "rl" / "report.md").read_text()
    # cached build stages, one directory each, SFT's nested under the CPT it starts from
    assert os.path.dirname(summary["agent_sft"]["build_dir"]) == summary["cpt"]["build_dir"]


@pytest.mark.slow
def test_kill9_mid_rl_then_rerun_is_bit_identical(tmp_path, cache):
    extra = ("--config.rl.steps=3", "--config.rl.eval.enabled=False", "--config.rl.tasks.n_train=6",
             "--config.seed=3")
    a = subprocess.run(_cmd(tmp_path / "a", cache, *extra), capture_output=True, text=True, timeout=900, env=_env())
    assert a.returncode == 0, a.stderr[-3000:]
    ck = tmp_path / "b" / "rl" / "checkpoints"
    steps = kill9_after_first_step_checkpoint(_cmd(tmp_path / "b", cache, *extra), ck, 600)  # right after step 1
    assert steps and max(int(s) for s in steps) < 3, steps
    b = subprocess.run(_cmd(tmp_path / "b", cache, *extra), capture_output=True, text=True, timeout=900, env=_env())
    assert b.returncode == 0, b.stderr[-3000:]
    assert _param_hash(tmp_path / "a") == _param_hash(tmp_path / "b")


@pytest.mark.slow
def test_kind_task_weights_reach_the_update(tmp_path, cache):
    """`rl.task_weights.by=kind` end to end (the smoke build reused): the summary lists the stream's kinds
    with weights of mean 1 over its tasks, and each step's update logs the weights of the groups it used."""
    r = subprocess.run(_cmd(tmp_path / "w", cache, "--config.rl.task_weights.by=kind", "--config.rl.eval.enabled=False"),
                       capture_output=True, text=True, timeout=600, env=_env())
    assert r.returncode == 0, r.stderr[-3000:]
    by = json.load(open(tmp_path / "w" / "summary.json"))["rl"]["task_weights"]
    n = sum(v["tasks"] for v in by.values())
    assert sum(v["tasks"] * v["weight"] for v in by.values()) == pytest.approx(n)
    rows = [json.loads(line) for line in open(tmp_path / "w" / "rl" / "train.jsonl")]
    assert all("adv/group_weight_mean" in r and r["adv/group_weight_mean"] > 0 for r in rows)
