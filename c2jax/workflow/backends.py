"""Run sweep cells as subprocesses: a bounded local pool, or Ray tasks, through one interface.

Both backends call `run_command` (the cell's ``run.py`` command line, its log file appended, its
exit status returned); they differ only in who schedules it. `execute(jobs, backend, ...)` yields
``(job_id, returncode)`` as cells finish, so the caller's bookkeeping (done markers, messages) is
the same whichever engine ran them. Ray is optional (``pip install -e '.[ray]'``).
"""
from __future__ import annotations

import concurrent.futures as cf
import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Iterator, Sequence

BACKENDS = ("local", "ray")
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Job:
    """One subprocess: ``argv`` run in ``cwd`` with stdout+stderr appended to ``log_path``."""

    job_id: str
    argv: tuple[str, ...]
    cwd: str
    log_path: str
    env: tuple[tuple[str, str], ...] = ()


def _die_with_parent() -> None:
    """In the child, before exec: get SIGKILL when the launching thread dies (Linux), so a killed
    sweep leaves no orphan still writing into a cell the rerun is about to redo."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except OSError:
            pass


def run_command(argv: Sequence[str], cwd: str, log_path: str, env: Sequence[tuple[str, str]] = ()) -> int:
    """Run one cell's command to completion; its output is appended to ``log_path``; returns its exit status."""
    os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
    full_env = {**os.environ, **dict(env)}
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} $ {' '.join(argv)}\n")
        log.flush()
        proc = subprocess.run(list(argv), cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env=full_env,
                              preexec_fn=_die_with_parent, check=False)
        log.write(f"=== exit status {proc.returncode}\n")
    return proc.returncode


def _execute_local(jobs: Sequence[Job], max_parallel: int) -> Iterator[tuple[str, int]]:
    with cf.ThreadPoolExecutor(max_workers=max_parallel) as pool:
        futures = {pool.submit(run_command, j.argv, j.cwd, j.log_path, j.env): j.job_id for j in jobs}
        for fut in cf.as_completed(futures):
            yield futures[fut], fut.result()


def _execute_ray(jobs: Sequence[Job], max_parallel: int, address: str | None) -> Iterator[tuple[str, int]]:
    try:
        import ray
    except ImportError as e:
        raise RuntimeError("--backend ray needs ray: pip install -e '.[ray]'") from e
    started = False
    if not ray.is_initialized():
        if address:
            ray.init(address=address, log_to_driver=False)
        else:  # a private single-node cluster on this machine, bound to 127.0.0.1
            ray.init(num_cpus=max_parallel, include_dashboard=False, _node_ip_address="127.0.0.1",
                     log_to_driver=False)
        started = True
    try:
        remote = ray.remote(num_cpus=1, max_retries=0)(run_command)
        pending = list(jobs)
        in_flight: dict = {}
        while pending or in_flight:
            while pending and len(in_flight) < max_parallel:
                j = pending.pop(0)
                in_flight[remote.remote(j.argv, j.cwd, j.log_path, j.env)] = j.job_id
            ready, _ = ray.wait(list(in_flight), num_returns=1)
            for ref in ready:
                job_id = in_flight.pop(ref)
                try:
                    rc = int(ray.get(ref))
                except Exception as e:  # the task itself died (worker lost): report like a crash
                    print(f"ray task for {job_id} failed: {e}", file=sys.stderr)
                    rc = -1
                yield job_id, rc
    finally:
        if started:
            ray.shutdown()


def execute(jobs: Sequence[Job], backend: str = "local", max_parallel: int = 1,
            ray_address: str | None = None) -> Iterator[tuple[str, int]]:
    """Run ``jobs`` at most ``max_parallel`` at a time; yield ``(job_id, returncode)`` as each finishes."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if max_parallel < 1:
        raise ValueError(f"max_parallel must be >= 1, got {max_parallel}")
    if not jobs:
        return iter(())
    if backend == "local":
        return _execute_local(jobs, max_parallel)
    return _execute_ray(jobs, max_parallel, ray_address)
