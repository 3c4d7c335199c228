"""The overlay side of a sandbox: freezing it for a consistent copy (`Frozen`) and writing its
changes as a new read-only layer (`copy_layer`, used by `Sandbox.snapshot` / `fork` / `derive_env`).
"""
from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING

from c2jax.envs import fsops, images

if TYPE_CHECKING:
    from c2jax.envs.sandbox import Sandbox


class Frozen:
    """Context manager: stop every process of the sandbox (cgroup freezer) for a consistent copy."""

    def __init__(self, sb: Sandbox) -> None:
        self.sb, self.done = sb, False

    def __enter__(self):
        try:
            self.done = self.sb._cg.freeze(True)
        except OSError:
            self.done = False
        return self

    def __exit__(self, *exc):
        if self.done:
            self.sb._cg.freeze(False)


def copy_layer(upper: str, root_fd: int, dst: str) -> None:
    """Write the sandbox's changes as a new overlay layer at `dst`.

    The *structure* (which names changed, whiteouts for deletions, opaque directories, modes)
    comes from the upper dir's metadata; file *contents* and link targets are read through the
    merged /workspace view with the escape-proof file API, never from the mounted upper dir.
    Called while the sandbox is frozen, so both agree. FIFOs are recreated; sockets are skipped
    (they mean nothing once their process is gone).
    """
    os.mkdir(dst, 0o755)

    def walk(rel: str) -> None:
        src_dir = os.path.join(upper, rel)
        for name in sorted(os.listdir(src_dir)):
            r = f"{rel}/{name}" if rel else name
            src, out = os.path.join(upper, r), os.path.join(dst, r)
            st = os.lstat(src)
            if images.is_whiteout(st):
                os.mknod(out, stat.S_IFCHR | 0o000, os.makedev(0, 0))
            elif stat.S_ISDIR(st.st_mode):
                os.mkdir(out)
                os.chmod(out, stat.S_IMODE(st.st_mode))
                if images.is_opaque(src):
                    os.setxattr(out, "user.overlay.opaque", b"y", follow_symlinks=False)
                walk(r)
            elif stat.S_ISLNK(st.st_mode):
                head, _, leaf = r.rpartition("/")
                dfd = fsops.openat2(root_fd, head or ".", os.O_PATH | os.O_DIRECTORY)
                try:
                    os.symlink(os.readlink(leaf, dir_fd=dfd), out)
                finally:
                    os.close(dfd)
            elif stat.S_ISREG(st.st_mode):
                with open(out, "wb") as f:
                    f.write(fsops.read_bytes(root_fd, r))
                os.chmod(out, stat.S_IMODE(st.st_mode))
            elif stat.S_ISFIFO(st.st_mode):
                os.mkfifo(out, stat.S_IMODE(st.st_mode))

    walk("")
