"""Checkpoints: Orbax `CheckpointManager` with async saves, keep-N, integrity manifests and a
SIGTERM guard, so a run killed at any point resumes exactly.

A checkpoint at step ``s`` holds three items:

* ``state``  - the train state tree (``step``, ``params``, ``opt_state``) via ``StandardSave``;
* ``loader`` - the data loader's JSON state (position, rng, per-source cursors), so the restarted
  run reads exactly the batches the killed run would have read next;
* ``meta``   - JSON: stage name, config hash, tokens seen, wall time so far.

Integrity: once a save has finished (the next save, or `close`), a manifest with the size and
SHA-256 of every file in the step directory is written to ``<dir>/manifests/<step>.json``.
`restore_latest` walks the steps newest first; a step whose files do not match its manifest, or
that Orbax cannot read, is moved to ``<dir>.corrupt/<step>`` (never deleted) with a warning, and
the previous step is used. A step without a manifest (killed between the save finishing and the
manifest) is accepted only if Orbax restores it without error.

`PreemptionGuard` turns SIGTERM/SIGINT into a flag the train loop polls after each step, so the
loop saves a checkpoint, waits for it, and exits cleanly.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import time
import warnings
from typing import Any, Optional

import jax
import orbax.checkpoint as ocp

from c2jax.atomic import atomic_write_json

log = logging.getLogger(__name__)


class CheckpointCorruptWarning(UserWarning):
    """A checkpoint failed its integrity check or could not be read; an older one is used."""


def _file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def directory_manifest(root: str) -> dict[str, list]:
    """{relative path: [size, sha256]} of every file under ``root``."""
    out: dict[str, list] = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            p = os.path.join(dirpath, name)
            out[os.path.relpath(p, root)] = [os.path.getsize(p), _file_digest(p)]
    return out


class Checkpointer:
    """Save/restore train state + loader state with Orbax; see the module docstring."""

    def __init__(self, directory: str, *, keep: int = 3, async_save: bool = True):
        self.directory = os.path.abspath(directory)
        self.manifest_dir = os.path.join(self.directory, "manifests")
        os.makedirs(self.manifest_dir, exist_ok=True)
        self.keep = max(int(keep), 1)
        opts = ocp.CheckpointManagerOptions(max_to_keep=self.keep, create=True,
                                            enable_async_checkpointing=async_save)
        self._mngr = ocp.CheckpointManager(self.directory, options=opts,
                                           item_names=("state", "loader", "meta"))
        self._pending: list[int] = []

    # ---- saving ----------------------------------------------------------------------------------
    def _step_dir(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def _finalize_pending(self) -> None:
        """Wait for in-flight saves, then write manifests for them and prune stale manifests."""
        if self._pending:
            self._mngr.wait_until_finished()
        # Multi-host: every process shares the directory; only process 0 writes manifests and
        # moves files (two writers would race on the same temporary manifest file).
        primary = jax.process_index() == 0
        for step in (self._pending if primary else ()):
            d = self._step_dir(step)
            if os.path.isdir(d):
                atomic_write_json(os.path.join(self.manifest_dir, f"{step}.json"), directory_manifest(d))
        self._pending = []
        live = {str(s) for s in self._mngr.all_steps()}
        for name in (os.listdir(self.manifest_dir) if primary else ()):
            if name.endswith(".json") and name[:-5] not in live:
                os.remove(os.path.join(self.manifest_dir, name))

    def save(self, step: int, state_tree: Any, loader_state: Optional[dict] = None,
             meta: Optional[dict] = None) -> None:
        """Start an async save of ``state_tree`` at ``step`` (returns once arrays are copied)."""
        self._finalize_pending()
        if step in self._mngr.all_steps():
            return
        args = ocp.args.Composite(state=ocp.args.StandardSave(state_tree),
                                  loader=ocp.args.JsonSave(loader_state or {}),
                                  meta=ocp.args.JsonSave(meta or {}))
        self._mngr.save(step, args=args, force=True)
        self._pending.append(step)

    def wait(self) -> None:
        self._finalize_pending()

    def close(self) -> None:
        self._finalize_pending()
        self._mngr.close()

    # ---- restoring -------------------------------------------------------------------------------
    def all_steps(self) -> list[int]:
        return sorted(self._mngr.all_steps())

    def _verify(self, step: int) -> Optional[str]:
        """None if the step's files match its manifest (or there is none); else what is wrong."""
        mpath = os.path.join(self.manifest_dir, f"{step}.json")
        if not os.path.exists(mpath):
            return None
        try:
            with open(mpath) as f:
                want = json.load(f)
        except (OSError, ValueError) as e:
            return f"unreadable manifest ({e})"
        d = self._step_dir(step)
        for rel, (size, digest) in want.items():
            p = os.path.join(d, rel)
            if not os.path.exists(p):
                return f"missing file {rel}"
            if os.path.getsize(p) != size:
                return f"file {rel} has {os.path.getsize(p)} bytes, manifest says {size} (truncated?)"
            if _file_digest(p) != digest:
                return f"file {rel} does not match its SHA-256 in the manifest"
        return None

    def _quarantine(self, step: int, why: str) -> None:
        dest_root = self.directory + ".corrupt"
        os.makedirs(dest_root, exist_ok=True)
        dest = os.path.join(dest_root, f"{step}-{int(time.time())}")
        warnings.warn(f"checkpoint {self._step_dir(step)} is unusable ({why}); moved to {dest}, "
                      f"falling back to the previous checkpoint", CheckpointCorruptWarning, stacklevel=3)
        src = self._step_dir(step)
        if jax.process_index() != 0:  # multi-host: process 0 moves the files
            self._mngr.reload()
            return
        if os.path.exists(src):
            shutil.move(src, dest)
        m = os.path.join(self.manifest_dir, f"{step}.json")
        if os.path.exists(m):
            shutil.move(m, os.path.join(dest_root, f"{step}-{int(time.time())}.manifest.json"))
        self._mngr.reload()

    def restore_latest(self, abstract_state: Any) -> Optional[tuple[int, Any, dict, dict]]:
        """Newest usable checkpoint as ``(step, state_tree, loader_state, meta)``, or None.

        ``abstract_state``: tree of arrays or `jax.ShapeDtypeStruct` (with shardings, under a mesh)
        giving the structure, shapes and dtypes to restore into.
        """
        self._finalize_pending()
        abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, abstract_state)
        for step in sorted(self._mngr.all_steps(), reverse=True):
            why = self._verify(step)
            if why is None:
                try:
                    r = self._mngr.restore(step, args=ocp.args.Composite(
                        state=ocp.args.StandardRestore(abstract), loader=ocp.args.JsonRestore(),
                        meta=ocp.args.JsonRestore()))
                    return step, r["state"], dict(r["loader"] or {}), dict(r["meta"] or {})
                except Exception as e:  # noqa: BLE001 - any read failure means "use an older one"
                    why = f"restore failed: {type(e).__name__}: {str(e)[:300]}"
            self._quarantine(step, why)
        return None


    def restore_params(self) -> Optional[tuple[int, Any]]:
        """``(step, params)`` of the newest usable checkpoint, restored as saved (numpy arrays),
        without needing the optimizer state's structure (the next stage may use another optimizer)."""
        self._finalize_pending()
        for step in sorted(self._mngr.all_steps(), reverse=True):
            why = self._verify(step)
            if why is None:
                try:
                    r = self._mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
                    return step, r["state"]["params"]
                except Exception as e:  # noqa: BLE001
                    why = f"restore failed: {type(e).__name__}: {str(e)[:300]}"
            self._quarantine(step, why)
        return None


class PreemptionGuard:
    """Context manager: SIGTERM/SIGINT set ``.requested`` instead of killing the process.

    The train loop checks ``guard.requested`` after every step; when set it saves, waits for the
    save to finish, and exits. A second signal while saving falls through to the default action.
    """

    def __init__(self, signals=(signal.SIGTERM, signal.SIGINT)):
        self.signals = signals
        self.requested = False
        self._old: dict = {}

    def _handler(self, signum, frame):
        if self.requested:  # second signal: give up
            signal.signal(signum, self._old.get(signum, signal.SIG_DFL))
            os.kill(os.getpid(), signum)
            return
        self.requested = True
        log.warning("received signal %d: saving a checkpoint and stopping", signum)

    def __enter__(self) -> "PreemptionGuard":
        try:
            for s in self.signals:
                self._old[s] = signal.signal(s, self._handler)
        except ValueError:  # not the main thread: signals cannot be caught here
            self._old = {}
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
