"""Grading's reward terms on outcomes between "nothing" and "everything": partial fixes, fixes that
break a PASS_TO_PASS test, code that no longer imports — against the gold patch as the control.

One hand-written task, built the way c2jax.envs.synth builds them: the runner environment (venv
with pytest from the offline wheelhouse), one layer with the pristine codebase, one derived layer
with three injected bugs and the hidden test file removed (the agent's base). The hidden tests
come back only at grading. The task is built once per module and shared by every test.
"""
from __future__ import annotations

import hashlib
import os

import pytest

from _envs_common import needs_bwrap
from c2jax.envs import derive_env, images
from c2jax.envs.grading import grade, run_tests
from c2jax.envs.synth.build import BuildContext, runner_env
from c2jax.envs.synth.patches import make_patch
from c2jax.envs.tasks import DEFAULT_PROTECTED, HiddenTests, Source, TaskRecord, TestSpec

pytestmark = needs_bwrap

MODULE = "calc/ops.py"
TESTS = "tests/test_ops.py"

PRISTINE = '''"""Small numeric and text helpers."""


def add(a, b):
    """a + b."""
    return a + b


def clamp(x, lo, hi):
    """x limited to [lo, hi]."""
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def mean(xs):
    """Arithmetic mean of a non-empty sequence."""
    return sum(xs) / len(xs)


def word_count(text):
    """Number of whitespace-separated words."""
    return len(text.split())
'''

# (pristine line, broken line): the three bugs of the agent's base, each caught by one hidden test.
BUGS = {
    "clamp": ("    if x > hi:\n        return hi\n", "    if x > hi:\n        return lo\n"),
    "mean": ("    return sum(xs) / len(xs)\n", "    return sum(xs) / (len(xs) + 1)\n"),
    "word_count": ("    return len(text.split())\n", "    return len(text.split(' '))\n"),
}
# (pristine line, regressed line): changes breaking tests that pass on the agent's base.
REGRESSIONS = {
    "add": ("    return a + b\n", "    return abs(a) + abs(b)\n"),
    "clamp_low": ("        return lo\n    if x > hi", "        return x\n    if x > hi"),
}

HIDDEN_TESTS = '''from calc.ops import add, clamp, mean, word_count


def test_add():
    assert add(1, 2) == 3


def test_add_negative():
    assert add(-1, -2) == -3


def test_clamp_low():
    assert clamp(-5, 0, 10) == 0


def test_clamp_inside():
    assert clamp(4, 0, 10) == 4


def test_clamp_high():
    assert clamp(50, 0, 10) == 10


def test_mean():
    assert mean([1, 2, 3, 6]) == 3


def test_word_count_simple():
    assert word_count("one two three") == 3


def test_word_count_spaces():
    assert word_count("  one   two ") == 2
'''

F2P = tuple(f"{TESTS}::{n}" for n in ("test_clamp_high", "test_mean", "test_word_count_spaces"))
P2P = tuple(f"{TESTS}::{n}" for n in ("test_add", "test_add_negative", "test_clamp_low", "test_clamp_inside",
                                       "test_word_count_simple"))
FIXES_TEST = {"clamp": F2P[0], "mean": F2P[1], "word_count": F2P[2]}


def edit(text: str, changes: list[tuple[str, str]]) -> str:
    """`text` with each (old, new) replaced exactly once (fails loudly if a snippet is not unique)."""
    for old, new in changes:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


BROKEN = edit(PRISTINE, [(good, bad) for good, bad in BUGS.values()])


def agent_diff(new_module_text: str) -> str:
    """The agent's diff: its version of calc/ops.py against the broken base."""
    return make_patch({MODULE: BROKEN}, {MODULE: new_module_text})


