"""toyfix task family: generator (symptom-only statements, difficulty knob, disjoint vocabularies),
build (validated by the real grader, cached, done marker), leakage checks, CLI registration, and
scripted demonstrations that solve tasks through the real harness in real sandboxes."""
from __future__ import annotations

import json
import os
import re
import shutil
import time
import types

import pytest

from _agent_common import chat_format, needs_bwrap  # noqa: F401
from c2jax.envs.synth import toyfix as T


def _cands(difficulty: int, stream: str = "train", n: int = 12, repro: bool = False) -> list:
    out, i = [], 0
    while len(out) < n:
        c = T.make_candidate(stream, T._seed(0, stream, difficulty, i), difficulty, repro=repro)
        i += 1
        if c is not None:
            out.append(c)
    return out


# ---- generator (host only) ----------------------------------------------------------------------

def test_vocabularies_are_disjoint():
    assert T.vocab_overlap() == {}
    assert set(T.VOCAB["train"]) == set(T.VOCAB["eval"])


@pytest.mark.parametrize("difficulty", [0, 1, 2, 3])
def test_statement_states_symptom_only_and_names_the_module(difficulty):
    for c in _cands(difficulty):
        changed = [p for p in c.broken if c.broken[p] != c.pristine[p]]
        for b in c.bugs:
            # the module to read follows from the import in the statement
            m = re.search(rf"`from ({c.package}\.\w+) import (\w+); ", c.statement)
            assert m and f"{b['import']}; {b['call']}" in c.statement
            assert b["path"] == b["import"].split()[1].replace(".", "/") + ".py" and b["path"] in changed
            assert b["want"] in c.statement
            # the file is named after a backtick, so byte-level BPE tokenises its words as in a tool
            # argument ("Ġpkg" after "from " would be a different token than "pkg" in '"pkg/mod.py"')
            assert f"In `{b['path']}`, `{b['import']}; " in c.statement
            # neither the buggy line nor the fix is in the statement (besides the symptom's values)
            code = re.sub(r"(it should return|returns) [^;]*[;.]", "", c.statement)
            for line in (b["old"] + "\n" + b["new"]).splitlines():
                if line.strip() not in ("", "raise NotImplementedError"):
                    assert line.strip() not in code, (line, c.statement)
        assert len(c.statement) < 400
        for p, text in c.pristine.items():
            assert len(text.splitlines()) <= 26, (p, text)
        assert not any("test" in p for p in c.broken)  # hidden tests are never in the repository


def test_difficulty_knob_changes_the_tasks():
    d0, d1, d2, d3 = (_cands(d) for d in (0, 1, 2, 3))
    from c2jax.envs.synth.toyfix_shell_demos import applies

    for c in d0:  # one module with ONE function; an operator or comparison swapped (no name, no constant)
        assert len(c.broken) == 2 and len(c.bugs) == 1 and len(c.f2p) == 1 and not c.p2p
        assert c.bugs[0]["kind"] in ("operator", "comparison")
        assert sum(ln.startswith("def ") for ln in c.broken[c.bugs[0]["path"]].splitlines()) == 1
    as_task = [types.SimpleNamespace(provenance={"bugs": c.bugs, "repo": dict(c.broken)}) for c in d0]
    assert sum(map(applies, as_task)) >= len(d0) - 1  # shell demos edit by line number
    for c in d1:  # one module, one one-token bug: exactly one line differs
        assert len(c.broken) == 2 and len(c.bugs) == 1 and len(c.f2p) == 1
        (p,) = [p for p in c.broken if c.broken[p] != c.pristine[p]]
        diff = [(a, b) for a, b in zip(c.broken[p].splitlines(), c.pristine[p].splitlines()) if a != b]
        assert len(diff) == 1 and c.bugs[0]["kind"] in ("operator", "comparison", "off_by_one", "wrong_variable")
    for c in d2:  # a distractor module, two bugs in the target module
        assert len(c.broken) == 3 and len(c.bugs) == 2 and len(c.f2p) == 2
        assert len({p for p in c.broken if c.broken[p] != c.pristine[p]}) == 1
    for c in d3:  # three modules: a stub (NotImplementedError + docstring) and a bug in another file
        assert len(c.broken) == 4 and [b["kind"] == "stub" for b in c.bugs] == [True, False]
        assert "raises NotImplementedError" in c.statement
        assert len({p for p in c.broken if c.broken[p] != c.pristine[p]}) == 2
        stub = c.broken[c.bugs[0]["path"]]
        assert '"""' in stub and "raise NotImplementedError" in stub


