"""`python -m c2jax.agent --repo DIR "prompt" --policy ...` on a real directory: the diff is shown,
DIR is left alone unless --apply."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from _agent_common import FIX_PATCH, agent_tokenizer, make_repo, needs_bwrap  # noqa: F401
from _paths import REPO_ROOT  # noqa: E402

pytestmark = needs_bwrap
ROOT = REPO_ROOT


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


@pytest.mark.slow
def test_cli_engine_policy_on_a_checkpoint(repo_env, tmp_path):
    """--policy engine --checkpoint: the bigram test model (see test_serve_openai.py) calls read_lints,
    which the bash-only tool set does not offer: the model is told so every turn until max_turns."""
    from c2jax.data.chat_format import ChatFormat
    from c2jax.model import preset
    from c2jax.serve import save_serving_checkpoint
    from _serve_common import bigram_params

    tok = agent_tokenizer()
    fmt = ChatFormat(tok)
    cfg = preset("tiny").replace(vocab_size=tok.vocab_size, mtp_depth=0)
    ck = save_serving_checkpoint(str(tmp_path / "ck"), bigram_params(cfg, fmt), cfg, tok)
    repo = make_repo(str(tmp_path / "repo"))
    r = run_cli("--repo", repo, "lint it", "--policy", "engine", "--checkpoint", ck, "--bash-only", "--max-turns", "2",
                "--max-len", "1024", "--out", str(tmp_path / "t.json"), env_dir=os.environ["C2JAX_ENVS_DIR"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert "stop: max_turns" in r.stderr and "not available in this environment" in r.stderr and r.stdout == ""
    t = json.loads((tmp_path / "t.json").read_text())
    assert [e["malformed"] for e in t["tool_events"]] == [True, True]
