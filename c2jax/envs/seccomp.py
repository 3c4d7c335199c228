"""A seccomp filter for sandboxes: deny kernel interfaces a coding task never needs.

Namespaces, dropped capabilities and no-new-privileges already stop most of these; the filter
removes the rest of the attack surface and one real leak: inside the user namespace the sandbox's
uid maps to the host uid that started it, so without a filter `keyctl` can describe and read that
host user's keyrings. Denied calls fail with EPERM. Calls from a foreign ABI (e.g. 32-bit int 0x80
on x86_64) kill the process, so the filter cannot be bypassed that way.

The BPF program is compiled once per process with libseccomp (ctypes; Debian's libseccomp2) and
handed to bwrap through `--seccomp FD`. Without libseccomp the sandbox still starts and
`limits_report["seccomp"]` says "unavailable".
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os

DENIED = (
    # keyrings: the host user's keys are reachable through the uid mapping
    "keyctl", "add_key", "request_key",
    # kernel attack surface no test suite needs
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "acct",
    "swapon", "swapoff", "reboot", "syslog", "quotactl", "lookup_dcookie", "fanotify_init",
    "open_by_handle_at", "name_to_handle_at",
    # mounts and namespaces (already refused without capabilities; denied outright here)
    "mount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount",
    "fspick", "mount_setattr", "setns", "unshare",
)

SCMP_ACT_ALLOW = 0x7FFF0000


def _act_errno(err: int) -> int:
    return 0x00050000 | (err & 0xFFFF)


@functools.lru_cache(maxsize=1)
def filter_bytes() -> bytes | None:
    """The compiled BPF program (None if libseccomp is not available)."""
    name = ctypes.util.find_library("seccomp")
    if not name:
        return None
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError:
        return None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_rule_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
    if not ctx:
        return None
    try:
        for call in DENIED:
            nr = lib.seccomp_syscall_resolve_name(call.encode())
            if nr < 0:  # not on this architecture
                continue
            if lib.seccomp_rule_add(ctx, _act_errno(errno.EPERM), nr, 0) != 0:
                return None
        fd = os.memfd_create("c2jax-seccomp")
        try:
            if lib.seccomp_export_bpf(ctx, fd) != 0:
                return None
            os.lseek(fd, 0, os.SEEK_SET)
            chunks = []
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)
    finally:
        lib.seccomp_release(ctx)


def filter_fd() -> int | None:
    """A readable fd holding the BPF program (the caller passes it to bwrap, then closes it)."""
    data = filter_bytes()
    if data is None:
        return None
    r, w = os.pipe()
    try:
        os.write(w, data)  # a few hundred bytes: fits the pipe buffer
    finally:
        os.close(w)
    return r
