"""Ray backend against a local 2-CPU Ray bound to 127.0.0.1 (run with `pytest -m ray`)."""
from __future__ import annotations

import os

import pytest

from _envs_common import assert_no_leftovers, envs_state, needs_bwrap, repo_env  # noqa: F401
from c2jax.envs import ExecResult, SandboxError
from _paths import REPO_ROOT  # noqa: E402

pytestmark = [pytest.mark.ray, needs_bwrap]
ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray():
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    repo_root = REPO_ROOT
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": repo_root, "RAY_USAGE_STATS_ENABLED": "0"}})
    yield
    ray.shutdown()


def test_ray_pool_same_interface(local_ray, repo_env, tmp_path):
    from c2jax.envs.ray_backend import RayPool

    repo, env = repo_env
    with RayPool(num_actors=2, per_actor_concurrency=2, warm=1, warm_env=env) as pool:
        assert pool.build_env(repo) == env  # content-hashed: the actors reuse the build
        boxes = [pool.start(env) for _ in range(3)]
        assert len({id(b._actor) for b in boxes}) == 2  # spread over both actors
        sb = boxes[0]
        r = sb.exec("echo hi; echo err >&2; exit 3")
        assert isinstance(r, ExecResult) and (r.exit_code, r.stdout, r.stderr) == (3, "hi\n", "err\n")
        assert sb.exec("sleep 5", timeout=0.3).killed_reason == "timeout"
        sb.write_file("x/y.txt", "data")
        assert sb.read_file("x/y.txt") == "data" and "x/y.txt" in sb.glob("**/*.txt")
        assert any(e["name"] == "x" for e in sb.list_dir(""))
        assert "+data" in sb.diff()
        p = sb.exec("read l; echo got:$l", background=True)
        p.write_stdin("one\n")
        assert p.wait(10).stdout == "got:one\n"
        sh = sb.shell()
        sh.run("cd pkg && export V=7")
        assert sh.run("pwd; echo $V").stdout == "/workspace/pkg\n7\n"
        for b in boxes[1:]:
            b.close()  # free slots: a fork counts against its actor's cap like any start
        with sb.fork() as child:
            assert child.read_file("x/y.txt") == "data"
        assert sb.limits_report["pids"].startswith(("enforced", "unavailable"))
        with pytest.raises(SandboxError):
            sb._call("nope")  # only the sandbox interface is forwarded
        sb.close()
        with pytest.raises(SandboxError):
            boxes[0].exec("true")
        m = pool.metrics()
        assert len(m) == 2 and all(x["active"] == 0 for x in m)
    from c2jax.envs.state import sandboxes_dir
    import time

    deadline = time.monotonic() + 10
    while os.listdir(sandboxes_dir()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert os.listdir(sandboxes_dir()) == []
