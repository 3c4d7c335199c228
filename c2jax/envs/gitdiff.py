"""A git-format patch of a sandbox's workspace against its environment (binary-safe, round-trips).

Which paths changed comes from the overlay's upper directory (names, whiteouts and opaque
directories only: metadata, read while the sandbox is frozen); the *new* contents are read through
the merged /workspace view with the escape-proof file API, the *old* ones from the read-only layers.
Both sides are staged into two small trees `a/` and `b/` holding only the changed paths, and
`git diff --no-index --binary` writes the patch, so modes, symlinks, deletions and binary files are
all encoded the way `git apply` expects. Empty directories are not representable in git patches.
"""
from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import tempfile
from typing import Sequence

from c2jax.envs import fsops, images


def changed_paths(layers: Sequence[str], upper: str) -> tuple[set[str], set[str]]:
    """(paths written or created, paths deleted) relative to /workspace, files and symlinks only."""
    written: set[str] = set()
    deleted: set[str] = set()

    def lower_files(rel_dir: str) -> list[str]:
        """Non-directory paths under rel_dir in the base (lower layers' merged view)."""
        out = []
        base = images.lookup(layers, rel_dir)
        if base is None or not os.path.isdir(base):
            return out
        stack = [rel_dir]
        while stack:
            d = stack.pop()
            for layer in layers:  # union of names; lookup() decides visibility
                p = os.path.join(layer, d)
                if not os.path.isdir(p) or os.path.islink(p):
                    continue
                for name in os.listdir(p):
                    rel = f"{d}/{name}" if d else name
                    host = images.lookup(layers, rel)
                    if host is None:
                        continue
                    if os.path.isdir(host) and not os.path.islink(host):
                        if rel not in stack:
                            stack.append(rel)
                    else:
                        out.append(rel)
        return sorted(set(out))

    def walk(rel_dir: str) -> None:
        host_dir = os.path.join(upper, rel_dir)
        for name in os.listdir(host_dir):
            rel = f"{rel_dir}/{name}" if rel_dir else name
            st = os.lstat(os.path.join(upper, rel))
            if images.is_whiteout(st):
                base = images.lookup(layers, rel)
                if base is not None and os.path.isdir(base) and not os.path.islink(base):
                    deleted.update(lower_files(rel))
                else:
                    deleted.add(rel)
            elif stat.S_ISDIR(st.st_mode):
                base = images.lookup(layers, rel)
                if base is not None and not (os.path.isdir(base) and not os.path.islink(base)):
                    deleted.add(rel)  # a file/symlink replaced by a directory
                if images.is_opaque(os.path.join(upper, rel)):
                    deleted.update(lower_files(rel))
                walk(rel)
            else:
                base = images.lookup(layers, rel)
                if base is not None and os.path.isdir(base) and not os.path.islink(base):
                    deleted.update(lower_files(rel))  # a directory replaced by a file
                written.add(rel)

    walk("")
    deleted -= written
    return written, deleted


def _stage_host(src: str, dst: str) -> None:
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    st = os.lstat(src)
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(src), dst)
    elif stat.S_ISREG(st.st_mode):
        shutil.copyfile(src, dst)
        os.chmod(dst, 0o755 if st.st_mode & 0o111 else 0o644)


def _stage_merged(root_fd: int, rel: str, dst: str) -> bool:
    """Copy `rel` from the merged view into dst; False if it is not a file or symlink there."""
    try:
        fd = fsops.openat2(root_fd, rel, os.O_PATH | os.O_NOFOLLOW)
    except (FileNotFoundError, NotADirectoryError):
        return False
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    if stat.S_ISLNK(st.st_mode):
        head, _, name = rel.rpartition("/")
        dfd = fsops.openat2(root_fd, head or ".", os.O_PATH | os.O_DIRECTORY)
        try:
            os.symlink(os.readlink(name, dir_fd=dfd), dst)
        finally:
            os.close(dfd)
        return True
    if stat.S_ISREG(st.st_mode):
        with open(dst, "wb") as f:
            f.write(fsops.read_bytes(root_fd, rel))
        os.chmod(dst, 0o755 if st.st_mode & 0o111 else 0o644)
        return True
    return False


def workspace_diff(layers: Sequence[str], upper: str, root_fd: int) -> str:
    """The git patch taking the environment's base workspace to the sandbox's current one."""
    written, deleted = changed_paths(layers, upper)
    if not written and not deleted:
        return ""
    with tempfile.TemporaryDirectory(prefix="c2jax-diff-") as tmp:
        a, b = os.path.join(tmp, "a"), os.path.join(tmp, "b")
        os.makedirs(a)
        os.makedirs(b)
        for rel in sorted(written | deleted):
            base = images.lookup(layers, rel)
            if base is not None and not (os.path.isdir(base) and not os.path.islink(base)):
                _stage_host(base, os.path.join(a, rel))
            if rel in written:
                _stage_merged(root_fd, rel, os.path.join(b, rel))
        env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "GIT_CONFIG_NOSYSTEM": "1",
               "GIT_CONFIG_GLOBAL": "/dev/null", "LC_ALL": "C"}
        r = subprocess.run(["git", "-c", "core.quotepath=false", "diff", "--no-index", "--binary",
                            "--no-color", "--no-ext-diff", "--no-renames", "--full-index", "a", "b"],
                           cwd=tmp, env=env, capture_output=True)
        if r.returncode not in (0, 1):
            raise RuntimeError(f"git diff failed: {r.stderr.decode(errors='replace')}")
        return rewrite_headers(r.stdout.decode("utf-8", errors="surrogateescape"))


_HEADER = re.compile(r'^diff --git ("?)a/[ab]/(.*?)\1 ("?)b/[ab]/(.*?)\3$')
_FILE_LINE = re.compile(r'^(---|\+\+\+) ("?)([ab])/[ab]/')


def rewrite_headers(patch: str) -> str:
    """git diff --no-index of trees a/ and b/ names paths 'a/a/x' or 'a/b/x'; make them 'a/x'."""
    out = []
    for line in patch.splitlines(keepends=True):
        body = line.rstrip("\n")
        if body.startswith("diff --git "):
            m = _HEADER.match(body)
            if m:
                q1, p1, q2, p2 = m.groups()
                body = f"diff --git {q1}a/{p1}{q1} {q2}b/{p2}{q2}"
        elif body.startswith(("--- ", "+++ ")):
            body = _FILE_LINE.sub(lambda m: f"{m.group(1)} {m.group(2)}{m.group(3)}/", body, count=1)
        out.append(body + line[len(line.rstrip("\n")):])
    return "".join(out)
