"""derive_env: a new environment = an existing one + a git patch, sharing the base layers.

The patch is applied by `git apply` *inside a sandbox* over the parent environment (patches are
untrusted data), and the resulting writable layer becomes the new environment's top layer. The id is
a hash of (parent, patch), so deriving the same patch twice returns the cached environment.
"""
from __future__ import annotations

import hashlib
import os

from c2jax.envs import images
from c2jax.envs.errors import SandboxError


def derive_env(env_id: str, patch: str | bytes) -> str:
    """Environment `env_id` with `patch` (git format, as `Sandbox.diff()` makes) applied."""
    from c2jax.envs.sandbox import start

    data = patch.encode() if isinstance(patch, str) else patch
    new_id = "drv-" + hashlib.sha256(env_id.encode() + b"\0" + data).hexdigest()[:32]
    if os.path.exists(os.path.join(images.images_dir(), new_id, "meta.json")):
        return new_id
    if not data.strip():
        return env_id
    with start(env_id, timeout_s=300) as sb:
        r = sb.exec(["git", "apply", "--binary", "--whitespace=nowarn", "-"], stdin=data)
        if r.exit_code != 0:
            raise ValueError(f"patch does not apply to {env_id}: {r.stderr.strip()[:2000]}")
        return sb.snapshot(env_id=new_id, extra_meta={"patch_sha256": hashlib.sha256(data).hexdigest()})
