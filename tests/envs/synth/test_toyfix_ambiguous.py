"""toyfix's imitation-gap variant (`ambiguous=q`): what the agent can see does not tell the two fixes
apart, the demonstrator's fixes follow q, the default family's draws are untouched, and bad settings
fail before any compute. (Generator checks on the host; the build and the demonstrations through the
real harness and sandboxes are in the last test.)"""
from __future__ import annotations

import hashlib
import json
import math
import re

import pytest

from _agent_common import needs_bwrap  # noqa: F401
from c2jax.envs.synth import toyfix as T

BROKEN_LINE = re.compile(r"    (\w+) = (\w+) \+ (\w+)")


def _ambiguous(stream: str, n: int, q: float = 0.75) -> list:
    out, i = [], 0
    while len(out) < n:
        c = T.make_candidate(stream, T._seed(0, stream, 0, i), 0, ambiguous=q)
        i += 1
        if c is not None:
            out.append(c)
    return out


def _fix_op(c) -> str:
    b = c.bugs[0]
    m_old, m_new = BROKEN_LINE.fullmatch(b["old"].split("\n")[-1]), re.fullmatch(r"    \w+ = \w+ ([*-]) \w+",
                                                                                  b["new"].split("\n")[-1])
    assert m_old and m_new, (b["old"], b["new"])
    return m_new.group(1)


def test_every_task_shows_the_same_broken_line_and_no_wanted_value():
    cands = _ambiguous("train", 60) + _ambiguous("eval", 30)
    assert {_fix_op(c) for c in cands} == {"*", "-"}
    for c in cands:
        (path, text), = [(p, t) for p, t in c.broken.items() if not p.endswith("__init__.py")]
        body = [ln for ln in text.splitlines() if ln.startswith("    ")]
        assert len(body) == 2 and BROKEN_LINE.fullmatch(body[0]) and body[1].startswith("    return "), text
        # the statement names the call, never the value the tests want (nor the broken one)
        b = c.bugs[0]
        assert c.statement.endswith("returns the wrong value. Fix the code.") and b["call"] in c.statement
        assert "should return" not in c.statement
        assert c.f2p and c.tests  # hidden tests decide between the two fixes
        # both fixes are real code: the other operator fails a hidden test the gold one passes
        ns_gold = {}
        exec(c.pristine[path], ns_gold)  # generated code only
        other = "-" if _fix_op(c) == "*" else "*"
        wrong = c.pristine[path].replace(f" {_fix_op(c)} ", f" {other} ", 1)
        ns_wrong = {}
        exec(wrong, ns_wrong)
        f = b["function"]
        cases = re.findall(rf"assert {f}\((\d+), (\d+)\) == (-?\d+)", c.tests[next(iter(c.tests))])
        assert cases and all(ns_gold[f](int(x), int(y)) == int(w) for x, y, w in cases)
        assert any(ns_wrong[f](int(x), int(y)) != int(w) for x, y, w in cases)


def test_the_likelier_fix_is_drawn_with_probability_q():
    for q in (0.75, 0.3):
        cands = _ambiguous("train", 400, q)
        share = sum(_fix_op(c) == "*" for c in cands) / len(cands)
        sd = math.sqrt(q * (1 - q) / len(cands))
        assert abs(share - q) < 4 * sd, (q, share)


def test_gold_diffs_are_distinct_enough_for_disjoint_splits():
    # the local variable comes from the split's ~600-word noun list, so train and eval never share a fix
    train, ev = _ambiguous("train", 200), _ambiguous("eval", 200)
    k_train = {T._gold_diff_key(c.pristine, c.broken) for c in train}
    k_eval = {T._gold_diff_key(c.pristine, c.broken) for c in ev}
    assert len(k_train) >= 190 and len(k_eval) >= 190 and not k_train & k_eval


def test_the_default_family_draws_are_unchanged():
    """ambiguous=0 (the default) must leave every draw as it was: the RL figures were measured on it.
    The pin is the digest of the first 40 seeds of each stream at difficulty 0 (generator v6)."""
    h = hashlib.sha256()
    for s in ("train", "eval", "demo"):
        for i in range(40):
            c = T.make_candidate(s, T._seed(0, s, 0, i), 0)
            h.update(json.dumps(None if c is None else [c.broken, c.tests, c.statement], sort_keys=True).encode())
    assert h.hexdigest()[:16] == "d376065f487ffad4"


