"""Scoring an agent checkpoint on a suite through the harness (c2jax.bench.agent_eval): many episodes in
flight reach the engine together, masked samples count as failures, greedy engine == the same
checkpoint behind `c2jax.serve`, the CLI round trip (run, run, compare), order-free sampling seeds,
and the paired bootstrap (c2jax.bench.metrics.paired_bootstrap_diff).

Model: the tiny preset as the bigram machine of tests/serve/test_serve_openai.py (greedy: a read_lints call
every turn), or random-init weights (sampling: varied tokens).
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import re

import numpy as np
import pytest

from _agent_common import FIX_PATCH, agent_tokenizer, chat_format, needs_bwrap  # noqa: F401
from c2jax.bench.metrics import paired_bootstrap_diff, pass_at_k

HIDDEN = "from pkg.calc import add\nassert add(2, 2) == 4\nassert add(-1, 1) == 0\n"
MAX_LEN = 1024


def make_task(env_id: str, iid: str = "calc-add-sign", split: str = "train", category: str = "harbor"):
    from c2jax.envs.tasks import record_from_json

    return record_from_json({
        "instance_id": iid, "source": {"kind": "harbor", "package": "calc", "version": "0", "sha256": "",
                                       "license": "MIT"},
        "codebase": "calc", "env_id": env_id, "category": category, "subcategory": "sign", "split": split,
        "problem_statement": f"add() subtracts; make it add. ({iid})",
        "test": {"runner": "script", "cmd": ["sh", "-c", "python hidden_check.py && echo 1 > reward.txt || echo 0 > reward.txt"],
                 "report": "reward.txt"},
        "timeouts": {"agent_s": 120, "verify_s": 60}, "limits": {"timeout_s": 60},
        "hidden_tests": {"files": {"hidden_check.py": HIDDEN}, "FAIL_TO_PASS": ["hidden_check"], "PASS_TO_PASS": []},
        "patch": FIX_PATCH, "protected_paths": ["hidden_check.py"], "provenance": {}, "stats": {}})


def hcfg(max_turns: int = 2, max_new: int = 48):
    from c2jax.agent.harness import HarnessConfig
    from c2jax.agent.tools import ToolConfig

    return HarnessConfig(system_prompt="You are a coding agent.", tools=ToolConfig(enabled=("read_lints", "run_terminal_cmd")),
                         max_turns=max_turns, max_new_tokens=max_new)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A serving checkpoint of the bigram machine (tests/serve/test_serve_openai.py) -> (dir, params, cfg)."""
    from _serve_common import bigram_params

    from c2jax.model import preset
    from c2jax.serve import load_serving_checkpoint, save_serving_checkpoint

    fmt = chat_format()
    cfg = preset("tiny").replace(vocab_size=fmt.tok.vocab_size, mtp_depth=0)
    d = str(tmp_path_factory.mktemp("agent_eval_ckpt"))
    save_serving_checkpoint(d, bigram_params(cfg, fmt), cfg, fmt.tok)
    params, cfg2, _ = load_serving_checkpoint(d)
    return d, params, cfg2


def _engine(params, cfg, slots: int = 32):
    """Every engine of this module has 32 slots: one set of compiled shapes (a new shape costs ~15 s)."""
    from c2jax.sampling import Engine, EngineConfig

    return Engine(params, cfg, EngineConfig(max_slots=slots, max_len=MAX_LEN, prefill_chunk=256),
                  tokenizer=chat_format().tok)


def _count_engine_peak(engine) -> dict:
    """Wrap add_request: the most requests queued or running in the engine at once."""
    peak = {"max": 0, "n": 0}
    orig = engine.add_request

    def add(req, index=None, **kw):
        seq = orig(req, index, **kw)
        now = len(engine.unfinished())
        peak["max"], peak["n"] = max(peak["max"], now), peak["n"] + 1
        return seq

    engine.add_request = add
    return peak


pytestmark = needs_bwrap


# ---- paired bootstrap (no sandbox needed, but cheap) ------------------------------------------------

def _rows(outcomes: dict[str, list[bool]], masked: dict[str, list[bool]] | None = None):
    masked = masked or {}
    return [{"instance_id": i, "category": "c", "split": "eval", "samples": [
        {"sample": j, "resolved": r, "masked": masked.get(i, [False] * len(o))[j]} for j, r in enumerate(o)]}
        for i, o in outcomes.items()]


