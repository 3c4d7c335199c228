"""Sandboxed coding environments: build an environment once, start isolated sandboxes over it.

    from c2jax.envs import build_env, start, derive_env
    env = build_env("repo/", requirements=["pytest"])     # content-hashed, cached base layer + venv
    with start(env, timeout_s=60) as sb:                  # bwrap + copy-on-write overlay + cgroups
        sb.exec("python -m pytest -q").exit_code
        patch = sb.diff()
    task_env = derive_env(env, patch)                     # one more layer, shares the base

Fixed paths inside every sandbox: /workspace (the repository, writable overlay), /env (the
environment's virtualenv, read-only; /env/bin/python), /tmp (private, size-capped).
Infrastructure failures raise `SandboxError`; a failing command is an `ExecResult`.
"""
from c2jax.envs.errors import PoolFull, SandboxClosed, SandboxError, UnsafePath
from c2jax.envs.env_build import build_env
from c2jax.envs.limits import Limits
from c2jax.envs.sandbox import KILLED_REASONS, ExecResult, Process, Sandbox, ShellSession, flush_cleanup, start
from c2jax.envs.derive import derive_env
from c2jax.envs.pool import SandboxPool

__all__ = ["build_env", "start", "derive_env", "Sandbox", "ExecResult", "Process", "ShellSession",
           "Limits", "SandboxError", "SandboxClosed", "UnsafePath", "PoolFull", "KILLED_REASONS",
           "SandboxPool", "flush_cleanup"]
