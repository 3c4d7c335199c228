"""Reversible task ids for tasks that come from other formats.

A c2jax task id allows ``[A-Za-z0-9_.:+-]`` (`c2jax.envs.tasks`). SWE-bench instance ids and Harbor
package names (``org/name``) may hold other characters, ``/`` above all. `task_id_for` keeps every
``[A-Za-z0-9_.:-]`` character and writes any other one (``+`` included) as ``+HH`` per UTF-8 byte,
so `original_id` recovers the exact original (what the official harnesses look tasks up by) and two
distinct originals never share a task id (the old ``/`` -> ``__`` rewrite made ``a/b`` and ``a__b``
collide).
"""
from __future__ import annotations

_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-")


def task_id_for(original: str) -> str:
    """The c2jax task id of an external id (identical when it only has ``[A-Za-z0-9_.:-]``)."""
    return "".join(c if c in _PLAIN else "".join(f"+{b:02X}" for b in c.encode("utf-8")) for c in original)


def original_id(task_id: str) -> str:
    """Inverse of `task_id_for`."""
    raw, i = bytearray(), 0
    while i < len(task_id):
        if task_id[i] == "+":
            raw.append(int(task_id[i + 1:i + 3], 16))
            i += 3
        else:
            raw += task_id[i].encode()
            i += 1
    return raw.decode("utf-8")
