"""build_env: a repository + its requirements -> a content-addressed base environment.

The repository is copied into the base layer; the venv at `/env` is made by `python -m venv` and
`pip install` *inside a sandbox* (third-party code never runs on the host), so this module sits
above both `images` (the layer store) and `sandbox` (which runs the build).
"""
from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import time
import uuid
from typing import Sequence

from c2jax.envs.errors import SandboxError
from c2jax.envs.images import detect_interpreter, images_dir, tree_digest
from c2jax.envs.sandbox import launch_build

BUILDER_VERSION = "2"

_FIND_PIP_WHEEL = """
import ensurepip, glob, os
pkg = ensurepip._get_packages()["pip"] if hasattr(ensurepip, "_get_packages") else None
path = getattr(pkg, "wheel_path", None) or (pkg and pkg.wheel_name and os.path.join(
    os.path.dirname(ensurepip.__file__), "_bundled", pkg.wheel_name))
path = path or sorted(glob.glob(os.path.join(os.path.dirname(ensurepip.__file__), "_bundled", "pip-*.whl")))[-1]
print(os.path.join(path, "pip"))
"""


def _requirements_text(requirements: str | Sequence[str] | None) -> str:
    if requirements is None:
        return ""
    if isinstance(requirements, str):
        if os.path.exists(requirements):
            with open(requirements) as f:
                return f.read()
        return requirements
    return "\n".join(requirements) + "\n"


def build_env(repo_dir: str, requirements: str | Sequence[str] | None = None, *,
              wheelhouse: str | None = None, python: str | None = None, network: bool = False,
              timeout_s: float = 1800.0) -> str:
    """Build (or reuse) the environment of a repository; returns its content-hashed `env_id`.

    Args:
      repo_dir: the repository at its base state; copied into the environment's base layer.
      requirements: a requirements file path, its text, or a list of requirement lines.
      wheelhouse: a directory of wheels; pip then installs with `--no-index --find-links` only.
        Default: $C2JAX_WHEELHOUSE if set.
      python: interpreter for the venv (default /usr/bin/python3, else this Python's base install).
      network: let pip reach its index (only when no wheelhouse is given; off in tests).
    """
    if not os.path.isdir(repo_dir):
        raise SandboxError(f"repository {repo_dir!r} is not a directory")
    req = _requirements_text(requirements)
    wheelhouse = wheelhouse or os.environ.get("C2JAX_WHEELHOUSE") or None
    interp = detect_interpreter(python)
    key = hashlib.sha256(json.dumps([BUILDER_VERSION, tree_digest(repo_dir), req,
                                     interp.to_json()]).encode()).hexdigest()
    env_id = "env-" + key[:32]
    final = os.path.join(images_dir(), env_id)
    if os.path.exists(os.path.join(final, "meta.json")):
        return env_id
    tmp = os.path.join(images_dir(), f".build-{env_id}-{uuid.uuid4().hex[:8]}")
    os.makedirs(os.path.join(tmp, "venv"))
    try:
        subprocess.run(["cp", "-a", "--", os.path.join(os.path.abspath(repo_dir), "."),
                        os.path.join(tmp, "layer")], check=True, capture_output=True)
        os.chmod(os.path.join(tmp, "layer"), 0o755)
        script = [f"{interp.python} -m venv --without-pip /env"]
        if req:
            with open(os.path.join(tmp, "venv", ".c2jax-requirements.txt"), "w") as f:
                f.write(req)
            # pip runs straight from the interpreter's bundled pip wheel (no ensurepip step, and
            # pip itself is not left in the environment); plain ensurepip is the fallback.
            script.append(f"PIP=$(/env/bin/python -c {shlex.quote(_FIND_PIP_WHEEL)}) || "
                          "{ /env/bin/python -m ensurepip -q && PIP='-m pip'; }")
            pip = "/env/bin/python $PIP install --disable-pip-version-check --no-input -q"
            if wheelhouse:
                pip += " --no-index --find-links /wheelhouse"
            elif not network:
                raise SandboxError("requirements need a wheelhouse (or network=True to use pip's index)")
            script.append(f"{pip} -r /env/.c2jax-requirements.txt")
        result = launch_build(tmp, interp, " && ".join(script), wheelhouse=wheelhouse,
                              network=network and not wheelhouse, timeout_s=timeout_s)
        if result.exit_code != 0:
            raise SandboxError(f"building {env_id} failed (exit {result.exit_code}, "
                               f"{result.killed_reason}):\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
        meta = {"env_id": env_id, "parent": None, "layers": [env_id], "venv_env": env_id,
                "interpreter": interp.to_json(), "requirements": req, "created": time.time(),
                "source": os.path.abspath(repo_dir)}
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
        try:
            os.rename(tmp, final)
        except OSError:  # built concurrently by someone else: theirs is identical
            if not os.path.exists(os.path.join(final, "meta.json")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return env_id