def test_train_and_eval_candidates_share_no_identifier():
    ident = re.compile(r"[A-Za-z_]\w*")

    def names(cs):
        return {w for c in cs for t in c.pristine.values() for w in ident.findall(re.sub(r"'[^']*'", "", t))}

    tr, ev = _cands(1, "train", 30), _cands(1, "eval", 30)
    common = names(tr) & names(ev)
    # only keywords / builtins of the templates are shared
    assert common <= {"def", "return", "for", "in", "if", "range", "len", "append"}, common


# ---- a built suite ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("toyfix"))
    t0 = time.monotonic()
    res = T.build_toyfix(out, n_train=6, n_eval=5, n_demo=4, difficulty=1, seed=0, workers=2, grader_checks=1)
    return out, res, time.monotonic() - t0


@needs_bwrap
def test_build_writes_split_files_and_validates(suite):
    from c2jax.envs.tasks import load_tasks

    out, res, _ = suite
    assert not res["cached"] and (res["n_train"], res["n_eval"], res["n_demo"]) == (6, 5, 4)
    train, ev, demo = (load_tasks(res[k]) for k in ("train", "eval", "demo"))
    assert load_tasks(res["tasks"]) == train + ev
    assert {t.split for t in train} == {"train"} and {t.split for t in ev} == {"eval"}
    assert {t.split for t in demo} == {"train"}
    assert not {t.instance_id for t in demo} & {t.instance_id for t in train}
    for t in train + ev + demo:
        assert t.hidden_tests.FAIL_TO_PASS and t.hidden_tests.PASS_TO_PASS
        assert all(p.startswith("tests/") for p in t.hidden_tests.files)
        assert t.stats["lines_changed"] == 2 and t.stats["files_changed"] == 1
        assert t.provenance["validation"]["gold_passes"]
    stats = json.load(open(res["stats"]))
    assert stats["by_group"]["split:train"]["tasks"] == 6 and stats["by_group"]["split:eval"]["tasks"] == 5
    assert json.load(open(os.path.join(out, "done.json")))["counts"] == {"n_train": 6, "n_eval": 5, "n_demo": 4}


@needs_bwrap
def test_grader_resolves_gold_and_scores_broken_zero(suite):
    from c2jax.envs import start
    from c2jax.envs.grading import grade
    from c2jax.envs.tasks import load_tasks

    _, res, _ = suite
    tasks = load_tasks(res["train"])[:2] + load_tasks(res["eval"])[:2]
    for t in tasks:
        g = grade(t, t.patch)
        assert g.resolved and g.reward == 1.0 and not g.masked, (g.flags, g.detail)
        n = grade(t, "")
        assert not n.resolved and n.reward == 0.0 and n.f2p_fraction == 0.0 and n.p2p_regressions == 0
        assert not n.masked and not n.flags
    with start(tasks[0].env_id, timeout_s=60) as sb:  # the agent's sandbox: broken code, no hidden test
        for h in tasks[0].hidden_tests.files:
            assert sb.exec(["test", "-e", h]).exit_code != 0
        assert sb.read_file(tasks[0].provenance["bugs"][0]["path"]) == \
            tasks[0].provenance["repo"][tasks[0].provenance["bugs"][0]["path"]]


@needs_bwrap
def test_leakage_checks(suite):
    from c2jax.envs.tasks import load_tasks

    _, res, _ = suite
    train, ev, demo = (load_tasks(res[k]) for k in ("train", "eval", "demo"))
    leak = json.load(open(res["leakage"]))
    assert leak["ok"] and not leak["eval_diffs_in_train"] and leak["replay"]["resolved"] == 0
    norm_train = {T._norm_diff(t.patch) for t in train + demo}
    assert all(T._norm_diff(t.patch) not in norm_train for t in ev)
    # the most common train gold patch replayed on held-out tasks through the real grader scores 0
    rep = T.leakage_report(train, ev, demo, replay=3)
    assert rep["ok"] and rep["replay"]["graded"] == 3 and rep["replay"]["mean_reward"] == 0.0
    # the check does catch a held-out diff that leaked into the training distribution
    bad = T.leakage_report(train + [ev[0]], ev, demo, replay=0)
    assert not bad["ok"] and bad["eval_diffs_in_train"] == [ev[0].instance_id]


