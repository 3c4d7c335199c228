"""Task records, mutations, feature deletion and prompts: pure host-side checks (no sandbox)."""
from __future__ import annotations

import ast
import copy
import json
import random
import subprocess
import sys

import pytest

from c2jax.envs.grading import diff_paths, is_protected
from c2jax.envs.synth import mutate, prompt
from c2jax.envs.synth.patches import apply_patch_host, make_patch
from c2jax.envs.tasks import (DEFAULT_PROTECTED, TaskFormatError, load_tasks, patch_stats, record_from_json,
                              write_tasks)

SRC = '''"""A module."""


def clamp(x, lo, hi):
    """Clamp x into [lo, hi]."""
    if x < lo:
        return lo
    if x > hi:   # keep this comment
        return hi
    return x


class Box:
    def __init__(self, items):
        self.items = list(items)

    def head(self, n=1):
        """First n items."""
        out = self.items[:n]
        total = 0
        for i in range(len(out)):
            total = total + out[i] * 2
        total = pow(total, 1)
        return out, total and True
'''


def _record() -> dict:
    patch = make_patch({"m.py": "x = 1\n"}, {"m.py": "x = 2\n"})
    return {
        "instance_id": "demo.bug.1", "schema_version": 1,
        "source": {"kind": "stdlib", "package": "stdlib", "version": "3.11.7", "sha256": "0" * 64,
                   "license": "PSF-2.0", "url": ""},
        "codebase": "stdlib", "env_id": "env-x", "category": "bug_injection", "subcategory": "constant",
        "problem_statement": "x is wrong.",
        "test": {"runner": "pytest", "cmd": ["python", "-m", "pytest", "tests/test_m.py"], "workdir": "/workspace",
                 "env": {}},
        "timeouts": {"agent_s": 60, "verify_s": 30}, "limits": {"timeout_s": 30},
        "hidden_tests": {"files": {"tests/test_m.py": "def test_x():\n    pass\n"},
                         "FAIL_TO_PASS": ["tests/test_m.py::test_x"], "PASS_TO_PASS": []},
        "patch": patch, "protected_paths": list(DEFAULT_PROTECTED), "provenance": {"seed": 1},
        "stats": {"lines_changed": 2, "files_changed": 1, "prompt_chars": 11}, "split": "train"}


def test_record_round_trip(tmp_path):
    rec = record_from_json(_record())
    path = str(tmp_path / "t.jsonl")
    assert write_tasks(path, [rec, rec.replace(instance_id="demo.bug.2")]) == 2
    back = load_tasks(path)
    assert back[0] == rec and back[1].instance_id == "demo.bug.2"
    assert back[0].hidden_tests.FAIL_TO_PASS == ("tests/test_m.py::test_x",)


@pytest.mark.parametrize("mutate_fn, field", [
    (lambda r: r.pop("env_id"), "env_id"),
    (lambda r: r.__setitem__("category", "refactor"), "category"),
    (lambda r: r["source"].__setitem__("sha256", "xyz"), "source.sha256"),
    (lambda r: r["test"].__setitem__("cmd", []), "test.cmd"),
    (lambda r: r["timeouts"].__setitem__("verify_s", -1), "timeouts.verify_s"),
    (lambda r: r["limits"].__setitem__("memory_bytes", 5), "limits"),
    (lambda r: r["hidden_tests"].__setitem__("FAIL_TO_PASS", []), "hidden_tests.FAIL_TO_PASS"),
    (lambda r: r["hidden_tests"]["files"].__setitem__("../x.py", ""), "hidden_tests.files"),
    (lambda r: r["hidden_tests"].__setitem__("PASS_TO_PASS", ["tests/test_m.py::test_x"]), "hidden_tests.PASS_TO_PASS"),
    (lambda r: r.__setitem__("schema_version", 9), "schema_version"),
    (lambda r: r.__setitem__("surprise", 1), "surprise"),
    (lambda r: r.__setitem__("split", "dev"), "split"),
])
def test_malformed_record_names_file_line_and_field(tmp_path, mutate_fn, field):
    good, bad = _record(), copy.deepcopy(_record())
    bad["instance_id"] = "demo.bug.bad"
    mutate_fn(bad)
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(TaskFormatError) as e:
        load_tasks(str(path))
    msg = str(e.value)
    assert f"{path}:2" in msg, msg
    assert f"field {field!r}" in msg or f'field "{field}[' in msg, msg


def test_bad_json_and_duplicates(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps(_record()) + "\n{not json\n")
    with pytest.raises(TaskFormatError, match=r"t.jsonl:2: not valid JSON"):
        load_tasks(str(p))
    p.write_text(json.dumps(_record()) + "\n\n" + json.dumps(_record()) + "\n")
    with pytest.raises(TaskFormatError, match=r"t.jsonl:3: field 'instance_id': duplicate of line 1"):
        load_tasks(str(p))


def test_single_site_mutations_touch_only_the_mutated_lines():
    muts = mutate.candidates("m.py", SRC)
    kinds = {m.kind for m in muts}
    assert kinds == set(mutate.KINDS), kinds
    for m in muts:
        new = mutate.apply_edits(SRC, list(m.edits))
        assert new != SRC
        ast.parse(new)  # still valid Python
        changed = [i for i, (a, b) in enumerate(zip(SRC.splitlines(), new.splitlines())) if a != b]
        if m.kind != "remove_stmt":
            assert len(SRC.splitlines()) == len(new.splitlines())
            assert changed and all(abs(i - (m.line - 1)) <= 1 for i in changed), (m, changed)
            lines, files = patch_stats(make_patch({"m.py": new}, {"m.py": SRC}))
            assert files == 1 and lines == 2 * len(changed)
    # the comment and the blank lines survive every edit (no ast.unparse)
    assert all("# keep this comment" in mutate.apply_edits(SRC, list(m.edits)) for m in muts if m.line != 8)
    cmp_ = [m for m in muts if m.kind == "comparison" and m.line == 6][0]
    assert "if x <= lo:" in mutate.apply_edits(SRC, list(cmp_.edits))


