"""Git-format patches between file states, made on the host with `git diff --no-index`.

`make_patch(old, new)` takes two {workspace path: text or None (absent)} maps and returns the
patch taking `old` to `new`, with `a/` and `b/` prefixes as `git apply` (and SWE-bench) expect.
"""
from __future__ import annotations

import os
import subprocess
import tempfile
from typing import Mapping

from c2jax.envs.gitdiff import rewrite_headers


def make_patch(old: Mapping[str, str | None], new: Mapping[str, str | None]) -> str:
    """Patch from the `old` files to the `new` files (paths relative to the workspace)."""
    paths = sorted(set(old) | set(new))
    with tempfile.TemporaryDirectory(prefix="c2jax-patch-") as tmp:
        for side, files in (("a", old), ("b", new)):
            os.makedirs(os.path.join(tmp, side))
            for p in paths:
                text = files.get(p)
                if text is None:
                    continue
                dst = os.path.join(tmp, side, p)
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                with open(dst, "w", encoding="utf-8", newline="") as f:
                    f.write(text)
        env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "GIT_CONFIG_NOSYSTEM": "1",
               "GIT_CONFIG_GLOBAL": "/dev/null", "LC_ALL": "C"}
        r = subprocess.run(["git", "-c", "core.quotepath=false", "diff", "--no-index", "--binary", "--no-color",
                            "--no-ext-diff", "--no-renames", "--full-index", "a", "b"],
                           cwd=tmp, env=env, capture_output=True)
        if r.returncode not in (0, 1):
            raise RuntimeError(f"git diff failed: {r.stderr.decode(errors='replace')}")
        return rewrite_headers(r.stdout.decode("utf-8", errors="surrogateescape"))


def apply_patch_host(root_files: Mapping[str, str | None], patch: str, *,
                     reverse: bool = False) -> dict[str, str | None]:
    """Apply `patch` (or undo it: `reverse`) to the given files in a scratch tree (git apply).

    Returns the given files' new texts (None: absent). Raises ValueError if the patch does not
    apply cleanly. Used to check that a gold patch turns the broken state back into the pristine
    one, and (reverse) to recover a task's broken state from the pristine files and its gold patch.
    """
    with tempfile.TemporaryDirectory(prefix="c2jax-apply-") as tmp:
        for p, text in root_files.items():
            if text is None:
                continue
            dst = os.path.join(tmp, p)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            with open(dst, "w", encoding="utf-8", newline="") as f:
                f.write(text)
        env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null"}
        args = ["git", "apply", "--whitespace=nowarn"] + (["-R"] if reverse else []) + ["-"]
        r = subprocess.run(args, input=patch.encode(), cwd=tmp,
                           env=env, capture_output=True)
        if r.returncode != 0:
            raise ValueError(f"patch does not apply: {r.stderr.decode(errors='replace')[:500]}")
        out = {}
        for p in root_files:
            dst = os.path.join(tmp, p)
            out[p] = open(dst, encoding="utf-8", newline="").read() if os.path.exists(dst) else None
        return out