@needs_bwrap
def test_build_is_cached_and_a_missing_done_marker_rebuilds(suite, tmp_path):
    out, res, first_s = suite
    t0 = time.monotonic()
    again = T.build_toyfix(out, n_train=6, n_eval=5, n_demo=4, difficulty=1, seed=0, grader_checks=1)
    assert again["cached"] and time.monotonic() - t0 < max(1.0, first_s / 2)
    assert {k: again[k] for k in ("train", "eval", "demo")} == {k: res[k] for k in ("train", "eval", "demo")}
    before = open(res["train"]).read()
    os.remove(os.path.join(out, "done.json"))  # as a build killed before its end leaves it
    rebuilt = T.build_toyfix(out, n_train=6, n_eval=5, n_demo=4, difficulty=1, seed=0, grader_checks=1)
    assert not rebuilt["cached"] and open(res["train"]).read() == before  # deterministic
    other = T.build_toyfix(str(tmp_path), n_train=6, n_eval=5, n_demo=4, difficulty=1, seed=1, grader_checks=0)
    assert not other["cached"] and open(other["train"]).read() != before  # another seed: other tasks
    assert T.build_toyfix(out, n_train=6, n_eval=5, n_demo=4, difficulty=1, seed=0, grader_checks=0)["cached"] is False


@needs_bwrap
def test_environments_are_recreated_from_records(suite):
    from c2jax.envs.images import env_exists
    from c2jax.envs import images
    from c2jax.envs.tasks import load_tasks

    _, res, _ = suite
    t = load_tasks(res["eval"])[0]
    shutil.rmtree(os.path.join(images.images_dir(), t.env_id))
    assert not env_exists(t.env_id)
    rep = T.materialize_envs([t])
    assert rep == {"recreated": [t.env_id], "failed": {}} and env_exists(t.env_id)


@needs_bwrap
def test_bench_cli_runs_the_suite_per_split(suite, tmp_path):
    from c2jax.bench.__main__ import main
    from c2jax.bench.suites import GENERATED_SUITES

    out, _, _ = suite
    assert "toyfix" in GENERATED_SUITES
    assert main(["run", "--suite", out, "--policy", "null", "--out", str(tmp_path / "null")]) == 0
    res = json.load(open(tmp_path / "null" / "results.json"))
    assert res["summary"]["by_split"]["eval"]["pass@1"] == 0.0 and res["summary"]["by_split"]["eval"]["tasks"] == 5
    assert res["summary"]["by_split"]["train"]["tasks"] == 6 and res["summary"]["overall"]["masked_tasks"] == 0


# ---- scripted demonstrations through the real harness -------------------------------------------

SHORT_SYSTEM = ("You fix bugs in a Python repository at /workspace. Read the module, edit the buggy line, "
                "run the example, then reply briefly.")


def _episode(task):
    from c2jax.agent.harness import Harness, HarnessConfig
    from c2jax.agent.policies import ScriptedPolicy
    from c2jax.agent.tools import ToolConfig
    from c2jax.envs import start

    fmt = chat_format()
    h = Harness(fmt, HarnessConfig(system_prompt=SHORT_SYSTEM, tools=ToolConfig(enabled=T.TOYFIX_TOOLS),
                                   max_turns=8))
    with start(task.env_id, task.limits) as sb:
        return h.run(ScriptedPolicy(fmt, T.demo_messages(task)), sb, task.problem_statement,
                     task_id=task.instance_id)


def test_demo_messages_use_enabled_tools_only():
    from c2jax.agent.tools import TOOL_NAMES

    assert set(T.TOYFIX_TOOLS) <= set(TOOL_NAMES)


