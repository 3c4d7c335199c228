"""c2bench-mini end to end: build (2 codebases, <= 12 validated tasks), oracle 100%, null 0%, leak scan.

The suite is built once per session (tests/_bench_common.py) in a private environments state
directory; everything runs offline (standard-library modules + an installed package).
"""
from __future__ import annotations

import json
import os

import pytest

from _bench_common import bench_state, mini_suite, needs_bwrap  # noqa: F401
from c2jax.envs import start
from c2jax.envs.grading import diff_paths
from c2jax.envs.synth import leakage
from c2jax.envs.synth.patches import apply_patch_host
from c2jax.envs.tasks import load_tasks

pytestmark = needs_bwrap


def test_mini_build_is_validated_and_split_by_codebase(mini_suite):
    out, tasks, stats, report = mini_suite
    assert 8 <= len(tasks) <= 12, report
    assert not report["problems"], report["problems"]
    assert stats["n_codebases"] == 2 and set(stats["codebases"]) == {"stdlib", "simplejson"}
    assert {t.category for t in tasks} == {"bug_injection", "multi_bug", "feature_deletion"}
    assert load_tasks(os.path.join(out, "tasks.jsonl")) == tasks
    assert json.load(open(os.path.join(out, "stats.json"))) == stats
    splits = {t.codebase: t.split for t in tasks}
    assert splits == {"stdlib": "train", "simplejson": "eval"}
    assert len(load_tasks(os.path.join(out, "train.jsonl"))) + len(load_tasks(os.path.join(out, "eval.jsonl"))) == len(tasks)
    rep = json.load(open(os.path.join(out, "build_report.json")))
    for cb in ("stdlib", "simplejson"):
        assert rep["codebases"][cb]["accepted"] >= 4 and rep["codebases"][cb]["gold"]
    # Gold-state runs are cached beside the environments, keyed by the codebase environment's id.
    from c2jax.envs.state import state_dir

    gold = sorted(os.listdir(os.path.join(state_dir(), "gold")))
    assert any(g.startswith("gold-stdlib-") for g in gold) and any(g.startswith("gold-simplejson-") for g in gold)
    for t in tasks:
        v = t.provenance["validation"]
        assert v["gold_runs"] == 3 and v["gold_resolves"] and v["leak_scan"] == "clean"
        assert t.hidden_tests.FAIL_TO_PASS and v["f2p_fail_before"] == len(t.hidden_tests.FAIL_TO_PASS)
        assert t.stats["prompt_chars"] == len(t.problem_statement) < 600
        if t.category == "feature_deletion":
            assert t.stats["lines_changed"] >= 50 and t.stats["files_changed"] >= 2
        if t.category == "bug_injection":
            assert t.stats["lines_changed"] <= 4  # a single-site edit: only the mutated line(s)


def test_oracle_resolves_everything_and_null_nothing(mini_suite, tmp_path):
    from c2jax.bench.__main__ import main

    out, tasks, _, _ = mini_suite
    assert main(["run", "--suite", out, "--policy", "oracle", "--out", str(tmp_path / "oracle"),
                 "--predictions"]) == 0
    res = json.load(open(tmp_path / "oracle" / "results.json"))
    assert res["summary"]["overall"]["pass@1"] == 1.0 and res["summary"]["overall"]["masked_tasks"] == 0
    assert res["summary"]["overall"]["pass@1_ci95"] == [1.0, 1.0]
    assert os.path.getsize(tmp_path / "oracle" / "results.png") > 1000
    preds = [json.loads(x) for x in open(tmp_path / "oracle" / "predictions.jsonl")]
    assert [p["instance_id"] for p in preds] == [t.instance_id for t in tasks]
    assert all(p["model_patch"] == t.patch and p["model_name_or_path"] == "oracle" for p, t in zip(preds, tasks))
    assert main(["run", "--suite", out, "--policy", "null", "--out", str(tmp_path / "null")]) == 0
    res = json.load(open(tmp_path / "null" / "results.json"))
    assert res["summary"]["overall"]["pass@1"] == 0.0 and res["summary"]["overall"]["masked_tasks"] == 0
    for row in res["tasks"]:
        s = row["samples"][0]
        assert s["f2p_fraction"] == 0.0 and not s["masked"] and not s["flags"]
    assert "pass@1" in open(tmp_path / "null" / "results.txt").read()


def _pick(tasks, codebase, category):
    return next(t for t in tasks if t.codebase == codebase and t.category == category)


@pytest.mark.parametrize("codebase, category", [("stdlib", "feature_deletion"), ("simplejson", "bug_injection")])
def test_agent_sandbox_holds_no_pristine_copy_nor_hidden_test(mini_suite, codebase, category):
    """Hash every readable file in the agent's sandbox: no pristine changed file, no hidden test."""
    _, tasks, _, _ = mini_suite
    t = _pick(tasks, codebase, category)
    changed = sorted(diff_paths(t.patch)[0])
    with start(t.env_id, timeout_s=60) as sb:
        broken = {p: sb.read_file(p) for p in changed}
        for h in t.hidden_tests.files:
            assert sb.exec(["test", "-e", h]).exit_code != 0, f"hidden test {h} visible"
        if codebase == "stdlib":
            mod = changed[0][:-3]
            r = sb.exec(["python", "-c", f"import {mod}, sys; print({mod}.__file__); print(len(open("
                                         f"sys.base_prefix + '/lib/python3.11/{mod}.py').read()))"])
            assert r.stdout.split() == [f"/workspace/{mod}.py", "0"], r.stdout + r.stderr
        assert sb.exec("ls -a /workspace | grep -E '^(\\.git|__pycache__|\\.mypy_cache)$'").stdout == ""
    pristine = apply_patch_host(broken, t.patch)
    watch = {**{f"pristine:{p}": v for p, v in pristine.items()}, **{f"hidden:{p}": v for p, v in t.hidden_tests.files.items()}}
    assert leakage.scan(t.env_id, watch, changed + list(t.hidden_tests.files)) == []
    # the scanner itself does find pristine copies where they exist: the codebase's own files
    with start(t.env_id, timeout_s=60) as sb:
        other = next(p for p in sb.glob("**/*.py") if p not in changed and len(sb.read_file(p)) > 200)
        text = sb.read_file(other)
    hits = leakage.scan(t.env_id, {"probe": text}, [])
    assert (f"/workspace/{other}", "hash:probe") in hits
