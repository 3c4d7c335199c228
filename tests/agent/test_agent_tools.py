"""Tool semantics against real files in a real sandbox (one sandbox per module), tool configuration."""
from __future__ import annotations

import json

import pytest

from _agent_common import FIX_PATCH, needs_bwrap  # noqa: F401
from c2jax.agent.tools import TOOL_NAMES, ToolConfig, Toolbox, bm25_rank, check_arguments, lint_python

pytestmark = needs_bwrap


@pytest.fixture(scope="module")
def sb(repo_env):
    from c2jax.envs import start

    with start(repo_env[1], timeout_s=60) as s:
        yield s


def call(box, name, **args):
    return box.call(name, json.dumps(args))


def test_read_file_numbers_lines_and_pages(sb):
    box = Toolbox(sb, ToolConfig(read_max_lines=3))
    sb.write_file("big.txt", "".join(f"line {i}\n" for i in range(1, 11)))
    r = call(box, "read_file", target_file="big.txt")
    assert r.ok and r.content.splitlines()[:3] == ["     1|line 1", "     2|line 2", "     3|line 3"]
    assert "use offset=4" in r.content
    r = call(box, "read_file", target_file="/workspace/big.txt", offset=9, limit=5)
    assert r.content.splitlines() == ["     9|line 9", "    10|line 10"]
    r = call(box, "read_file", target_file="big.txt", offset=20)
    assert not r.ok and "past the end" in r.content and not r.malformed
    r = call(box, "read_file", target_file="missing.py")
    assert not r.ok and not r.malformed and "missing.py" in r.content
    r = call(box, "read_file", target_file="../../etc/passwd")
    assert not r.ok and r.error == "unsafe_path"
    sb.write_file("bin.dat", b"\0\1\2" * 10)
    assert call(box, "read_file", target_file="bin.dat").error == "binary"
    capped = Toolbox(sb, ToolConfig(read_max_bytes=20))
    r = call(capped, "read_file", target_file="big.txt")
    assert "line 1" in r.content and "line 9" not in r.content


def test_edit_tools_change_real_files(sb):
    box = Toolbox(sb)
    sb.write_file("e.py", "x = 1\ny = 1\nx = 1\n")
    r = call(box, "search_replace", file_path="e.py", old_string="x = 1", new_string="x = 2")
    assert not r.ok and r.error == "not_unique" and sb.read_file("e.py") == "x = 1\ny = 1\nx = 1\n"
    assert call(box, "search_replace", file_path="e.py", old_string="y = 1", new_string="y = 3").ok
    assert call(box, "search_replace", file_path="e.py", old_string="x = 1", new_string="x = 2", replace_all=True).ok
    assert sb.read_file("e.py") == "x = 2\ny = 3\nx = 2\n"
    assert call(box, "search_replace", file_path="e.py", old_string="zzz", new_string="q").error == "not_found"
    assert call(box, "write_file", file_path="new/dir/f.txt", contents="hello\n").ok
    assert sb.read_file("new/dir/f.txt") == "hello\n"
    assert call(box, "delete_file", target_file="new/dir/f.txt").ok
    assert call(box, "delete_file", target_file="new/dir/f.txt").error == "delete_failed"
    assert call(box, "delete_file", target_file="new").error == "delete_failed"  # a directory
    with pytest.raises(FileNotFoundError):
        sb.read_file("new/dir/f.txt")


def test_apply_patch(sb):
    from c2jax.envs import start

    with start(sb.env_id) as fresh:
        box = Toolbox(fresh)
        r = call(box, "apply_patch", patch=FIX_PATCH)
        assert r.ok, r.content
        assert "return a + b" in fresh.read_file("pkg/calc.py")
        again = call(box, "apply_patch", patch=FIX_PATCH)  # already applied: the context no longer matches
        assert not again.ok and again.error == "patch_failed"
        p0 = FIX_PATCH.replace("a/pkg", "pkg").replace("b/pkg", "pkg").replace("+    return a + b", "+    return b + a") \
            .replace("-    return a - b", "-    return a + b")
        assert call(box, "apply_patch", patch=p0).ok  # -p0 style paths
        assert "return b + a" in fresh.read_file("pkg/calc.py")


def test_search_tools(sb):
    box = Toolbox(sb, ToolConfig(grep_max_matches=2))
    r = call(box, "grep", pattern=r"def \w+\(a, b\)")
    assert r.ok and r.content.splitlines()[:2] == ["pkg/calc.py:1:def add(a, b):", "pkg/calc.py:5:def mul(a, b):"]
    r = call(box, "grep", pattern="def", include="*.md")
    assert r.content.startswith("No matches")
    r = call(box, "grep", pattern="DEF SHOUT", case_insensitive=True, path="pkg")
    assert r.content == "pkg/text.py:1:def shout(s):"
    sb.write_file("many.txt", "hit\n" * 10)
    r = call(box, "grep", pattern="hit", path="many.txt")
    assert r.content.splitlines()[:2] == ["1:hit", "2:hit"] and "more matches" in r.content
    r = call(box, "grep", pattern="(unclosed")
    assert not r.ok and not r.malformed and r.error == "grep_failed"
    r = call(box, "glob_file_search", glob_pattern="*.py")
    assert r.content.splitlines() == sorted(r.content.splitlines()) and "pkg/calc.py" in r.content and "run_tests.py" in r.content
    assert call(box, "glob_file_search", glob_pattern="*.py", target_directory="pkg").content.splitlines() == [
        "pkg/__init__.py", "pkg/calc.py", "pkg/text.py"]
    r = call(box, "codebase_search", query="upper case greeting shout")
    assert r.content.splitlines()[0].startswith("pkg/text.py:1-")
    r = call(box, "list_dir", target_directory=".")
    assert "pkg/" in r.content.splitlines() and "run_tests.py (" in r.content and "README.md (30 bytes)" in r.content