def test_paired_bootstrap_identical_shift_and_bruteforce():
    rng = random.Random(0)
    a = {f"t{i}": [rng.random() < 0.4 for _ in range(4)] for i in range(30)}
    d = paired_bootstrap_diff(_rows(a), _rows(a), k=1, n_boot=2000)
    assert (d["mean"], d["lo"], d["hi"]) == (0.0, 0.0, 0.0)
    # B resolves every task A does not, in every sample; A's tasks are all-fail or all-pass halves:
    # the per-task difference is a constant 0.5 at k=1 if A passes 2 of 4 on every task
    a2 = {f"t{i}": [True, True, False, False] for i in range(10)}
    b2 = {f"t{i}": [True] * 4 for i in range(10)}
    d = paired_bootstrap_diff(_rows(a2), list(reversed(_rows(b2))), k=1)  # matched by id, not order
    assert (d["mean"], d["lo"], d["hi"]) == (0.5, 0.5, 0.5)
    assert paired_bootstrap_diff(_rows(a2), _rows(b2), k=2)["mean"] == pytest.approx(1 - pass_at_k(4, 2, 2))
    # brute force: 3 tasks -> all 27 equally likely resamples; the bootstrap's quantiles match them
    a3 = {"x": [False, False], "y": [True, False], "z": [True, True]}
    b3 = {"x": [True, True], "y": [True, False], "z": [False, True]}
    di = [1.0, 0.0, -0.5]
    means = sorted(sum(di[i] for i in idx) / 3 for idx in np.ndindex(3, 3, 3))
    d = paired_bootstrap_diff(_rows(a3), _rows(b3), k=1, n_boot=20000, seed=1)
    assert d["mean"] == pytest.approx(np.mean(di))
    # the exact bootstrap distribution's quantiles (inverse CDF): -0.5 and 1.0 each have mass 1/27 > 2.5%
    assert d["lo"] == pytest.approx(np.quantile(means, 0.025, method="inverted_cdf")) == -0.5
    assert d["hi"] == pytest.approx(np.quantile(means, 0.975, method="inverted_cdf")) == 1.0
    d = paired_bootstrap_diff(_rows(a3), _rows(b3), k=1, n_boot=20000, seed=1, alpha=0.5)  # quartiles
    assert d["lo"] == pytest.approx(np.quantile(means, 0.25, method="inverted_cdf"))
    assert d["hi"] == pytest.approx(np.quantile(means, 0.75, method="inverted_cdf"))
    # masked = failure: a masked resolved-looking sample does not count
    m = paired_bootstrap_diff(_rows({"x": [True]}), _rows({"x": [True]}, {"x": [True]}), k=1, n_boot=10)
    assert m["mean"] == -1.0
    with pytest.raises(ValueError, match="different tasks"):
        paired_bootstrap_diff(_rows({"x": [True]}), _rows({"y": [True]}), k=1)
    with pytest.raises(ValueError, match="samples"):
        paired_bootstrap_diff(_rows({"x": [True]}), _rows({"x": [True]}), k=2)


def test_paired_bootstrap_coverage_and_pairing():
    """Synthetic runs with a true difference of 0.1 in per-task solve rate: the 90% CI covers it in
    roughly 90% of repetitions, and pairing gives a narrower CI than treating the runs as independent."""
    hits, widths = 0, []
    reps = 60
    for rep in range(reps):
        rng = np.random.default_rng(rep)
        p = rng.uniform(0.1, 0.8, size=80)  # per-task difficulty, shared by both runs
        a = {f"t{i}": list(rng.random(4) < p[i]) for i in range(80)}
        b = {f"t{i}": list(rng.random(4) < p[i] + 0.1) for i in range(80)}
        d = paired_bootstrap_diff(_rows(a), _rows(b), k=1, n_boot=1000, seed=rep, alpha=0.1)
        hits += d["lo"] <= 0.1 <= d["hi"]
        widths.append(d["hi"] - d["lo"])
    assert 0.75 <= hits / reps <= 0.98, hits / reps
    # an unpaired CI (resampling the two runs' tasks independently) is wider
    from c2jax.bench.metrics import bootstrap_ci

    rng = np.random.default_rng(0)
    pa = [float(x) for x in rng.random(80) < 0.5]
    lo_a, hi_a = bootstrap_ci(pa)
    assert np.mean(widths) < 2 * (hi_a - lo_a)


