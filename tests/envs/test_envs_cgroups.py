"""cgroups: v2 against a fake cgroup filesystem, v1 for real (root), and honest 'unavailable' reports."""
from __future__ import annotations

import os
import subprocess

import pytest

from _envs_common import assert_no_leftovers, envs_state, needs_bwrap, needs_root, repo_env  # noqa: F401
from c2jax.envs import cgroups, start
from c2jax.envs.limits import Limits


def _fake_v2(tmp_path, controllers=("memory", "pids", "cpu")):
    root = tmp_path / "cgroup2"
    caller = root / "user.slice" / "me"
    caller.mkdir(parents=True)
    (root / "cgroup.controllers").write_text(" ".join(controllers) + "\n")
    (caller / "cgroup.subtree_control").write_text("")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(f"30 1 0:26 / {root} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n")
    self_cgroup = tmp_path / "self_cgroup"
    self_cgroup.write_text("0::/user.slice/me\n")
    return root, caller, cgroups.Mounts.detect(str(mountinfo), str(self_cgroup))


def test_v2_on_fake_filesystem(tmp_path):
    root, caller, mounts = _fake_v2(tmp_path)
    assert mounts.v2 == str(root) and mounts.v1 == {} and mounts.v2_controllers == {"memory", "pids", "cpu"}
    limits = Limits(memory_bytes=1 << 30, pids=64, cpus=0.5)
    cg = cgroups.create("sb1", limits, mounts)
    assert isinstance(cg, cgroups.CgroupV2)
    d = caller / cgroups.PREFIX / "sb1"  # nested under the caller's own cgroup
    assert cg.paths == [str(d)]
    assert (d / "memory.max").read_text() == str(1 << 30)
    assert (d / "pids.max").read_text() == "64"
    assert (d / "cpu.max").read_text() == "50000 100000"
    assert all(v == "enforced (cgroup v2)" for v in cg.report.values()), cg.report
    assert (caller / "cgroup.subtree_control").read_text().startswith("+")  # delegation written
    assert cg.procs_files() == [str(d / "cgroup.procs")]
    (d / "memory.events").write_text("low 0\nhigh 0\nmax 5\noom 2\noom_kill 2\n")
    (d / "pids.events").write_text("max 3\n")
    (d / "cpu.stat").write_text("usage_usec 1500000\nuser_usec 1000000\n")
    (d / "memory.peak").write_text("12345\n")
    (d / "cgroup.procs").write_text("")
    assert (cg.oom_kills(), cg.pids_limit_hits(), cg.cpu_seconds(), cg.memory_peak()) == (2, 3, 1.5, 12345)
    assert cg.kill_all(timeout=0.1) and cg.pids() == set()
    # kill_all SIGKILLs every listed pid (here a real process the fake file lists).
    victim = subprocess.Popen(["sleep", "30"])
    (d / "cgroup.procs").write_text(f"{victim.pid}\n")
    cg.kill_all(timeout=0.2)
    assert victim.wait(5) == -9
    assert cg.freeze(True) is False  # no cgroup.freeze file in the fake: reported, not faked
    for f in d.iterdir():
        f.unlink()
    cg.remove()
    assert not d.exists()


def test_v2_without_delegation_reports_unavailable(tmp_path):
    _, caller, mounts = _fake_v2(tmp_path, controllers=("memory", "pids"))
    (caller / "cgroup.subtree_control").unlink()
    (caller / "cgroup.subtree_control").mkdir()  # writes now fail, as without delegation
    cg = cgroups.create("sb2", Limits(), mounts)
    assert cg.report["cpus"].startswith("unavailable")
    assert cg.report["memory_bytes"].startswith("unavailable") and cg.report["pids"].startswith("unavailable")


def test_no_controllers_reports_every_limit_unavailable():
    cg = cgroups.create("x", Limits(), cgroups.Mounts(v1={}, v2=None, v2_controllers=set(), self_paths={}))
    assert isinstance(cg, cgroups.NoCgroup)
    assert set(cg.report) == {"memory_bytes", "pids", "cpus"}
    assert all(v.startswith("unavailable") for v in cg.report.values())


def test_mountinfo_parsing_of_hybrid_v1(tmp_path):
    mi = tmp_path / "mountinfo"
    mi.write_text(
        "40 30 0:35 / /sys/fs/cgroup/memory rw,relatime shared:1 - cgroup cgroup rw,memory\n"
        "41 30 0:36 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
        "42 30 0:37 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
        "43 30 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n")
    sc = tmp_path / "cgroup"
    sc.write_text("4:memory:/job/1\n3:cpu,cpuacct:/\n2:pids:/job/1\n0::/\n")
    m = cgroups.Mounts.detect(str(mi), str(sc))
    assert m.v1 == {"memory": "/sys/fs/cgroup/memory", "cpu": "/sys/fs/cgroup/cpu,cpuacct",
                    "cpuacct": "/sys/fs/cgroup/cpu,cpuacct", "pids": "/sys/fs/cgroup/pids"}
    assert m.self_paths["memory"] == "/job/1" and m.self_paths["cpuacct"] == "/"


@needs_root
def test_v1_for_real_nests_limits_and_kills():
    mounts = cgroups.Mounts.detect()
    if not mounts.v1.get("memory") or not mounts.v1.get("pids"):
        pytest.skip("this machine has no cgroup v1 memory+pids hierarchies")
    cg = cgroups.create(f"test-{os.getpid()}", Limits(memory_bytes=64 << 20, pids=16), mounts)
    try:
        assert isinstance(cg, cgroups.CgroupV1)
        mem = cg.dirs["memory"]
        caller = mounts.self_paths.get("memory", "/").lstrip("/")
        assert mem == os.path.join(mounts.v1["memory"], caller, cgroups.PREFIX, f"test-{os.getpid()}")
        assert int(open(os.path.join(mem, "memory.limit_in_bytes")).read()) == 64 << 20
        assert open(os.path.join(cg.dirs["pids"], "pids.max")).read().strip() == "16"
        joins = " && ".join(f"echo $$ > {p}" for p in cg.procs_files())
        p = subprocess.Popen(["sh", "-c", f"{joins} && exec sleep 30"])
        for _ in range(200):
            if p.pid in cg.pids():
                break
            subprocess.run(["sleep", "0.01"])
        assert p.pid in cg.pids()
        assert cg.kill_all() and p.wait(5) == -9
    finally:
        cg.remove()
    assert all(not os.path.exists(path) for path in cg.paths)


@needs_bwrap
def test_sandbox_without_cgroups_reports_and_still_contains(repo_env, monkeypatch):
    """Where no controller is usable, limits are reported unavailable and close() still kills all."""
    from c2jax.envs import sandbox as sandbox_mod

    monkeypatch.setattr(sandbox_mod.cgroups, "create",
                        lambda name, limits, mounts=None: cgroups.NoCgroup("test: no controllers"))
    _, env = repo_env
    box = start(env)
    assert box.limits_report["memory_bytes"] == "unavailable: test: no controllers"
    box.exec("setsid sleep 100 >/dev/null 2>&1 &")
    assert len(box.host_pids()) >= 2  # found by scanning for the sandbox's pid namespace
    r = box.exec("sleep 30", timeout=0.3)
    assert r.killed_reason == "timeout"
    box.close()
    assert_no_leftovers(box)