def fixed(*bugs: str, regress: tuple[str, ...] = ()) -> str:
    """calc/ops.py with `bugs` fixed (the rest still broken) and `regress` regressions added."""
    text = edit(BROKEN, [(BUGS[b][1], BUGS[b][0]) for b in bugs])
    return edit(text, [REGRESSIONS[r] for r in regress])


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> TaskRecord:
    """The hand-written task (built once; environments go to the session's C2JAX_ENVS_DIR)."""
    assert os.environ.get("C2JAX_ENVS_DIR"), "tests/conftest.py sets the session-wide sandbox state dir"
    out = str(tmp_path_factory.mktemp("grading_partial"))  # the runner wheelhouse
    runner = runner_env(BuildContext(out_dir=out))  # shared with any other area's synth build

    def fill(layer: str) -> None:
        for rel, text in {"calc/__init__.py": "", MODULE: PRISTINE, TESTS: HIDDEN_TESTS,
                          "README.md": "calc: small helpers\n"}.items():
            os.makedirs(os.path.dirname(os.path.join(layer, rel)) or layer, exist_ok=True)
            with open(os.path.join(layer, rel), "w") as f:
                f.write(text)

    key = hashlib.sha256(f"{runner}\0{PRISTINE}\0{HIDDEN_TESTS}".encode()).hexdigest()[:32]
    pristine_env = images.new_layer_env(runner, fill, env_id="cb-" + key)
    agent_base = derive_env(pristine_env, make_patch({MODULE: PRISTINE, TESTS: HIDDEN_TESTS},
                                                     {MODULE: BROKEN, TESTS: None}))
    t = TaskRecord(
        instance_id="calc.multi_bug.partial", codebase="calc", env_id=agent_base, category="multi_bug",
        source=Source("installed", "calc", "0.0", "", "MIT"), subcategory="hand_written",
        problem_statement="clamp, mean and word_count give wrong answers.",
        test=TestSpec("pytest", ("python", "-m", "pytest", "-q", "-rN", "--tb=line", "-p", "no:cacheprovider",
                                 TESTS)),
        timeouts={"agent_s": 60.0, "verify_s": 60.0}, limits={"timeout_s": 60.0},
        hidden_tests=HiddenTests({TESTS: HIDDEN_TESTS}, F2P, P2P), patch=agent_diff(PRISTINE),
        protected_paths=DEFAULT_PROTECTED, provenance={}, stats={})
    # The task is what it says: on the agent's base (hidden tests added) exactly F2P fail, P2P pass.
    base = run_tests(t, "", canary=False)
    assert base.reported and not base.killed_reason, base.output_tail
    assert {i: base.outcomes.get(i) for i in F2P + P2P} == {**{i: "failed" for i in F2P},
                                                            **{i: "passed" for i in P2P}}, base.outcomes
    return t


@pytest.fixture(scope="module")
def gold(task):
    return grade(task, task.patch)


def test_gold_patch_resolves(task, gold):
    """Control: the gold patch earns the full reward, so the zeros below are the diffs' doing."""
    assert gold.resolved and gold.reward == 1.0 and not gold.masked and not gold.flags, gold
    assert gold.f2p_fraction == 1.0 and gold.p2p_regressions == 0
    assert all(gold.outcomes[i] == "passed" for i in F2P + P2P) and gold.outcomes["<canary>"] == "failed"
    assert task.patch == agent_diff(fixed("clamp", "mean", "word_count"))  # the fix the tests below build on


@pytest.mark.parametrize("bugs", [("mean",), ("clamp", "word_count")])
def test_partial_fix_earns_the_fraction_but_no_reward(task, gold, bugs):
    r = grade(task, agent_diff(fixed(*bugs)))
    assert not r.resolved and r.reward == 0.0 and not r.masked and not r.flags, r
    assert r.f2p_fraction == len(bugs) / len(F2P)  # exactly fixed / total
    assert r.p2p_regressions == 0
    assert {i for i in F2P if r.outcomes[i] == "passed"} == {FIXES_TEST[b] for b in bugs}
    assert all(r.outcomes[i] == "failed" for i in F2P if i not in {FIXES_TEST[b] for b in bugs})
    assert all(r.outcomes[i] == "passed" for i in P2P)


@pytest.mark.parametrize("regress, broken", [
    (("add",), {f"{TESTS}::test_add_negative"}),
    (("add", "clamp_low"), {f"{TESTS}::test_add_negative", f"{TESTS}::test_clamp_low"}),
])
def test_fix_that_breaks_pass_to_pass_earns_nothing(task, gold, regress, broken):
    r = grade(task, agent_diff(fixed("clamp", "mean", "word_count", regress=regress)))
    assert not r.resolved and r.reward == 0.0 and not r.masked and not r.flags, r
    assert r.f2p_fraction == 1.0  # every FAIL_TO_PASS test passes
    assert r.p2p_regressions == len(broken)
    assert {i for i in P2P if r.outcomes[i] != "passed"} == broken
    assert all(r.outcomes[i] == "failed" for i in broken)  # a real test failure, not missing/error


