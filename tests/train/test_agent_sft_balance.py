"""`agent_sft.balance="kind"`: every kind of fix as often as the most common one in the SFT data.

Checked on generated difficulty-0 toyfix tasks (the kinds are the tasks' own operator swaps): after
balancing each kind has exactly as many demonstrations as the most common kind had, the common kind's
are kept once each, every demonstration of a rare kind is used (cycled, none dropped), the result is
the same for the same seed; and a bad value of the option fails validation naming the allowed ones."""
from __future__ import annotations

import types
from collections import Counter

import pytest

from c2jax.envs.synth import toyfix
from c2jax.train.agent_sft import balance_by_kind, demo_kind


def _tasks(n: int) -> list:
    out, i = [], 0
    while len(out) < n:
        c = toyfix.make_candidate("demo", toyfix._seed(0, "demo", 0, i), 0)
        i += 1
        if c is not None:
            out.append(types.SimpleNamespace(instance_id=f"d{i}", subcategory="operator",
                                             provenance={"bugs": c.bugs, "repo": dict(c.broken)}))
    return out


def test_kinds_are_the_operator_swaps_and_balancing_equalises_them():
    tasks = _tasks(120)
    kind_of = {t.instance_id: demo_kind(t) for t in tasks}
    counts = Counter(kind_of.values())
    assert len(counts) >= 4 and all(" -> " in k or k.startswith("other:") for k in counts)
    # the generator's skew the option exists for: the common kind is several times the rarest
    assert max(counts.values()) >= 3 * min(counts.values())
    trajs = [types.SimpleNamespace(task_id=t.instance_id) for t in tasks]
    out, distinct = balance_by_kind(trajs, kind_of, seed=0)
    top = max(counts.values())
    assert distinct == dict(sorted(counts.items()))
    assert Counter(kind_of[t.task_id] for t in out) == {k: top for k in counts}
    for kind, n in counts.items():
        used = Counter(id(t) for t in out if kind_of[t.task_id] == kind)
        assert len(used) == n  # every demonstration of the kind used ...
        assert max(used.values()) - min(used.values()) <= 1  # ... and cycled evenly
    again, _ = balance_by_kind(trajs, kind_of, seed=0)
    assert [id(t) for t in again] == [id(t) for t in out]
    other, _ = balance_by_kind(trajs, kind_of, seed=1)
    assert [id(t) for t in other] != [id(t) for t in out]


def test_a_task_without_a_one_operator_fix_is_its_own_kind():
    t = types.SimpleNamespace(instance_id="x", subcategory="stub", provenance={})
    assert demo_kind(t) == "other:stub"


def test_bad_balance_fails_validation_naming_the_choices():
    from _rl_smoke_common import load_rl_quickstart
    from c2jax.config import ConfigError, validate

    cfg = load_rl_quickstart().get_config("smoke")
    validate(cfg, warn=False)
    assert cfg.agent_sft.balance == "none"  # written out in the config, the default
    cfg.agent_sft.balance = "by_kind"
    with pytest.raises(ConfigError) as e:
        validate(cfg, warn=False)
    assert "agent_sft.balance" in str(e.value) and "'kind'" in str(e.value)


def test_nth_style_makes_the_string_repeat_fix_a_kind_of_its_own():
    """With `shell_locate_nth` a fix of the operator's second occurrence (`s/+/*/2`) is its own kind;
    with the other styles it stays in its operator swap's kind (the measured balances unchanged)."""
    tasks = _tasks(200)
    plain = Counter(demo_kind(t) for t in tasks)
    nth = Counter(demo_kind(t, "shell_locate_nth") for t in tasks)
    repeats = [k for k in nth if k.endswith(" #2")]
    assert repeats == ["+ -> * #2"] and nth["+ -> * #2"] >= 3
    assert nth["+ -> *"] + nth["+ -> * #2"] == plain["+ -> *"]
    assert Counter(demo_kind(t, "shell_locate") for t in tasks) == plain
