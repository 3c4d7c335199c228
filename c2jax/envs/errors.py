"""Exceptions of the environments platform.

`SandboxError` means the *infrastructure* failed (bwrap missing, sandbox died, state corrupt), never
that a command inside a sandbox failed: a command's failure is an `ExecResult` with a non-zero
`exit_code` and possibly a `killed_reason`. RL code masks samples that hit a `SandboxError`.
"""


class SandboxError(RuntimeError):
    """The sandbox infrastructure failed; the command's own outcome is unknown."""


class SandboxClosed(SandboxError):
    """An operation was attempted on a sandbox that is closed (by `close()`, lifetime or crash)."""


class UnsafePath(PermissionError):
    """A host-side file operation was refused: escape from /workspace, a symlink or a special file.

    This is the caller's (or the agent's) mistake, not an infrastructure failure, so it is a
    `PermissionError` and not a `SandboxError`: the harness turns it into a message to the agent.
    """


class PoolFull(SandboxError):
    """The pool's queue is full (backpressure): retry later or raise the pool's `max_queue`."""