@needs_bwrap
def test_demos_solve_tasks_through_the_harness(suite, tmp_path):
    from c2jax.envs.grading import grade
    from c2jax.envs.tasks import load_tasks

    _, res, _ = suite
    d3 = T.build_toyfix(str(tmp_path / "d3"), n_train=1, n_eval=1, n_demo=1, difficulty=3, grader_checks=0)
    tasks = load_tasks(res["demo"])[:2] + load_tasks(res["eval"])[:1] + load_tasks(d3["demo"])
    for t in tasks:
        msgs = T.demo_messages(t)
        assert [c.name for c in msgs[0].tool_calls] == ["read_file"] * len({b["path"] for b in t.provenance["bugs"]})
        ep = _episode(t)
        assert ep.stop_reason == "finished", ep.events[-3:]
        evs = ep.trajectory.tool_events
        assert len(evs) >= 2 and all(e.ok and not e.malformed for e in evs), [(e.name, e.ok) for e in evs]
        assert {e.name for e in evs} <= set(T.TOYFIX_TOOLS)
        run_out = [m for m in ep.messages[0] if m["role"] == "tool"][-1]["content"]
        for b in t.provenance["bugs"]:
            assert b["want"] in run_out  # the reproducer prints the expected value after the fix
        g = grade(t, ep.diff)
        assert g.resolved and g.reward == 1.0, (g.flags, g.detail, ep.diff)
        seg = ep.trajectory.segments[0]
        total = len(seg.prompt_ids) + len(seg.completion_ids)
        assert total < (1500 if t.provenance["difficulty"] == 1 else 2600), total


def test_in_process_dedup_key_equals_the_git_made_key():
    """`generate` dedups on `_gold_diff_key` (difflib, in-process); it must equal the key the leakage
    report computes from the real `git diff` patch, at every difficulty."""
    from c2jax.envs.synth.patches import make_patch
    from c2jax.envs.synth.toyfix import _gold_diff_key, _norm_diff

    checked = 0
    for d in (0, 1, 2, 3):
        for c in _cands(d)[:12]:
            changed = [p for p in c.broken if c.broken[p] != c.pristine[p]]
            git_key = _norm_diff(make_patch({p: c.broken[p] for p in changed}, {p: c.pristine[p] for p in changed}))
            assert _gold_diff_key(c.pristine, c.broken) == git_key and git_key
            checked += 1
    assert checked >= 40


def test_demo_stream_may_repeat_a_fix_but_never_shares_one_with_train_or_eval():
    taken: dict = {}
    ev, _ = T.generate("eval", 30, 0, 0, taken)
    tr, _ = T.generate("train", 60, 0, 0, taken)
    de, _ = T.generate("demo", 900, 0, 0, taken)
    key = lambda c: T._gold_diff_key(c.pristine, c.broken)  # noqa: E731
    ev_k, tr_k, de_k = [key(c) for c in ev], [key(c) for c in tr], [key(c) for c in de]
    assert len(set(ev_k)) == len(ev_k) and len(set(tr_k)) == len(tr_k)  # distinct within train / eval
    assert not set(de_k) & (set(ev_k) | set(tr_k))
    assert len(de) == 900 and len(set(de_k)) < len(de_k)  # at difficulty 0 the demo fixes repeat...
    assert len({T._cand_id(c) for c in de}) == len(de)  # ...in distinct programs


# ---- the visible reproduction script and the shell_retry demonstrations (generator v6) ------------

def test_repro_script_tells_broken_from_gold_on_the_host():
    """repro.py is in both states (so in no patch), holds the statement's call and wanted value only,
    and prints `ok` on the gold modules and `got X, want Y` on the broken ones."""
    from c2jax.envs.synth.toyfix_programs import REPRO_OK, REPRO_PATH, run_repro

    for d in (0, 1, 2):
        plain = _cands(d, n=6)
        for c, p in zip(_cands(d, n=6, repro=True), plain):  # the same tasks, plus repro.py
            assert {k: v for k, v in c.broken.items() if k != REPRO_PATH} == p.broken and REPRO_PATH not in p.broken
            assert (c.tests, c.statement, c.bugs) == (p.tests, p.statement, p.bugs)
            text = c.broken[REPRO_PATH]
            assert c.pristine[REPRO_PATH] == text
            for b in c.bugs:
                assert b["call"] in text and repr(b["want"]) in text and b["want"] in c.statement
            mods = lambda files: {p[:-3].replace("/", "."): s for p, s in files.items() if "/" in p}  # noqa: E731
            assert run_repro(text, mods(c.pristine)) == REPRO_OK
            bad = run_repro(text, mods(c.broken))
            assert bad.startswith("got ") and bad.endswith(", want " + c.bugs[0]["want"]) or \
                any(bad == f"got {b['got']}, want {b['want']}" for b in c.bugs), bad