def test_feature_deletion_keeps_signature_docstring_and_imports(tmp_path):
    ds = {d.function: d for d in mutate.deletable_functions("m.py", SRC, min_lines=2)}
    assert {"clamp", "Box.head"} <= set(ds)
    new = mutate.apply_edits(SRC, [ds["clamp"].edit, ds["Box.head"].edit])
    assert '"""Clamp x into [lo, hi]."""' in new and "def head(self, n=1):" in new
    (tmp_path / "m.py").write_text(new)
    r = subprocess.run([sys.executable, "-c", "import m; m.Box([1]).items; m.clamp(1, 0, 2)"], cwd=tmp_path,
                       capture_output=True, text=True)
    assert "NotImplementedError: clamp" in r.stderr
    gold = make_patch({"m.py": new}, {"m.py": SRC})
    assert apply_patch_host({"m.py": new}, gold) == {"m.py": SRC}


def test_prompts_are_terse_and_do_not_leak_the_patch():
    rng = random.Random(0)
    f2p = [f"tests/test_m.py::T::test_case_{i}" for i in range(7)]
    p = prompt.bug_prompt(["pkg/sub/m.py"], f2p, rng)
    assert "`pkg.sub.m`" in p and "5 more" in p and len(p) < 400
    new = mutate.apply_edits(SRC, [mutate.deletable_functions("m.py", SRC, 2)[0].edit])
    gold = make_patch({"m.py": new}, {"m.py": SRC})
    d = prompt.deletion_prompt([("m.py", "clamp", "Clamp x into [lo, hi].")], f2p, rng, gold)
    assert "`clamp`" in d and not prompt.leaks(d, gold)
    assert prompt.leaks("please write: if x < lo: return lo", make_patch({"m.py": "if x < lo: return lo\n"}, {"m.py": ""}))


def test_diff_paths_and_protection_globs():
    ok, probs = diff_paths(make_patch({"a/b.py": "1\n"}, {"a/b.py": "2\n"}))
    assert ok == {"a/b.py"} and not probs
    _, probs = diff_paths("--- a/../etc/x\n+++ b/../etc/x\n")
    assert probs and "'..'" in probs[0]
    _, probs = diff_paths("diff --git a//etc/passwd b//etc/passwd\n")
    assert probs
    _, probs = diff_paths("diff --git a/l b/l\nnew file mode 120000\n")
    assert any("symlink" in p for p in probs)
    for p in ("tests/test_x.py", "pkg/tests/helpers.py", "conftest.py", "a/b/conftest.py", "pytest.ini",
              "setup.cfg", "tox.ini", "pyproject.toml", "sitecustomize.py", "x/usercustomize.py", "evil.pth",
              "pytest.py", "_pytest/main.py", ".c2jax/report.json", "pkg/test_mod.py"):
        assert is_protected(p, DEFAULT_PROTECTED), p
    for p in ("pkg/mod.py", "graphlib.py", "src/lib/core.py"):
        assert not is_protected(p, DEFAULT_PROTECTED), p


def _fake(i: int, codebase: str, category: str, lines: int = 2, files: int = 1):
    return record_from_json(_record()).replace(instance_id=f"t{i:03d}", codebase=codebase, category=category,
                                               stats={"lines_changed": lines, "files_changed": files})


def test_mix_caps_codebases_and_keeps_enough_big_feature_deletions():
    from c2jax.envs.synth.build import enforce_mix

    tasks = [_fake(i, "big", "bug_injection") for i in range(40)]
    tasks += [_fake(100 + i, f"cb{i % 4}", "feature_deletion", 80, 3) for i in range(24)]
    tasks += [_fake(200 + i, f"cb{i % 4}", "bug_injection") for i in range(16)]
    kept = enforce_mix(tasks, 0.25, 0.30)
    n = len(kept)
    counts = {}
    for t in kept:
        counts[t.codebase] = counts.get(t.codebase, 0) + 1
    assert max(counts.values()) <= 0.25 * n
    assert sum(t.category == "feature_deletion" for t in kept) >= 0.30 * n
    assert enforce_mix(tasks, 0.25, 0.30) == kept  # deterministic
    with pytest.raises(ValueError, match="cannot satisfy"):
        enforce_mix([_fake(i, f"c{i % 2}", "bug_injection") for i in range(10)], 0.25, 0.0)
    with pytest.raises(ValueError, match="feature deletions"):
        enforce_mix([_fake(i, f"c{i % 4}", "bug_injection") for i in range(10)], 0.5, 0.3)


def test_difficulty_filter_keeps_tasks_solved_sometimes():
    from c2jax.envs.synth.build import difficulty_filter

    tasks = [_fake(i, "cb", "bug_injection") for i in range(4)]
    rates = {"t000": 0.0, "t001": 0.25, "t002": 1.0, "t003": 0.75}
    kept = difficulty_filter(tasks, lambda t: rates[t.instance_id])
    assert [t.instance_id for t in kept] == ["t001", "t003"]
    assert kept[0].provenance["difficulty"] == {"ref_policy_pass_rate": 0.25}
