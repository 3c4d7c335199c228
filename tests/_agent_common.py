"""Shared helpers for tests/agent/test_agent_*.py and tests/serve/test_serve_*.py (not collected: no test_ prefix).

A small tokenizer trained in-process (stdlib json modules plus the tool names, under a second), a
private environments state directory, and a tiny repository with a bug and a test script.
"""
from __future__ import annotations

import functools
import glob
import os
import sysconfig
import tempfile



REPO_FILES = {
    "pkg/__init__.py": "",
    "pkg/calc.py": "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n",
    "pkg/text.py": "def shout(s):\n    \"\"\"Upper-case a greeting.\"\"\"\n    return s.upper() + '!'\n",
    "run_tests.py": ("from pkg.calc import add, mul\n\nassert mul(2, 3) == 6\nassert add(2, 3) == 5, add(2, 3)\n"
                     "print('all tests passed')\n"),
    "README.md": "calc: tiny arithmetic helpers\n",
}
FIX_PATCH = ("diff --git a/pkg/calc.py b/pkg/calc.py\n--- a/pkg/calc.py\n+++ b/pkg/calc.py\n@@ -1,5 +1,5 @@\n"
             " def add(a, b):\n-    return a - b\n+    return a + b\n \n \n def mul(a, b):\n")


from _envs_common import BWRAP_PROBLEM, needs_bwrap  # noqa: E402,F401  (one bwrap probe for all areas)


@functools.lru_cache(maxsize=None)
def agent_tokenizer(vocab_size: int = 1024):
    """Byte-level BPE trained on a few stdlib modules and the tool vocabulary."""
    from c2jax.agent.tools import SCHEMAS
    from c2jax.data.tokenizer import train_tokenizer

    stdlib = sysconfig.get_paths()["stdlib"]
    texts = []
    for f in sorted(glob.glob(os.path.join(stdlib, "json", "*.py"))):
        with open(f, encoding="utf-8") as fh:
            texts.append(fh.read())
    texts += [f"functions.{n}:{i}" for n in SCHEMAS for i in range(3)] * 5
    return train_tokenizer(texts, vocab_size=vocab_size)


@functools.lru_cache(maxsize=None)
def chat_format():
    from c2jax.data.chat_format import ChatFormat

    return ChatFormat(agent_tokenizer())


_STATE: dict = {}


def make_repo(root: str) -> str:
    for rel, text in REPO_FILES.items():
        p = os.path.join(root, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(text)
    return root


def build_repo_env() -> tuple:
    """(repo dir, env id) of the buggy repository, built once per test session (in the session's
    private state dir, $C2JAX_ENVS_DIR, set by tests/conftest.py); the `repo_env` fixture."""
    if "env" not in _STATE:
        from c2jax.envs import build_env

        repo = make_repo(tempfile.mkdtemp(prefix="c2jax_agent_repo_"))
        _STATE["env"] = (repo, build_env(repo))
    return _STATE["env"]


# A graded task over `repo_env` (a harbor-style script runner), shared by the rollout, RL-step and
# async-RL tests.
HIDDEN = "from pkg.calc import add\nassert add(2, 2) == 4\nassert add(-1, 1) == 0\n"


def make_task(env_id: str):
    from c2jax.envs.tasks import record_from_json
    return record_from_json({
        "instance_id": "calc-add-sign", "source": {"kind": "harbor", "package": "calc", "version": "0",
                                                   "sha256": "", "license": "MIT"},
        "codebase": "calc", "env_id": env_id, "category": "harbor", "subcategory": "sign",
        "problem_statement": "add() subtracts; make it add.",
        "test": {"runner": "script", "cmd": ["sh", "-c", "python hidden_check.py && echo 1 > reward.txt || echo 0 > reward.txt"],
                 "report": "reward.txt"},
        "timeouts": {"agent_s": 120, "verify_s": 60}, "limits": {"timeout_s": 60},
        "hidden_tests": {"files": {"hidden_check.py": HIDDEN}, "FAIL_TO_PASS": ["hidden_check"], "PASS_TO_PASS": []},
        "patch": FIX_PATCH, "protected_paths": ["hidden_check.py"], "provenance": {}, "stats": {}})