@pytest.mark.parametrize("kw", [dict(difficulty=1, ambiguous=0.75), dict(difficulty=0, ambiguous=1.0),
                                dict(difficulty=0, ambiguous=0.75, docstrings=True)])
def test_bad_generator_arguments_raise(kw):
    with pytest.raises(ValueError, match="ambiguous"):
        T.make_candidate("train", 1, **kw)


def test_bad_rl_and_agent_sft_settings_fail_validation(tmp_path):
    from _rl_smoke_common import load_rl_quickstart
    from c2jax.config import ConfigError, validate

    m = load_rl_quickstart()
    cfg = m.get_config("smoke")
    assert cfg.rl.tasks.ambiguous == 0.0 and cfg.agent_sft.init_from == "previous"  # written out
    for key, value, said in (("ambiguous", 1.5, "strictly between 0 and 1"), ("ambiguous", True, "strictly"),
                             ("difficulty", 1, "needs tasks.difficulty=0")):
        bad = m.get_config("smoke")
        bad.rl.tasks.ambiguous = 0.75
        setattr(bad.rl.tasks, key, value)
        with pytest.raises(ConfigError) as e:
            validate(bad, warn=False)
        assert "rl.tasks.ambiguous" in str(e.value) and said in str(e.value), str(e.value)
    for value, said in (("scratch", "'previous', 'ckpt:DIR' or 'run:WORKDIR'"),
                        (f"run:{tmp_path}", "not a finished run's summary"),
                        (f"ckpt:{tmp_path / 'nope'}", "does not exist")):
        bad = m.get_config("smoke")
        bad.agent_sft.init_from = value
        with pytest.raises(ConfigError) as e:
            validate(bad, warn=False)
        assert "agent_sft.init_from" in str(e.value) and said in str(e.value), str(e.value)
    # a finished run's summary that names its cold start resolves to that run's checkpoint directory
    from c2jax.train.agent_sft import init_checkpoint_dir

    build = tmp_path / "build"
    (build / "agent_sft" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "summary.json").write_text(json.dumps({"agent_sft": {"build_dir": str(build)}}))
    assert init_checkpoint_dir(f"run:{tmp_path / 'run'}") == str(build / "agent_sft" / "checkpoints")
    for preset in ("imitation_gap", "imitation_gap_sft_matched"):
        c = m.get_config(preset)
        assert c.rl.tasks.ambiguous == 0.75 and c.agent_sft.balance == "none"
        assert c.agent_sft.init_from == "run:runs/rl"


@needs_bwrap
def test_build_validates_and_demonstrations_write_each_tasks_own_fix(tmp_path):
    """The built variant validates in sandboxes (gold passes, broken fails), the cold start's
    `shell_locate` demonstrations write each task's own fix, and the real grader resolves that fix and
    not the other one."""
    from c2jax.envs.grading import grade
    from c2jax.envs.synth.toyfix_shell_demos import applies, shell_demo_messages
    from c2jax.envs.tasks import load_tasks

    res = T.build_toyfix(str(tmp_path / "amb"), n_train=3, n_eval=3, n_demo=4, difficulty=0, seed=0,
                         ambiguous=0.75, workers=2, grader_checks=1)
    train, ev, demo = (load_tasks(res[k]) for k in ("train", "eval", "demo"))
    assert (len(train), len(ev), len(demo)) == (3, 3, 4)
    for t in demo[:3]:
        assert applies(t, "shell_locate")
        msgs = shell_demo_messages(t, "shell_locate")
        sed = [c for m in msgs for c in m.tool_calls if "sed -i" in c.arguments]
        assert len(sed) == 1
        new = t.provenance["bugs"][0]["new"].strip()
        op = "*" if " * " in new else "-"
        assert f"/+/{op}/" in json.loads(sed[0].arguments)["command"], sed[0].arguments
    # the demonstration's edit, applied with the real grader, resolves the task; the other fix does not
    t = demo[0]
    gold = grade(t, t.patch, check_gold=False)
    assert gold.resolved
    new = t.provenance["bugs"][0]["new"]
    op = "*" if " * " in new else "-"
    other = t.patch.replace("+" + new, "+" + new.replace(f" {op} ", " - " if op == "*" else " * "))
    assert other != t.patch
    assert not grade(t, other, check_gold=False).resolved