def test_terminal_persistent_timeout_background(sb):
    box = Toolbox(sb, ToolConfig(output_max_chars=300))
    r = call(box, "run_terminal_cmd", command="python run_tests.py")
    assert not r.ok and "AssertionError: -1" in r.content and r.content.endswith("Exit code: 1")
    assert call(box, "run_terminal_cmd", command="cd pkg && export FOO=bar").ok
    assert call(box, "run_terminal_cmd", command="echo $FOO $(pwd)").content.startswith("bar /workspace/pkg")
    r = call(box, "run_terminal_cmd", command="sleep 30", timeout=1)
    assert not r.ok and r.error == "timeout" and "timed out" in r.content
    r = call(box, "run_terminal_cmd", command="python -c \"print('x' * 5000)\"")
    assert r.ok and "characters cut" in r.content and "(output truncated)" in r.content and len(r.content) < 500
    r = call(box, "run_terminal_cmd", command="sleep 0.2; echo done-bg", is_background=True)
    assert r.ok and r.meta["log"].startswith("/tmp/bg_")
    out = call(box, "run_terminal_cmd", command=f"sleep 0.5; cat {r.meta['log']}")
    assert "done-bg" in out.content
    box.close()


def test_lints_and_todos(sb):
    box = Toolbox(sb)
    sb.write_file("lint_me.py", "import os\nimport sys\n\ndef f():\n    return undefined_name + sys.argv\n")
    r = call(box, "read_lints", paths=["lint_me.py"])
    assert r.content.splitlines() == ["lint_me.py:1: 'os' imported but unused",
                                      "lint_me.py:5: undefined name 'undefined_name'"]
    sb.write_file("broken.py", "def f(:\n")
    assert "SyntaxError" in call(box, "read_lints", paths=["broken.py"]).content
    assert call(box, "read_lints").meta["problems"] >= 2  # default: the files changed so far
    r = call(box, "todo_write", merge=False, todos=[{"id": "a", "content": "find bug", "status": "in_progress"},
                                                    {"id": "b", "content": "fix", "status": "pending"}])
    assert r.ok
    call(box, "todo_write", merge=True, todos=[{"id": "a", "content": "find bug", "status": "completed"},
                                               {"id": "c", "content": "test", "status": "pending"}])
    assert [t["id"] for t in box.todos] == ["a", "b", "c"]
    assert [t["id"] for t in box.open_todos()] == ["b", "c"]
    bad = call(box, "todo_write", merge=True, todos=[{"id": "x", "content": "y", "status": "done"}])
    assert bad.malformed and "status" in bad.content


def test_tool_configuration(sb):
    bash = Toolbox(sb, ToolConfig(bash_only=True))
    assert [t["function"]["name"] for t in bash.schemas()] == ["run_terminal_cmd"]
    r = call(bash, "read_file", target_file="README.md")
    assert r.malformed and "not available" in r.content
    assert call(bash, "run_terminal_cmd", command="cat README.md").content.startswith("calc:")
    bash.close()
    fewer = Toolbox(sb, ToolConfig(disabled=("delete_file", "apply_patch")))
    assert set(fewer.names) == set(TOOL_NAMES) - {"delete_file", "apply_patch"}
    assert call(fewer, "delete_file", target_file="README.md").malformed
    with pytest.raises(ValueError, match="unknown tool"):
        ToolConfig(disabled=("no_such_tool",)).tool_names()
    # lenient (default): "5" -> 5 and unknown arguments ignored; strict: both rejected
    lenient, strict = Toolbox(sb), Toolbox(sb, ToolConfig(strict=True))
    args = json.dumps({"target_file": "README.md", "limit": "1", "bogus": True})
    assert lenient.call("read_file", args).ok
    r = strict.call("read_file", args)
    assert r.malformed and "limit" in r.content and "bogus" in r.content
    assert all(t["function"]["parameters"]["additionalProperties"] is False for t in strict.schemas())


def test_argument_errors_are_messages():
    for name, args, frag in [("read_file", "{", "not valid JSON"), ("read_file", "[1]", "JSON object"),
                             ("read_file", "{}", "'target_file' is a required property"),
                             ("read_file", '{"target_file": 3}', "is not of type 'string'"),
                             ("grep", '{"pattern": "x", "max_matches": 0}', "minimum"),
                             ("run_terminal_cmd", '{"command": "ls", "timeout": -1}', "timeout")]:
        got, err = check_arguments(name, args, strict=False)
        assert got is None and frag in err, (name, args, err)


def test_bm25_and_lint_helpers():
    docs = ["def parse_json(text): pass", "class HttpServer: serve requests", "json decoder parse"]
    ranked = bm25_rank("parse JSON", docs, 3)
    # both matching docs hit both terms once; the shorter one (3 terms vs 6) ranks first (length norm.)
    assert [i for i, _ in ranked] == [2, 0] and ranked[0][1] > ranked[1][1]
    assert bm25_rank("nothing here", docs, 3) == []
    assert lint_python("from x import *\nprint(y)\n") == []  # star import: names unknown, not reported
    assert lint_python("__all__ = ['os']\nimport os\n") == []


def test_lint_ignores_future_imports_and_noqa():
    assert lint_python("from __future__ import annotations\nimport os  # noqa: F401\n") == []
