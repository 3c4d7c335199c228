"""The terse prompt writer: agreement in number, no solution leak, the facts it must state."""
from __future__ import annotations

import random

from c2jax.envs.synth import prompt


def test_bug_prompts_agree_in_number_and_name_module_and_tests():
    for seed in range(20):
        one = prompt.bug_prompt(["src/pkg/core.py"], ["tests/test_core.py::test_parse[a-1]"], random.Random(seed))
        assert "`pkg.core`" in one and "`test_parse`" in one and "[a-1]" not in one
        assert " fail." not in one and " are red" not in one and "Tests `" not in one
        many = prompt.bug_prompt(["pkg/a.py", "pkg/b.py"], [f"t.py::test_{i}" for i in range(5)],
                                 random.Random(seed), multi=True)
        assert "(and 3 more)" in many and " fails" not in many and "`pkg.a` and `pkg.b`" in many


def test_deletion_prompts_agree_in_number_and_hint_from_docstring():
    single = [("src/pkg/io.py", "Reader.read_all", "Read every record.\n\nMore text.")]
    for seed in range(20):
        p = prompt.deletion_prompt(single, ["t.py::test_read"], random.Random(seed))
        assert "`Reader.read_all`" in p and "`read_all`: Read every record." in p and "More text" not in p
        assert "them" not in p and " are missing" not in p and "exercise it" not in p
    several = single + [("src/pkg/fmt.py", "dump", "")] * 4
    p = prompt.deletion_prompt(several, ["t.py::test_a", "t.py::test_b"], random.Random(0))
    assert "and 1 more" in p and ("they just raise" in p or "exercise them" in p)


def test_a_hint_that_would_leak_the_gold_patch_is_dropped():
    patch = "--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-    raise NotImplementedError\n+    return sum(values) / len(values)\n"
    fns = [("m.py", "mean", "return sum(values) / len(values)")]
    p = prompt.deletion_prompt(fns, ["t.py::test_mean"], random.Random(0), patch)
    assert not prompt.leaks(p, patch) and "sum(values)" not in p
    assert prompt.leaks("use return sum(values) / len(values) here", patch)