def test_pooled_paired_bootstrap_one_pair_equals_paired_and_brute_force_over_pairs(tmp_path):
    """One pair is exactly `paired_bootstrap_diff`; two pairs average the per-task differences before
    resampling tasks (checked against all 27 resamples of 3 tasks); mismatched task sets fail; the CLI
    `python -m c2jax.bench pool` prints the pooled difference from two --out directories per seed."""
    import json
    import subprocess
    import sys

    from c2jax.bench.metrics import pooled_paired_bootstrap_diff

    rng = random.Random(1)
    a = {f"t{i}": [rng.random() < 0.4 for _ in range(4)] for i in range(20)}
    b = {f"t{i}": [rng.random() < 0.6 for _ in range(4)] for i in range(20)}
    one = pooled_paired_bootstrap_diff([(_rows(a), _rows(b))], k=1, n_boot=3000, seed=3)
    assert one == paired_bootstrap_diff(_rows(a), _rows(b), k=1, n_boot=3000, seed=3)
    a3 = {"x": [False, False], "y": [True, False], "z": [True, True]}
    b3 = {"x": [True, True], "y": [True, False], "z": [False, True]}  # per-task d: 1, 0, -0.5
    c3 = {"x": [False, False], "y": [True, True], "z": [True, True]}  # vs a3: 0, 0.5, 0
    di = [(1.0 + 0.0) / 2, (0.0 + 0.5) / 2, (-0.5 + 0.0) / 2]
    means = sorted(sum(di[i] for i in idx) / 3 for idx in np.ndindex(3, 3, 3))
    d = pooled_paired_bootstrap_diff([(_rows(a3), _rows(b3)), (_rows(a3), _rows(c3))], k=1, n_boot=20000, seed=1,
                                     alpha=0.5)
    assert d["pairs"] == 2 and d["mean"] == pytest.approx(np.mean(di))
    assert d["lo"] == pytest.approx(np.quantile(means, 0.25, method="inverted_cdf"))
    assert d["hi"] == pytest.approx(np.quantile(means, 0.75, method="inverted_cdf"))
    with pytest.raises(ValueError, match="different tasks"):
        pooled_paired_bootstrap_diff([(_rows(a3), _rows(b3)), (_rows({"x": [True]}), _rows({"x": [True]}))], k=1)
    runs = []
    for name, o in (("a", a3), ("b", b3), ("a2", a3), ("c", c3)):
        (tmp_path / name).mkdir()
        if name.startswith("a"):  # a `bench run --out` directory
            (tmp_path / name / "results.json").write_text(json.dumps({"tasks": _rows(o), "summary": {}}))
        else:  # an RL stage's evaluation directory
            (tmp_path / name / "results.json").write_text(json.dumps({"overall": {}}))
            (tmp_path / name / "rows.json").write_text(json.dumps(_rows(o)))
        runs.append(str(tmp_path / name))
    r = subprocess.run([sys.executable, "-m", "c2jax.bench", "pool", *runs, "--k", "1", "--out",
                        str(tmp_path / "pool.json")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = json.loads((tmp_path / "pool.json").read_text())["diffs"]["pass@1"]
    assert got["mean"] == pytest.approx(np.mean(di)) and "pooled over 2" in r.stdout
    bad = subprocess.run([sys.executable, "-m", "c2jax.bench", "pool", *runs[:3]], capture_output=True, text=True)
    assert bad.returncode == 2 and "pairs" in bad.stderr


# ---- agent evaluation through the harness -------------------------------------------------------------

def _fake_grade(task, diff):
    from c2jax.envs.grading import GradeResult

    if task.instance_id.startswith("masked"):
        return GradeResult(0.0, False, 0.0, 0, masked=True, flags=["infra:test"])
    ok = "return a + b" in diff
    return GradeResult(float(ok), ok, float(ok), 0)


def test_32_episodes_in_flight_reach_the_engine_together(ckpt, repo_env):
    """8 tasks x k=4 with max_in_flight=32: every episode's first turn is in the engine at once."""
    from c2jax.agent.harness import Harness
    from c2jax.agent.policies import EnginePolicy
    from c2jax.bench.agent_eval import evaluate_agent, summarize_agent

    _, params, cfg = ckpt
    fmt = chat_format()
    eng = _engine(params, cfg)
    peak = _count_engine_peak(eng)
    pol = EnginePolicy(eng, fmt, temperature=0.0, seed=0)
    # hold the first requests until all 32 episodes have asked (sandbox starts are staggered):
    # what the engine then sees together is exactly what the semaphore let through
    gate = {"waiting": 0}
    ev = asyncio.Event

    class Gate(EnginePolicy):
        async def agenerate(self, req):
            if req.turn == 0:
                gate.setdefault("ev", ev())
                gate["waiting"] += 1
                if gate["waiting"] >= 32:
                    gate["ev"].set()
                try:
                    await asyncio.wait_for(gate["ev"].wait(), 60)
                except asyncio.TimeoutError:
                    pass
            return await super().agenerate(req)

    gpol = Gate(eng, fmt, temperature=0.0, seed=0)
    tasks = [make_task(repo_env[1], f"t{i}", split="eval" if i % 2 else "train") for i in range(8)]
    stats: dict = {}
    try:
        rows = evaluate_agent(tasks, Harness(fmt, hcfg(max_turns=1)), gpol, k=4, max_in_flight=32,
                              grade_fn=_fake_grade, stats=stats)
    finally:
        eng.shutdown()
    assert stats["max_in_flight_seen"] == 32 and stats["episodes"] == 32
    assert peak["max"] >= 32 and gate["waiting"] == 32
    assert [r["instance_id"] for r in rows] == [t.instance_id for t in tasks]
    for r in rows:
        assert [s["sample"] for s in r["samples"]] == [0, 1, 2, 3]
        for s in r["samples"]:
            assert s["stop_reason"] == "max_turns" and s["tool_calls"] == 1 and s["malformed_tool_calls"] == 0
            assert s["policy_tokens"] == s["tokens"] > 0 and not s["masked"] and s["reward"] == 0.0
    summ = summarize_agent(rows, ks=(1, 4))
    assert set(summ["by_split"]) == {"train", "eval"} and summ["overall"]["pass@1"] == 0.0
    del pol


def test_masked_samples_count_as_failures(repo_env):
    """A sandbox that cannot start and a masked grade: both masked (with a reason), both failures in
    pass@k, and the masked rate reported; a scripted policy resolves the good task."""
    from c2jax.agent.harness import Harness
    from c2jax.agent.policies import OraclePolicy
    from c2jax.bench.agent_eval import evaluate_agent, format_agent_table, summarize_agent
    from c2jax.bench.run import summarize

    fmt = chat_format()
    tasks = [make_task(repo_env[1], "good"), make_task("env-does-not-exist", "nostart", split="eval"),
             make_task(repo_env[1], "masked-grade", split="eval")]
    rows = evaluate_agent(tasks, Harness(fmt), OraclePolicy(fmt, FIX_PATCH), k=2, max_in_flight=6,
                          grade_fn=_fake_grade)
    by = {r["instance_id"]: r for r in rows}
    assert all(s["resolved"] and s["reward"] == 1.0 and not s["masked"] for s in by["good"]["samples"])
    for s in by["nostart"]["samples"]:
        assert s["masked"] and s["masked_reason"].startswith("infra:") and "sandbox start" in s["masked_reason"]
        assert s["stop_reason"] == "infra" and not s["resolved"]
    for s in by["masked-grade"]["samples"]:
        assert s["masked"] and s["masked_reason"] == "grade: infra:test" and not s["resolved"]
        assert s["diff"] and s["stop_reason"] == "finished"
    summ = summarize_agent(rows, ks=(1, 2))
    o = summ["overall"]
    assert o["pass@1"] == pytest.approx(1 / 3) and o["pass@2"] == pytest.approx(1 / 3)  # masked = failure
    assert o["masked_samples"] == 4 and o["masked_rate"] == pytest.approx(4 / 6) and o["all_masked_tasks"] == 2
    assert summ["by_split"]["eval"]["pass@1"] == 0.0 and summ["by_split"]["eval"]["masked_rate"] == 1.0
    assert summ["by_split"]["train"]["pass@1"] == 1.0
    assert summarize(rows, (1,))["overall"]["pass@1"] == 1.0  # the training view excludes them
    assert "masked 4/6 samples" in format_agent_table(summ, (1, 2))


def test_transcripts_hold_every_episode_messages(repo_env, tmp_path):
    """``transcripts=``: one line per finished episode with its messages (the system prompt, the task,
    the agent's tool calls and their outputs), matching the sample rows."""
    from c2jax.agent.harness import Harness
    from c2jax.agent.policies import OraclePolicy
    from c2jax.bench.agent_eval import evaluate_agent

    fmt = chat_format()
    path = tmp_path / "transcripts.jsonl"
    rows = evaluate_agent([make_task(repo_env[1], "good")], Harness(fmt), OraclePolicy(fmt, FIX_PATCH), k=2,
                          max_in_flight=2, grade_fn=_fake_grade, transcripts=str(path))
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert sorted(x["sample"] for x in lines) == [0, 1]
    by_sample = {s["sample"]: s for s in rows[0]["samples"]}
    for x in lines:
        assert x["instance_id"] == "good" and x["resolved"] == by_sample[x["sample"]]["resolved"]
        assert x["diff"] == by_sample[x["sample"]]["diff"] and x["diff"]
        msgs = x["messages"][0]  # one context
        roles = [m["role"] for m in msgs]
        assert roles[0] == "system" and "user" in roles and "tool" in roles
        assert any(m.get("tool_calls") for m in msgs if m["role"] == "assistant")


def test_policy_timeout_is_not_infrastructure():
    """A sandbox killed for its lifetime under the agent is the policy's failure; a dead sandbox is infra."""
    from c2jax.agent.harness import Episode
    from c2jax.bench.agent_eval import sample_row
    from c2jax.trajectory import Trajectory

    def ep(err):
        t = Trajectory(segments=[], task_id="t", group_id="t", infra_failed=True, sample_id="t#0",
                       metadata={"stop_reason": "infra"})
        return Episode(t, [], [{"type": "infra_error", "t": 0.0, "duration_s": 0.0, "error": err}], "infra")

    s = sample_row(ep("SandboxClosed: sandbox sb1 was killed (lifetime)"), 0)
    assert not s["masked"] and s["stop_reason"] == "sandbox_killed" and s["reward"] == 0.0
    s = sample_row(ep("SandboxError: sandbox sb1 died (bwrap exit 1)"), 0)
    assert s["masked"] and s["masked_reason"].startswith("infra:")


def test_greedy_engine_and_openai_server_agree(ckpt, repo_env, monkeypatch):
    """The same checkpoint in-process (EnginePolicy) and behind c2jax.serve (OpenAIPolicy), greedy, real
    grading: the same diffs, rewards, stops, tool calls and tokens per sample."""
    from c2jax.agent.harness import Harness
    from c2jax.agent.policies import EnginePolicy, OpenAIPolicy
    from c2jax.bench.agent_eval import evaluate_agent
    from c2jax.serve import ChatServer

    _, params, cfg = ckpt
    fmt = chat_format()
    for k in list(os.environ):
        if k.startswith("OPENAI_"):
            monkeypatch.delenv(k)
    tasks = [make_task(repo_env[1], "g0"), make_task(repo_env[1], "g1", split="eval")]
    eng = _engine(params, cfg)
    try:
        local = evaluate_agent(tasks, Harness(fmt, hcfg()), EnginePolicy(eng, fmt, temperature=0.0, seed=3), k=2,
                               max_in_flight=4)
    finally:
        eng.shutdown()
    srv = ChatServer(_engine(params, cfg), fmt, model_name="tiny").start("127.0.0.1", 0)
    try:
        pol = OpenAIPolicy(base_url=srv.url + "/v1", model="tiny", api_key="test", temperature=0.0, seed=3)
        remote = evaluate_agent(tasks, Harness(fmt, hcfg()), pol, k=2, max_in_flight=4)
    finally:
        srv.close()
    keys = ("resolved", "reward", "masked", "diff", "stop_reason", "turns", "tool_calls", "malformed_tool_calls",
            "policy_tokens", "flags", "trainable")
    pick = lambda rows: [[{x: s[x] for x in keys} for s in r["samples"]] for r in rows]  # noqa: E731
    assert pick(local) == pick(remote)
    s = local[0]["samples"][0]
    assert s["stop_reason"] == "max_turns" and s["tool_calls"] == 2 and not s["masked"] and s["grade_s"] > 0
    assert s["reward"] == 0.0 and s["diff"] == "" and s["trainable"]


def test_cli_run_twice_and_compare(ckpt, repo_env, tmp_path, capsys):
    """`bench run --policy engine` (greedy) twice -> results.json + tasks.jsonl; an oracle run; `bench
    compare` writes the paired diffs: engine vs engine 0 [0, 0], engine -> oracle +1 [1, 1]."""
    from c2jax.bench.__main__ import main

    d, _, _ = ckpt
    tasks = [make_task(repo_env[1], "c0"), make_task(repo_env[1], "c1", split="eval"),
             make_task(repo_env[1], "c2", category="swebench")]
    suite = tmp_path / "tasks.jsonl"
    suite.write_text("".join(json.dumps(t.to_json()) + "\n" for t in tasks))
    cfgf = tmp_path / "agent_cfg.py"
    cfgf.write_text("import ml_collections\nfrom c2jax.agent.config import agent_config_dict\n\n"
                    "def get_config(arg='x'):\n    c = ml_collections.ConfigDict()\n"
                    "    c.agent = agent_config_dict(system_prompt='You are a coding agent.', max_turns=int(arg or 2),\n"
                    "                                max_new_tokens=48, tools={'enabled': ['read_lints', 'run_terminal_cmd']})\n"
                    "    return c\n")
    outs = []
    for name in ("a", "b"):
        out = str(tmp_path / name)
        rc = main(["run", "--suite", str(suite), "--policy", "engine", "--checkpoint", d, "--k", "2", "--temperature",
                   "0", "--seed", "0", "--max-in-flight", "4", "--max-slots", "32", "--max-len", str(MAX_LEN), "--agent-config",
                   f"{cfgf}:1", "--no-materialize", "--out", out])
        assert rc == 0
        printed = capsys.readouterr().out
        m = re.search(r"engine: (\d+) decode steps, mean ([\d.]+) of 32 rows active; (\d+) prefill calls", printed)
        assert m and "wall: " in printed, printed
        # 6 episodes, at most 4 in flight: every prompt prefilled, never more than 4 of 32 rows decoding
        assert int(m.group(1)) >= 1 and 0 < float(m.group(2)) <= 4 and int(m.group(3)) >= 6
        outs.append(out)
        res = json.load(open(os.path.join(out, "results.json")))
        assert res["summary"]["overall"]["pass@1"] == 0.0 and res["summary"]["overall"]["masked_rate"] == 0.0
        assert set(res["summary"]["by_split"]) == {"train", "eval"} and "pass@2_ci95" in res["summary"]["overall"]
        assert [json.loads(x)["instance_id"] for x in open(os.path.join(out, "tasks.jsonl"))] == ["c0", "c1", "c2"]
        assert all(s["turns"] == 1 for r in res["tasks"] for s in r["samples"])  # max_turns from the config preset
    # resume: a rerun into the same directory reuses the journal
    rc = main(["run", "--suite", str(suite), "--policy", "engine", "--checkpoint", d, "--k", "2", "--temperature",
               "0", "--max-in-flight", "4", "--max-slots", "32", "--max-len", str(MAX_LEN), "--agent-config", f"{cfgf}:1",
               "--no-materialize", "--out", outs[0]])
    assert rc == 0 and json.load(open(os.path.join(outs[0], "results.json")))["summary"]["eval_stats"]["episodes"] == 0
    orc = str(tmp_path / "oracle")
    assert main(["run", "--suite", str(suite), "--policy", "oracle", "--k", "2", "--no-materialize", "--out", orc]) == 0
    capsys.readouterr()
    before_b = sorted(os.listdir(outs[1]))
    assert main(["compare", outs[0], outs[1], "--k", "1,2,8", "--out", str(tmp_path / "cmp01.json")]) == 0
    assert sorted(os.listdir(outs[1])) == before_b  # a run directory is never written into
    cmp = json.load(open(tmp_path / "cmp01.json"))
    assert cmp["diffs"]["pass@1"] == {**cmp["diffs"]["pass@1"], "mean": 0.0, "lo": 0.0, "hi": 0.0}
    assert cmp["skipped_ks"] == [8] and "pass@2" in cmp["diffs"]
    out_json = str(tmp_path / "cmp.json")
    assert main(["compare", outs[0], orc, "--k", "1,2", "--out", out_json]) == 0
    text = capsys.readouterr().out
    cmp = json.load(open(out_json))
    assert (cmp["diffs"]["pass@1"]["mean"], cmp["diffs"]["pass@1"]["lo"], cmp["diffs"]["pass@1"]["hi"]) == (1.0, 1.0, 1.0)
    assert "pass@1" in text and "+1.000" in text
    # mismatched task sets are an input error
    sub = tmp_path / "sub"
    sub.mkdir()
    res = json.load(open(os.path.join(orc, "results.json")))
    res["tasks"] = res["tasks"][:2]
    (sub / "results.json").write_text(json.dumps(res))
    assert main(["compare", outs[0], str(sub)]) == 2


def test_order_free_seeds(ckpt, repo_env):
    """Sampling (temperature 1) with a base seed: concurrent episodes submitted in two different orders
    and batch sizes give identical tokens per sample; samples differ from each other; seed_salt
    changes the draws reproducibly."""
    import jax

    from c2jax.agent.harness import Harness
    from c2jax.agent.policies import EnginePolicy, TurnRequest
    from c2jax.envs import start
    from c2jax.model import init

    _, _, cfg = ckpt
    fmt = chat_format()
    params = init(cfg, jax.random.key(5))  # a random model: varied samples
    eng = _engine(params, cfg)
    h = Harness(fmt, hcfg(max_turns=1, max_new=12))
    ids = [f"s{i}#{j}" for i in range(3) for j in range(2)]

    async def run(order, salt=None, limit=8):
        pol = EnginePolicy(eng, fmt, temperature=1.0, seed=11)
        pol.seed_salt = salt
        sem = asyncio.Semaphore(limit)

        async def one(sid):
            async with sem:
                sb = await asyncio.to_thread(start, repo_env[1])
                try:
                    ep = await h.arun(pol, sb, "Say something.", task_id=sid.split("#")[0], sample_id=sid, diff=False)
                finally:
                    await asyncio.to_thread(sb.close)
                return sid, ep.trajectory.segments[0].completion_ids.tolist()

        return dict(await asyncio.gather(*(one(s) for s in order)))

    try:
        a = asyncio.run(run(ids))
        b = asyncio.run(run(list(reversed(ids)), limit=2))
        c = asyncio.run(run(ids[::2] + ids[1::2], salt=1))
        c2 = asyncio.run(run(list(reversed(ids)), salt=1, limit=3))
    finally:
        eng.shutdown()
    assert a == b and c == c2
    assert len({tuple(v) for v in a.values()}) == len(ids)  # every sample its own draws
    assert sum(a[s] != c[s] for s in ids) >= len(ids) - 1  # the salt (e.g. RL step) changes them
    # the seed is a pure function of (seed, salt, sample id, turn, purpose)
    pol = EnginePolicy(eng, fmt, seed=11)
    r = TurnRequest([1, 2, 3], [], [], 4, turn=2, purpose="act", sample_id="x#0")
    assert pol.seed_for(r) == pol.seed_for(dataclasses.replace(r, prompt_ids=[9])) != pol.seed_for(
        dataclasses.replace(r, turn=3))
    assert pol.seed_for(r) != pol.seed_for(dataclasses.replace(r, purpose="summarize"))
    assert EnginePolicy(eng, fmt, seed=None).seed_for(r) is None


def test_merged_seeds_give_the_unbiased_pass_at_k_of_all_samples(tmp_path):
    """`RUN+RUN2` merges each task's samples of two runs (the same policy, two sampling seeds): the
    pass@k compared is the unbiased estimate over all of them (checked by brute force over the
    k-subsets), samples are renumbered, and runs of different tasks fail naming the run. Through the
    CLI, `bench compare A+A2 B+B2` reports pass@8 from 16 samples per task."""
    import json
    import subprocess
    import sys

    from c2jax.bench.agent_eval import load_rows, merge_sample_rows
    from c2jax.bench.metrics import pass_at_k, pass_at_k_bruteforce

    rng = random.Random(2)
    outs = {n: {f"t{i}": [rng.random() < 0.3 for _ in range(8)] for i in range(6)} for n in ("a", "a2", "b", "b2")}
    for name, o in outs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps({"tasks": _rows(o), "summary": {}}))
    rows, _ = load_rows(f"{tmp_path / 'a'}+{tmp_path / 'a2'}")
    for r in rows:
        got = [s["resolved"] for s in r["samples"]]
        assert got == outs["a"][r["instance_id"]] + outs["a2"][r["instance_id"]]
        assert [s["sample"] for s in r["samples"]] == list(range(16))
        assert pass_at_k(16, sum(got), 8) == pytest.approx(pass_at_k_bruteforce(got, 8))
    with pytest.raises(ValueError, match="other tasks"):
        merge_sample_rows([_rows(outs["a"]), _rows({"zz": [True]})], ["a", "zz-run"])
    r = subprocess.run([sys.executable, "-m", "c2jax.bench", "compare", f"{tmp_path / 'a'}+{tmp_path / 'a2'}",
                        f"{tmp_path / 'b'}+{tmp_path / 'b2'}", "--k", "1,8,16", "--out", str(tmp_path / "c.json")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    d = json.loads((tmp_path / "c.json").read_text())["diffs"]
    want = np.mean([pass_at_k(16, sum(outs["b"][t] + outs["b2"][t]), 8) - pass_at_k(16, sum(outs["a"][t] + outs["a2"][t]), 8)
                    for t in outs["a"]])
    assert set(d) == {"pass@1", "pass@8", "pass@16"} and d["pass@8"]["mean"] == pytest.approx(want)


def _episodes_begun_while_grading(repo_env, mode: str, wait_s: float) -> int:
    """4 episodes (2 tasks x k=2) with 2 places. Each grader holds until all 4 episodes have begun
    their first turn (or `wait_s` passes); returns how many had begun when the first grader went on.
    mode: 'eval' (evaluate_agent), 'rl' (the RL stage's acollect), 'one_place' (the positive
    control: one semaphore held through solving and grading, as before solve_gate / grade_gate) or
    'hold_flag' (evaluate_agent's hold_place_while_grading, the baseline `bench run` keeps)."""
    import threading

    from c2jax.agent.harness import Harness
    from c2jax.agent.policies import OraclePolicy
    from c2jax.agent.rollout import arollout
    from c2jax.bench.agent_eval import evaluate_agent
    from c2jax.train.rl_rollouts import collect

    fmt = chat_format()
    lock, begun, all_begun, seen = threading.Lock(), set(), threading.Event(), []

    class Counting(OraclePolicy):
        def generate(self, req):
            if req.turn == 0:
                with lock:
                    begun.add(req.sample_id)
                    if len(begun) == 4:
                        all_begun.set()
            return super().generate(req)

    def grade(task, diff):
        all_begun.wait(wait_s)
        with lock:
            seen.append(len(begun))
        return _fake_grade(task, diff)

    tasks = [make_task(repo_env[1], f"gate{i}") for i in range(2)]
    pol = Counting(fmt, FIX_PATCH)
    if mode == "eval":
        stats: dict = {}
        rows = evaluate_agent(tasks, Harness(fmt), pol, k=2, max_in_flight=2, grade_fn=grade, stats=stats)
        assert stats["max_in_flight_seen"] == 2 and stats["episodes"] == 4  # the solve bound still holds
        assert all(s["resolved"] and not s["masked"] for r in rows for s in r["samples"])
    elif mode == "rl":
        samples = collect(Harness(fmt), pol, tasks, group_size=2, max_in_flight=2, grade_fn=grade)
        assert [(s.task.instance_id, s.index) for s in samples] == [(t.instance_id, k) for t in tasks for k in range(2)]
        assert all(not s.mask_reason and s.trajectory.reward_terms["task"] == 1.0 for s in samples)
    elif mode == "hold_flag":  # the baseline schedule behind `bench run --hold-place-while-grading`
        evaluate_agent(tasks, Harness(fmt), pol, k=2, max_in_flight=2, grade_fn=grade, hold_place_while_grading=True)
    else:
        async def run():
            sem = asyncio.Semaphore(2)

            async def one(task, s):
                async with sem:
                    return await arollout(Harness(fmt), pol, task, sample=s, grade_fn=grade)
            return await asyncio.gather(*(one(t, s) for s in range(2) for t in tasks))
        asyncio.run(run())
    assert len(seen) == 4
    return seen[0]


@pytest.mark.parametrize("mode", ["eval", "rl"])
def test_a_grading_episode_frees_its_place_for_the_next(repo_env, mode):
    """An episode holds its place (the engine's batch) only while it solves: with 2 places, the 3rd
    and 4th episodes begin while the first two are being graded. Positive control: one place held
    through grading, the graders wait in vain (only 2 episodes begin until a grader gives up)."""
    assert _episodes_begun_while_grading(repo_env, mode, wait_s=60.0) == 4
    assert _episodes_begun_while_grading(repo_env, "one_place", wait_s=2.0) == 2
    if mode == "eval":
        assert _episodes_begun_while_grading(repo_env, "hold_flag", wait_s=2.0) == 2


def test_hidden_test_timeouts_are_tallied_by_how_they_were_settled():
    """The summary counts the grader's settled timeouts (retried and finished / the policy's / masked)
    from each sample's flags, and the table prints them only when there are any."""
    from c2jax.bench.agent_eval import format_agent_table, summarize_agent

    def sample(i, flags, resolved=False, masked=False):
        return {"sample": i, "resolved": resolved, "reward": float(resolved), "masked": masked,
                "masked_reason": "grade: " + ",".join(flags) if masked else "", "flags": flags, "tokens": 10,
                "policy_tokens": 5, "stop_reason": "finished", "turns": 2, "tool_calls": 1,
                "malformed_tool_calls": 0, "solve_s": 1.0, "grade_s": 1.0}

    samples = [sample(0, ["retried:timeout"], resolved=True), sample(1, ["timeout", "no_report"]),
               sample(2, ["timeout", "no_report", "infra:timeout"], masked=True), sample(3, [])]
    rows = [{"instance_id": "t0", "category": "c", "codebase": "c", "split": "eval", "samples": samples}]
    summ = summarize_agent(rows, ks=(1,))
    assert summ["overall"]["test_timeouts"] == {"retried": 1, "policy": 1, "masked": 1}
    assert "hidden-test timeouts 1 retried, 1 the policy's, 1 masked" in format_agent_table(summ, (1,))
    quiet = summarize_agent([dict(rows[0], samples=[sample(0, []), sample(1, ["unsafe_diff"])])], ks=(1,))
    assert quiet["overall"]["test_timeouts"] == {"retried": 0, "policy": 0, "masked": 0}
    assert "timeouts" not in format_agent_table(quiet, (1,))
