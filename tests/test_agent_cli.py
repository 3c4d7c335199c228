"""`python -m c2jax.agent --repo DIR "prompt" --policy ...` on a real directory: the diff is shown,
DIR is left alone unless --apply."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from _agent_fixtures import FIX_PATCH, agent_tokenizer, make_repo, needs_bwrap, repo_env  # noqa: F401

pytestmark = needs_bwrap
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cli(*args, env_dir):
    env = dict(os.environ, C2JAX_ENVS_DIR=env_dir, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "c2jax.agent", *args], capture_output=True, text=True, env=env,
                          timeout=300, cwd=ROOT)


def test_cli_oracle_shows_diff_and_applies_only_when_asked(repo_env, tmp_path):
    repo = make_repo(str(tmp_path / "repo"))
    tok = agent_tokenizer().save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "fix.patch").write_text(FIX_PATCH)
    traj = tmp_path / "traj.json"
    state = os.environ["C2JAX_ENVS_DIR"]
    r = run_cli("--repo", repo, "fix add", "--policy", "oracle", "--patch", str(tmp_path / "fix.patch"),
                "--tokenizer", tok, "--out", str(traj), env_dir=state)
    assert r.returncode == 0, r.stderr
    assert "+    return a + b" in r.stdout and "stop: finished" in r.stderr and "apply_patch" in r.stderr
    assert "return a - b" in open(os.path.join(repo, "pkg/calc.py")).read()  # untouched
    assert json.loads(traj.read_text())["tool_events"][0]["name"] == "apply_patch"
    r = run_cli("--repo", repo, "fix add", "--policy", "oracle", "--patch", str(tmp_path / "fix.patch"),
                "--tokenizer", tok, "--apply", "--quiet", env_dir=state)
    assert r.returncode == 0, r.stderr
    assert "return a + b" in open(os.path.join(repo, "pkg/calc.py")).read()
    r = run_cli("--repo", repo, "x", "--policy", "openai", "--tokenizer", tok, env_dir=state)
    assert r.returncode != 0 and "--base-url" in r.stderr
