"""SandboxPool: concurrency cap, backpressure, warm pool, health checks, reaping, metrics."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from _envs_common import assert_no_leftovers, envs_state, needs_bwrap, repo_env  # noqa: F401
from c2jax.envs import PoolFull
from c2jax.envs.pool import SandboxPool
from c2jax.envs.sandbox import flush_cleanup
from c2jax.envs.state import sandboxes_dir

pytestmark = needs_bwrap


def test_cap_queue_backpressure_and_metrics(repo_env):
    _, env = repo_env
    with SandboxPool(max_concurrency=2, max_queue=1) as pool:
        a, b = pool.acquire(env), pool.acquire(env)
        assert pool.metrics()["active"] == 2
        with pytest.raises(PoolFull):
            pool.acquire(env, timeout=0.2)  # one waiter allowed, but no slot frees in time
        got = []
        waiter = threading.Thread(target=lambda: got.append(pool.acquire(env, timeout=10)))
        waiter.start()
        time.sleep(0.2)
        assert pool.metrics()["queued"] == 1
        with pytest.raises(PoolFull):
            pool.acquire(env, timeout=10)  # the queue is full: refused at once
        a.close()
        waiter.join(10)
        assert len(got) == 1 and got[0].exec("echo hi").stdout == "hi\n"
        assert b.exec("sleep 5", timeout=0.2).killed_reason == "timeout"
        got[0].close()
        b.close()
        m = pool.metrics()
        assert m["active"] == 0 and m["started"] == 3 and m["start_latency_p50_s"] > 0
        assert m["failures"]["killed:timeout"] == 1 and m["failures"]["queue_timeout"] == 1
        assert m["failures"]["pool_full"] == 1


def test_concurrent_sessions_never_exceed_the_cap(repo_env):
    _, env = repo_env
    peak, lock, results = [0], threading.Lock(), []
    with SandboxPool(max_concurrency=2, max_queue=16) as pool:
        def work(i):
            with pool.session(env) as sb:
                with lock:
                    peak[0] = max(peak[0], pool.metrics()["active"])
                results.append(sb.exec(f"sleep 0.1; echo {i}").stdout.strip())

        threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert sorted(results) == [str(i) for i in range(6)] and peak[0] <= 2
    flush_cleanup()
    assert os.listdir(sandboxes_dir()) == []


def test_warm_pool_and_health_check(repo_env):
    _, env = repo_env
    with SandboxPool(max_concurrency=2, warm=2, warm_env=env, health_interval_s=3600) as pool:
        assert pool.wait_warm(30)
        warm_ids = {sb.id for sb in pool._warm}
        with pool.session(env) as sb:
            assert sb.id in warm_ids and sb.exec("echo warm").stdout == "warm\n"
            sb.write_file("f.txt", "forked")
            with sb.fork() as child:  # a pooled fork holds the second slot
                assert child.read_file("f.txt") == "forked" and pool.metrics()["active"] == 2
                with pytest.raises(PoolFull):
                    sb.fork(timeout=0.1)
        with pool.session(env, pids=100) as sb:  # different limits: started fresh
            assert sb.id not in warm_ids
        assert pool.wait_warm(30)
        victim = pool._warm[0]
        os.kill(victim._child_pid, 9)  # a warm sandbox dies behind the pool's back
        time.sleep(0.2)
        report = pool.health_check()
        assert report["removed"] == 1 and pool.metrics()["failures"]["health_check"] == 1
        assert pool.wait_warm(30)
    flush_cleanup()
    assert os.listdir(sandboxes_dir()) == []


def test_pools_in_two_processes_never_reap_each_other(repo_env):
    _, env = repo_env
    child_code = textwrap.dedent(f"""
        import sys
        from c2jax.envs.pool import SandboxPool
        pool = SandboxPool(max_concurrency=1)
        sb = pool.acquire({env!r})
        print(sb.id, flush=True)
        sys.stdin.readline()
        print(sb.exec("echo still-here").stdout.strip(), flush=True)
        sb.close(); pool.close()
    """)
    child = subprocess.Popen([sys.executable, "-c", child_code], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        child_sb = child.stdout.readline().strip()
        assert child_sb
        # A stale sandbox of a dead owner: this pool must reap it, and only it.
        stale = os.path.join(sandboxes_dir(), "999999999-0-dead")
        os.makedirs(os.path.join(stale, "rw"))
        with open(os.path.join(stale, "owner.json"), "w") as f:
            json.dump({"owner": {"pid": 999999999, "start": 1}, "cgroups": []}, f)
        with SandboxPool(max_concurrency=1) as pool:
            assert "999999999-0-dead" in pool.reaped and child_sb not in pool.reaped
            assert pool.metrics()["reaped_at_start"] >= 1
        assert not os.path.exists(stale)
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "still-here"
        assert child.wait(30) == 0
    finally:
        if child.poll() is None:
            child.kill()
