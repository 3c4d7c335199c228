"""Leakage scrub: find, from INSIDE a sandbox, every readable file that would give the answer away.

`scan(env_id, digests, pyc_stems)` runs a small Python walker in a sandbox over the whole visible
filesystem (not /proc, /sys, /dev) and reports:
  hash   a file whose sha256 is one of `digests` (a pristine copy of a changed file, or a hidden
         test file); only files whose size equals one of the targets' sizes are hashed, so the
         walk stays cheap;
  pyc    compiled bytecode of a changed module (`<stem>.cpython-*.pyc` under a matching dir);
  vcs / cache / sdist   under /workspace and /tmp: `.git`, `.hg`, `.svn`, `__pycache__`, `*.pyc`,
         `.mypy_cache`, `.pytype`, `.pyre`, `.ruff_cache`, `.pytest_cache`, `*.egg-info`,
         `*.tar.gz`, `*.zip`, `*.whl`, `*.orig`, `*.rej`, pip caches.
Synthesis hides every hit outside /workspace (`images.hide_paths_env`), then checks the task's
environment again: a task is valid only if this scan comes back empty.
"""
from __future__ import annotations

import hashlib
import json
from typing import Iterable, Mapping

SCAN_SCRIPT = r'''
import fnmatch, hashlib, json, os, stat, sys
cfg = json.load(sys.stdin)
targets = {d: label for d, label in cfg["digests"].items()}
sizes = set(cfg["sizes"])
pyc = [(s, d) for s, d in cfg["pyc"]]
skip = ("/proc", "/sys", "/dev", "/run/c2jax")
bad_names = (".git", ".hg", ".svn", "__pycache__", ".mypy_cache", ".pytype", ".pyre", ".ruff_cache",
             ".pytest_cache", "pip-wheel-metadata")
bad_globs = ("*.pyc", "*.egg-info", "*.tar.gz", "*.tgz", "*.zip", "*.whl", "*.orig", "*.rej", "*.tar.bz2")
hits = []
for top in ("/",):
    for d, dirs, files in os.walk(top):
        if d.startswith(skip):
            dirs[:] = []
            continue
        strict = d.startswith(("/workspace", "/tmp"))
        for name in list(dirs):
            p = os.path.join(d, name)
            if strict and (name in bad_names or fnmatch.fnmatch(name, "*.egg-info")):
                hits.append([p + "/", "vcs" if name in (".git", ".hg", ".svn") else "cache"])
            if p.startswith(skip) or os.path.islink(p):
                dirs.remove(name)
        for name in files:
            p = os.path.join(d, name)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            if strict and any(fnmatch.fnmatch(name, g) for g in bad_globs):
                hits.append([p, "sdist" if name.endswith((".tar.gz", ".tgz", ".zip", ".whl", ".tar.bz2")) else "cache"])
            if name.endswith(".pyc") and os.path.basename(d) == "__pycache__" and st.st_size > 0:
                stem = name.split(".")[0]
                parent = os.path.dirname(d)
                for s, suffix in pyc:
                    if stem == s and (not suffix or parent.endswith("/" + suffix) or parent == "/" + suffix):
                        hits.append([p, "pyc"])
            if st.st_size in sizes:
                try:
                    with open(p, "rb") as f:
                        h = hashlib.sha256(f.read()).hexdigest()
                except OSError:
                    continue
                if h in targets:
                    hits.append([p, "hash:" + targets[h]])
print(json.dumps(hits))
'''


def digests_of(files: Mapping[str, str | bytes]) -> tuple[dict[str, str], list[int]]:
    """({sha256: label}, sizes) of named file contents."""
    out, sizes = {}, set()
    for label, text in files.items():
        data = text.encode("utf-8") if isinstance(text, str) else text
        out[hashlib.sha256(data).hexdigest()] = label
        sizes.add(len(data))
    return out, sorted(sizes)


def pyc_patterns(paths: Iterable[str]) -> list[tuple[str, str]]:
    """(stem, parent-dir suffix) for each workspace .py path; top-level modules match any dir."""
    out = []
    for p in paths:
        if not p.endswith(".py"):
            continue
        rel = p[4:] if p.startswith("src/") else p
        parts = rel[:-3].split("/")
        stem, parent = parts[-1], "/".join(parts[:-1])
        if parent in ("tests", "test"):  # stdlib layout: tests/test_x.py is Lib/test/test_x.py
            parent = "test"
        out.append((stem, parent))
    return out


def scan(env_id: str, files: Mapping[str, str | bytes], pyc_paths: Iterable[str] = (),
         timeout_s: float = 300.0) -> list[tuple[str, str]]:
    """[(in-sandbox path, reason)] of leaks visible in a sandbox of `env_id` (see module doc)."""
    from c2jax.envs import start

    digests, sizes = digests_of(files)
    cfg = {"digests": digests, "sizes": sizes, "pyc": pyc_patterns(pyc_paths)}
    with start(env_id, timeout_s=timeout_s, lifetime_s=timeout_s + 60, cpu_s=int(timeout_s) + 10) as sb:
        r = sb.exec(["/env/bin/python", "-I", "-c", SCAN_SCRIPT], stdin=json.dumps(cfg), timeout=timeout_s)
        if r.exit_code != 0:
            raise RuntimeError(f"leak scan failed in {env_id}: {r.stderr[-2000:]}")
    return [(p, why) for p, why in json.loads(r.stdout)]