SYNTAX_ERROR = "\n\ndef broken(:\n    pass\n"


def test_diff_breaking_import_scores_zero_and_is_not_infrastructure(task, gold):
    r = grade(task, agent_diff(fixed("clamp", "mean", "word_count") + SYNTAX_ERROR))
    assert not r.resolved and r.reward == 0.0 and r.f2p_fraction == 0.0, r
    assert not r.masked and not any(f.startswith("infra") for f in r.flags), r.flags  # the agent's fault
    assert r.flags == ["collection_error"] and not r.tampered, r.flags  # a syntax error is not tampering
    assert r.p2p_regressions == len(P2P)
    assert all(r.outcomes[i] == "missing" for i in F2P + P2P)  # the test file never collected
    assert r.outcomes["<canary>"] == "missing"


def test_collection_error_the_gold_patch_reproduces_is_masked(task, gold):
    """The same failure under the gold patch is the environment's: masked, not scored (needs the
    gold check, which a tamper flag would have skipped)."""
    broken = task.replace(instance_id=task.instance_id + ".broken_gold", patch=agent_diff(BROKEN + SYNTAX_ERROR))
    r = grade(broken, agent_diff(fixed("clamp", "mean", "word_count") + SYNTAX_ERROR))
    assert r.masked and r.reward == 0.0 and not r.tampered, r
    assert "collection_error" in r.flags and "infra:gold_fails" in r.flags, r.flags


LOOP = ("    return sum(xs) / (len(xs) + 1)\n", "    while True:\n        pass\n")


def _slow_machine(monkeypatch, slow_calls: int | None):
    """run_tests as on a machine too loaded to run the tests inside their limit: the first `slow_calls`
    runs (None: every run) get a 0.01 s limit, so they really time out; later runs get their own."""
    from c2jax.envs import grading

    real, calls = grading.run_tests, []

    def run(task, diff="", **kw):
        calls.append(diff)
        if slow_calls is None or len(calls) <= slow_calls:
            kw["timeout_s"] = 0.01
        return real(task, diff, **kw)

    monkeypatch.setattr(grading, "run_tests", run)
    return calls


def test_a_timeout_under_load_is_not_scored_as_the_policy(task, gold, monkeypatch):
    """A correct fix whose first test run timed out (a loaded machine) is graded again and earns its
    reward; the positive control without the retry scores the same run 0, as grading did before."""
    diff = agent_diff(fixed("clamp", "mean", "word_count"))
    calls = _slow_machine(monkeypatch, slow_calls=1)
    r = grade(task, diff)
    assert r.resolved and r.reward == 1.0 and not r.masked and r.flags == ["retried:timeout"], r
    assert calls == [diff, diff]
    from c2jax.envs.grading import _gold_cache
    cached = _gold_cache[(task.instance_id, task.env_id)]  # the gold cache holds the run that finished
    assert not cached.killed_reason and "timeout" not in cached.flags
    calls = _slow_machine(monkeypatch, slow_calls=1)
    control = grade(task, diff, retry_timeouts=False, check_gold=False)
    assert not control.resolved and control.reward == 0.0 and "timeout" in control.flags and not control.masked


def test_a_machine_that_cannot_run_the_tests_in_time_is_masked(task, gold, monkeypatch):
    """Every run times out, the gold patch's too: the failure is the machine's (masked, infra:timeout)."""
    diff = agent_diff(fixed("clamp", "mean", "word_count"))
    calls = _slow_machine(monkeypatch, slow_calls=None)
    r = grade(task, diff)
    assert r.masked and r.reward == 0.0 and "infra:timeout" in r.flags, r
    assert calls == [diff, diff, task.patch]  # the diff twice, then the gold patch fresh (not the cache)


def test_a_timeout_the_diff_causes_is_the_policys(task, gold):
    """A diff whose code never returns times out on every run while the gold patch runs in time: it
    scores 0 with the timeout flag and is not masked (a timeout caused by the policy is never infra)."""
    r = grade(task, agent_diff(edit(fixed("clamp", "word_count"), [LOOP])), timeout_s=12.0)
    assert not r.masked and r.reward == 0.0 and not r.resolved and "timeout" in r.flags, (r.flags, r.detail)
    assert "retried:timeout" not in r.flags and "infra:timeout" not in r.flags
