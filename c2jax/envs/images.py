"""Environment images: content-addressed, read-only layers (repository + virtualenv), cached.

An *environment* (`env_id`) is a stack of read-only layers plus a virtualenv:
- `build_env(repo_dir, requirements)` (in `c2jax.envs.env_build`: it needs a sandbox) copies the repository into a base layer and builds a venv at
  the fixed in-sandbox path `/env` by running `python -m venv` and `pip install` *inside a sandbox*
  (third-party code never runs on the host). The id is a sha256 over the repository's files
  (paths, types, exec bits, contents, symlink targets), the requirements and the interpreter, so
  building the same inputs again returns the cached environment immediately.
- `new_layer_env(parent, fill)` stacks one more layer on an environment (used by `snapshot`,
  `fork` and `derive_env`); the layer holds only the changes, in overlayfs format (whiteouts for
  deletions, `user.overlay.opaque` for replaced directories), so deriving is O(size of the change).

Layout: images/<env_id>/{meta.json, layer/, venv/ (base environments only)}.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time
import uuid
from typing import Any, Callable, Sequence

from c2jax.envs.errors import SandboxError
from c2jax.envs.state import state_dir

MAX_LAYERS = 64  # overlayfs allows up to 500 lower layers; deep stacks slow every lookup
SANDBOX_PREFIX_PYTHON = "/opt/python"


@dataclasses.dataclass(frozen=True)
class Interpreter:
    """The Python an environment runs, and how the sandbox sees it.

    mode "system": an interpreter under /usr, visible at the same path (its site-packages hidden).
    mode "prefix": a relocatable install (pyenv, conda) bound read-only at /opt/python.
    """

    mode: str
    host_prefix: str
    python: str  # path inside the sandbox
    hide: tuple[str, ...]  # in-sandbox site-packages directories covered by an empty tmpfs

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def detect_interpreter(python: str | None = None) -> Interpreter:
    """Describe `python` (default: /usr/bin/python3 if present, else this process's base Python)."""
    if python is None:
        python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else None
    if python is None:
        prefix = sys.base_prefix
        python = os.path.join(prefix, "bin", f"python{sys.version_info.major}.{sys.version_info.minor}")
    probe = subprocess.run(
        [python, "-I", "-c", "import json,site,sys;print(json.dumps([sys.base_prefix,"
                              "sys.version_info[:2],site.getsitepackages()]))"],
        capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        raise SandboxError(f"cannot run interpreter {python}: {probe.stderr.strip()}")
    prefix, (major, minor), site_dirs = json.loads(probe.stdout)
    real = os.path.realpath(python)
    if real.startswith("/usr/"):
        return Interpreter("system", prefix, real, tuple(d for d in site_dirs if os.path.isdir(d)))
    inner = lambda p: SANDBOX_PREFIX_PYTHON + p[len(prefix):] if p.startswith(prefix) else None
    hide = tuple(inner(d) for d in site_dirs if os.path.isdir(d) and inner(d))
    return Interpreter("prefix", prefix, f"{SANDBOX_PREFIX_PYTHON}/bin/python{major}.{minor}", hide)


@dataclasses.dataclass(frozen=True)
class EnvImage:
    """A loaded environment: its layers (bottom to top), venv directory and interpreter."""

    env_id: str
    root: str
    layers: tuple[str, ...]
    venv: str
    interpreter: Interpreter
    meta: dict


def images_dir() -> str:
    path = os.path.join(state_dir(), "images")
    os.makedirs(path, exist_ok=True)
    return path


def load(env_id: str) -> EnvImage:
    """Load a built environment; raises SandboxError if it does not exist or is incomplete."""
    if not env_id or "/" in env_id or env_id.startswith("."):
        raise SandboxError(f"invalid env id {env_id!r}")
    root = os.path.join(images_dir(), env_id)
    try:
        with open(os.path.join(root, "meta.json")) as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise SandboxError(f"unknown environment {env_id!r} (build it with build_env)") from None
    base = os.path.join(images_dir(), meta["venv_env"])
    layers = tuple(os.path.join(images_dir(), e, "layer") for e in meta["layers"])
    return EnvImage(env_id, root, layers, os.path.join(base, "venv"),
                    Interpreter(**{**meta["interpreter"], "hide": tuple(meta["interpreter"]["hide"])}),
                    meta)


def tree_digest(repo_dir: str) -> str:
    """sha256 over a directory tree: relative paths, file types, exec bits, contents, link targets.

    Refuses device nodes, sockets and FIFOs: in a lower layer a 0/0 character device would act as
    an overlayfs whiteout, and none of them belong in a source repository.
    """
    h = hashlib.sha256()
    repo_dir = os.path.abspath(repo_dir)
    for dirpath, dirnames, filenames in os.walk(repo_dir):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, repo_dir)
        h.update(f"D {rel_dir}\0".encode())
        for name in sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]):
            path = os.path.join(dirpath, name)
            rel = os.path.normpath(os.path.join(rel_dir, name))
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                h.update(f"L {rel}\0{os.readlink(path)}\0".encode())
            elif stat.S_ISREG(st.st_mode):
                fh = hashlib.sha256()
                with open(path, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        fh.update(chunk)
                h.update(f"F {rel}\0{st.st_mode & 0o111:o}\0{fh.hexdigest()}\0".encode())
            elif not stat.S_ISDIR(st.st_mode):
                raise SandboxError(f"{path}: special files (devices, sockets, FIFOs) cannot be in an env")
    return h.hexdigest()


def new_layer_env(parent_id: str, fill: Callable[[str], None], env_id: str | None = None,
                  extra_meta: dict | None = None) -> str:
    """Stack one new layer on `parent_id`; `fill(layer_dir)` writes the layer's contents.

    With an explicit `env_id` (a content hash), an existing environment of that id is reused.
    """
    parent = load(parent_id)
    if len(parent.meta["layers"]) >= MAX_LAYERS:
        raise SandboxError(f"{parent_id} already has {MAX_LAYERS} layers; rebuild it with build_env")
    env_id = env_id or f"snap-{uuid.uuid4().hex[:24]}"
    final = os.path.join(images_dir(), env_id)
    if os.path.exists(os.path.join(final, "meta.json")):
        return env_id
    tmp = os.path.join(images_dir(), f".layer-{env_id}-{uuid.uuid4().hex[:8]}")
    os.makedirs(tmp)
    try:
        fill(os.path.join(tmp, "layer"))
        meta = {**parent.meta, "env_id": env_id, "parent": parent_id,
                "layers": parent.meta["layers"] + [env_id], "created": time.time(),
                **(extra_meta or {})}
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
        try:
            os.rename(tmp, final)
        except OSError:
            if not os.path.exists(os.path.join(final, "meta.json")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return env_id


# ---- looking a path up in a layer stack (overlayfs semantics) -------------------------------

def is_whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def is_opaque(path: str) -> bool:
    for attr in ("user.overlay.opaque", "trusted.overlay.opaque"):
        try:
            if os.getxattr(path, attr, follow_symlinks=False) == b"y":
                return True
        except OSError:
            pass
    return False


def lookup(layers: Sequence[str], rel: str) -> str | None:
    """Host path of `rel` as the merged view of `layers` (bottom to top) shows it, or None.

    Follows overlayfs rules: a whiteout hides the name in all lower layers, a non-directory
    hides everything below it, and an opaque directory hides the lower layers' contents.
    """
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        return None
    for layer in reversed(layers):
        cur = layer
        for i, part in enumerate(parts):
            nxt = os.path.join(cur, part)
            try:
                st = os.lstat(nxt)
            except FileNotFoundError:
                break  # absent here: look lower, unless an ancestor here is opaque
            if is_whiteout(st):
                return None
            last = i == len(parts) - 1
            if not last and not stat.S_ISDIR(st.st_mode):
                return None
            if last:
                return nxt
            cur = nxt
        else:
            return cur  # rel == "" (the root)
        # Not found in this layer. An opaque ancestor (or the found prefix itself) hides lower ones.
        probe = layer
        for part in parts[:i]:
            probe = os.path.join(probe, part)
            if is_opaque(probe):
                return None
    return None


def hide_paths_env(parent_id: str, paths: Sequence[str]) -> str:
    """`parent_id` plus more in-sandbox paths covered up in every sandbox started from it.

    A path ending in "/" is a directory shown empty (a read-only tmpfs); any other path is a file
    shown empty (an empty read-only file bound over it). Used to hide pristine copies of task files
    outside /workspace (e.g. a standard-library module, its .pyc and its Lib/test file). Paths must
    exist in the sandbox's view. Adds an empty layer; derived environments inherit the list.
    """
    parent = load(parent_id)
    hide = list(parent.meta.get("hide", []))
    for p in paths:
        if (not p.startswith("/") or ".." in p.split("/") or p.rstrip("/") in ("", "/workspace")
                or p.startswith("/workspace/")):
            raise SandboxError(f"cannot hide {p!r}: an absolute path outside /workspace is needed")
        if p not in hide:
            hide.append(p)
    key = hashlib.sha256(json.dumps([parent_id, hide]).encode()).hexdigest()[:32]
    return new_layer_env(parent_id, lambda dst: os.makedirs(dst), env_id="hid-" + key,
                         extra_meta={"hide": hide})


# ---- which environments this machine's cache holds -----------------------------------------------

def env_exists(env_id: str) -> bool:
    """The environment and every layer under it are in this machine's environment cache."""
    meta = os.path.join(images_dir(), env_id, "meta.json")
    if not os.path.exists(meta):
        return False
    try:
        layers = load(env_id).meta.get("layers", [])
    except Exception:  # noqa: BLE001 - an unreadable meta.json is as good as missing
        return False
    return all(os.path.exists(os.path.join(images_dir(), x, "meta.json")) for x in layers)


def missing_envs(tasks: Sequence[Any]) -> list[Any]:
    """The tasks (anything with an `env_id`) whose environment is not in this machine's cache."""
    return [t for t in tasks if not env_exists(t.env_id)]
