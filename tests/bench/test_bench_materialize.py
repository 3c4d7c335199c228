"""Task environments re-created from records: identical content-hashed ids, then gradeable.

Uses the session's c2bench-mini build (tests/_bench_common.py). Deleting environment layers here
is safe: the suite's tasks are re-created before the test returns (and checked to exist).
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil

from _bench_common import bench_state, mini_suite, needs_bwrap  # noqa: F401
from c2jax.bench.materialize import agent_base_patch, env_exists, materialize_envs, missing_envs
from c2jax.envs import images
from c2jax.envs.grading import grade

pytestmark = needs_bwrap


def _drop(env_id: str) -> None:
    shutil.rmtree(os.path.join(images.images_dir(), env_id))


def test_missing_layers_are_recreated_with_identical_ids_and_grade(mini_suite):
    _, tasks, _, _ = mini_suite
    assert not missing_envs(tasks)
    by_cb = {}
    for t in tasks:
        by_cb.setdefault(t.codebase, []).append(t)
    victim = by_cb["stdlib"][0]
    layers = images.load(victim.env_id).meta["layers"]  # runner venv, codebase, hidden paths, task
    assert layers[-1] == victim.env_id and len(layers) == 4
    _drop(victim.env_id)
    _drop(layers[2])  # the shared hidden-path layer: every stdlib task loses its environment
    _drop(by_cb["simplejson"][0].env_id)
    lost = missing_envs(tasks)
    assert {t.instance_id for t in lost} == ({t.instance_id for t in by_cb["stdlib"]}
                                            | {by_cb["simplejson"][0].instance_id})
    rep = materialize_envs(tasks)
    assert rep["failed"] == {}, rep["failed"]
    assert sorted(rep["recreated"]) == sorted({t.env_id for t in lost})
    assert rep["present"] == len(tasks) - len(lost)
    assert not missing_envs(tasks) and all(env_exists(t.env_id) for t in tasks)
    assert images.load(victim.env_id).meta["layers"] == layers
    # The re-created agent base is the broken state: gold resolves it, the empty diff does not.
    assert grade(victim, victim.patch).resolved
    g = grade(victim, "")
    assert not g.resolved and not g.masked


def test_agent_base_is_the_gold_patch_undone_without_hidden_tests(mini_suite):
    out, tasks, _, _ = mini_suite
    from c2jax.envs.synth.patches import apply_patch_host

    t = next(t for t in tasks if t.category == "feature_deletion")
    from c2jax.bench.materialize import _find_codebase

    cb = _find_codebase(t, os.path.join(out, "materialize-test"), None, ["c2bench-mini"])
    base = agent_base_patch(cb, t)
    for hidden in t.hidden_tests.files:
        assert f"diff --git a/{hidden} b/{hidden}\ndeleted file" in base
    pristine = {p: open(os.path.join(cb.root, p), encoding="utf-8").read()
                for p in sorted({*(t.hidden_tests.files), *_paths(t.patch)})}
    broken = apply_patch_host(pristine, base)
    assert apply_patch_host(broken, t.patch) == {**pristine, **{h: None for h in t.hidden_tests.files}}


def _paths(patch: str) -> set[str]:
    from c2jax.envs.grading import diff_paths

    return diff_paths(patch)[0]


def test_unreproducible_or_foreign_records_fail_with_reasons_and_touch_nothing(mini_suite):
    _, tasks, _, _ = mini_suite
    t = tasks[0]
    ghost = dataclasses.replace(t, instance_id="ghost.sha", env_id="drv-" + "0" * 32,
                                source=dataclasses.replace(t.source, sha256="f" * 64))
    foreign = dataclasses.replace(t, instance_id="ghost.kind", env_id="drv-" + "1" * 32,
                                  source=dataclasses.replace(t.source, kind="swebench"))
    other = dataclasses.replace(t, instance_id="ghost.cb", env_id="drv-" + "2" * 32, codebase="nosuchcodebase")
    rep = materialize_envs([*tasks, ghost, foreign, other])
    assert set(rep["failed"]) == {"ghost.sha", "ghost.kind", "ghost.cb"}
    assert "not the one the task was built from" in rep["failed"]["ghost.sha"]
    assert "convert" in rep["failed"]["ghost.kind"]
    assert "no suite prepares" in rep["failed"]["ghost.cb"]
    assert rep["recreated"] == [] and rep["present"] == len(tasks)
    assert not env_exists(ghost.env_id)


def test_envs_command_reports_and_exits_nonzero_on_failures(mini_suite, tmp_path, capsys):
    from c2jax.bench.__main__ import main

    out, tasks, _, _ = mini_suite
    assert main(["envs", "--suite", out]) == 0
    assert f"{len(tasks)} present, 0 re-created, 0 failed" in capsys.readouterr().out
    bad = tmp_path / "bad.jsonl"
    rec = json.loads(open(os.path.join(out, "tasks.jsonl")).readline())
    rec["env_id"], rec["source"]["sha256"] = "drv-" + "3" * 32, "e" * 64
    bad.write_text(json.dumps(rec) + "\n")
    assert main(["envs", "--suite", str(bad)]) == 1
    assert "FAILED" in capsys.readouterr().out