@pytest.fixture(scope="module")
def suite_d0(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("toyfix_d0"))
    return T.build_toyfix(out, n_train=2, n_eval=2, n_demo=10, difficulty=0, seed=0, workers=2, grader_checks=1,
                          repro=True)


def _retry_episode(task, prior, max_turns: int = 8, style: str = "shell_retry"):
    from c2jax.agent.harness import Harness, HarnessConfig
    from c2jax.agent.policies import ScriptedPolicy
    from c2jax.agent.tools import ToolConfig
    from c2jax.envs import start
    from c2jax.envs.synth.toyfix_shell_demos import shell_demo_messages

    fmt = chat_format()
    h = Harness(fmt, HarnessConfig(system_prompt=SHORT_SYSTEM, tools=ToolConfig(enabled=("run_terminal_cmd",)),
                                   max_turns=max_turns))
    with start(task.env_id, task.limits) as sb:
        return h.run(ScriptedPolicy(fmt, shell_demo_messages(task, style=style, prior=prior)), sb,
                     task.problem_statement, task_id=task.instance_id)


@needs_bwrap
@pytest.mark.parametrize("style", ["shell_retry", "shell_retry_addr"])
def test_shell_retry_demos_check_undo_and_fix_in_real_sandboxes(suite_d0, style):
    """Through the real harness and sandbox: a search demonstration whose first edit is wrong sees
    repro.py fail, restores the workspace and goes on to the fix (the final diff holds the fix only);
    one whose first edit is the fix sees `ok` at once; both resolve with the real grader. The positive
    control: the wrong edit alone, without the restore, leaves a diff the grader does not resolve."""
    from c2jax.envs.grading import grade
    from c2jax.envs.synth.toyfix_programs import REPRO_PATH
    from c2jax.envs.synth.toyfix_shell_demos import RESTORE, applies, search_attempts
    from c2jax.envs.tasks import load_tasks

    tasks = [t for t in load_tasks(suite_d0["demo"]) if applies(t, "shell_retry")]
    assert all(REPRO_PATH in t.provenance["repo"] for t in tasks)
    # a prior that ranks the fix of the first task last, so its search starts with a wrong edit
    from collections import Counter

    from c2jax.envs.synth.toyfix_shell_demos import candidate_edits, gold_change

    t0 = next(t for t in tasks if len(candidate_edits(t)) >= 2)
    prior = Counter({e.change: 2 for e in candidate_edits(t0)})
    prior[gold_change(t0)] = 1
    assert len(search_attempts(t0, prior)) >= 2
    t1 = tasks[1] if tasks[1] is not t0 else tasks[2]
    prior1 = Counter({gold_change(t1): 1})
    for t, p, retried in ((t0, prior, True), (t1, prior1, False)):
        ep = _retry_episode(t, p, style=style)
        assert ep.stop_reason == "finished", ep.events[-3:]
        outs = [m["content"] for m in ep.messages[0] if m["role"] == "tool"]
        checks = [o for o in outs if o.startswith(("ok", "got "))]
        assert checks[-1].startswith("ok\n"), outs
        assert all(c.startswith("got ") for c in checks[:-1]) and (len(checks) > 1) == retried, outs
        assert (RESTORE in json.dumps(ep.messages[0])) == retried
        g = grade(t, ep.diff)
        assert g.resolved and g.reward == 1.0, (g.flags, g.detail, ep.diff)
        assert ep.diff.count("+++ ") == 1 and REPRO_PATH not in ep.diff
        if retried:  # positive control: stop after the wrong attempt (explore, grep, sed + check)
            short = _retry_episode(t, p, max_turns=3, style=style)
            assert short.diff and not grade(t, short.diff).resolved
