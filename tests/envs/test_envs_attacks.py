"""Attacks from inside a sandbox: each must be contained, the host unchanged, nothing left running.

Every attack is capped on the attacker's side (a bounded loop, a byte count a few times the limit,
`timeout`) and by a host-side `timeout=` on exec, so a broken limit fails the test instead of
hurting the machine. Network tests only use servers these tests start on the host's 127.0.0.1.
"""
from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from _envs_common import (IS_ROOT, assert_no_leftovers, envs_state, needs_bwrap, needs_root,  # noqa: F401
                          repo_env, tree_snapshot)
from c2jax.envs import SandboxError, UnsafePath, start
from c2jax.envs import state as envs_state_mod
from c2jax.envs.images import load, tree_digest

pytestmark = needs_bwrap

PY = "/env/bin/python"


def py(code: str) -> list[str]:
    return [PY, "-c", textwrap.dedent(code)]


@pytest.fixture
def sb(repo_env):
    _, env = repo_env
    box = start(env, timeout_s=20)
    yield box
    box.close()
    assert_no_leftovers(box)


def test_host_loopback_server_unreachable(sb):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(0.1)
    port = srv.getsockname()[1]
    r = sb.exec(py(f"""
        import socket
        for host in ("127.0.0.1", "localhost", "10.0.2.2"):
            s = socket.socket(); s.settimeout(2)
            try:
                s.connect((host, {port})); print("CONNECTED", host)
            except OSError as e:
                print("blocked", host, e.errno)
    """), timeout=20)
    assert "CONNECTED" not in r.stdout and r.stdout.count("blocked") == 3
    with pytest.raises(socket.timeout):
        srv.accept()
    host = socket.create_connection(("127.0.0.1", port), timeout=2)  # positive control: the host gets in
    conn, _ = srv.accept()
    conn.close(), host.close(), srv.close()
    assert sb.exec("cat /proc/net/dev | tail -n +3 | cut -d: -f1").stdout.split() == ["lo"]


def test_name_resolution_reaches_no_resolver(sb):
    got = []
    stub = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    stub.bind(("127.0.0.1", 0))
    stub.settimeout(0.05)
    port = stub.getsockname()[1]
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                got.append(stub.recvfrom(512))
            except socket.timeout:
                pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.sendto(b"host-probe", ("127.0.0.1", port))  # positive control: the stub hears the host
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        time.sleep(0.01)
    probe.close()
    assert [g[0] for g in got] == [b"host-probe"], got
    got.clear()
    r = sb.exec(py(f"""
        import socket
        try:
            print("RESOLVED", socket.getaddrinfo("c2jax-test.example", 80))
        except OSError as e:
            print("noresolve", e)
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1)
        try:
            s.sendto(b"\\x12\\x34" + b"\\x00" * 10, ("127.0.0.1", {port})); print("RECV", s.recv(512))
        except OSError as e:
            print("noreply", e)
    """), timeout=20)
    stop.set()
    t.join()
    stub.close()
    assert "RESOLVED" not in r.stdout and "RECV" not in r.stdout and "noresolve" in r.stdout
    assert got == []


def test_host_unix_sockets_and_inherited_fds(sb, repo_env, tmp_path):
    path = str(tmp_path / "host.sock")
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(path)
    unix.listen(1)
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(b"\0c2jax-test-abstract")
    abstract.listen(1)
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET")
    leaked = os.open(secret, os.O_RDONLY)
    os.set_inheritable(leaked, True)  # even an inheritable fd of the parent must not get in
    try:
        _, env = repo_env
        with start(env) as box:
            r = box.exec(py(f"""
                import os, socket
                for addr in ({path!r}, b"\\0c2jax-test-abstract"):
                    s = socket.socket(socket.AF_UNIX)
                    try:
                        s.connect(addr); print("CONNECTED")
                    except OSError as e:
                        print("blocked", e.errno)
                for pid in os.listdir("/proc"):
                    if pid.isdigit():
                        try:
                            for fd in os.listdir(f"/proc/{{pid}}/fd"):
                                print("fd", pid, fd, os.readlink(f"/proc/{{pid}}/fd/{{fd}}"))
                        except OSError:
                            pass
            """))
            assert "CONNECTED" not in r.stdout and r.stdout.count("blocked") == 2
            targets = [line.split(" ", 3)[3] for line in r.stdout.splitlines() if line.startswith("fd ")]
            assert targets and "secret" not in r.stdout and "host.sock" not in r.stdout
            allowed = ("/dev/null", "pipe:", "/run/c2jax/", "anon_inode:", "/proc/", "socket:")
            assert all(t.startswith(allowed) for t in targets), targets
            # A command starts with exactly stdin, stdout and stderr (fd 3 is ls's own directory).
            fds = box.exec("ls /proc/self/fd").stdout.split()
            assert fds == ["0", "1", "2", "3"], fds
        assert_no_leftovers(box)
        for addr in (path, b"\0c2jax-test-abstract"):  # positive control: both sockets accept the host
            c = socket.socket(socket.AF_UNIX)
            c.connect(addr)
            c.close()
    finally:
        os.close(leaked)
        unix.close()
        abstract.close()


def test_no_writes_outside_workspace(sb):
    targets = ["/usr/pwned", "/etc/pwned", "/pwned", "/env/pwned", "/run/c2jax/pwned", "/proc/pwned",
               "/usr/bin/sh", "/etc/passwd"]
    for t in targets:
        r = sb.exec(f"echo x > {t}", timeout=10)
        assert r.exit_code != 0, t
    assert not os.path.exists("/usr/pwned") and not os.path.exists("/pwned")
    assert sb.exec("echo ok > /tmp/fine && cat /tmp/fine").stdout == "ok\n"


def test_host_secrets_are_invisible(repo_env):
    os.environ["C2JAX_TEST_SECRET"] = "hunter2-host-secret"
    try:
        _, env = repo_env
        with start(env) as box:
            r = box.exec("env; cat /proc/1/environ /proc/2/environ 2>/dev/null | tr '\\0' '\\n'; "
                         "cat /etc/shadow; ls /root /home /work; ls /etc", timeout=10)
            assert "hunter2" not in r.stdout + r.stderr
            host = subprocess.run(["sh", "-c", "env"], capture_output=True, text=True).stdout
            assert "hunter2" in host  # positive control: the same `env` on the host shows it
            assert "root:" not in r.stdout  # no /etc/shadow contents
            assert "No such file" in r.stderr
            etc = box.exec("ls /etc").stdout.split()
            assert set(etc) <= {"passwd", "group", "hosts", "nsswitch.conf", "resolv.conf", "hostname",
                                "ld.so.cache", "ld.so.conf", "alternatives", "localtime"}
        assert_no_leftovers(box)
    finally:
        del os.environ["C2JAX_TEST_SECRET"]


def test_symlink_escapes_through_host_file_api(sb, tmp_path):
    outside = tmp_path / "victim.txt"
    outside.write_text("original")
    sb.exec(f"ln -s {outside} abs_link; ln -s ../../../../../../../{outside} rel_link; "
            f"ln -s / rootlink; ln -s {tmp_path} dirlink; ln -s /etc/passwd passwd_link", timeout=10)
    for path in ("abs_link", "rel_link", "passwd_link", "rootlink/etc/passwd", "dirlink/victim.txt"):
        with pytest.raises(UnsafePath):
            sb.read_file(path)
        with pytest.raises(UnsafePath):
            sb.write_file(path, "pwned")
    with pytest.raises(UnsafePath):
        sb.list_dir("rootlink")
    with pytest.raises(UnsafePath):
        sb.write_file("dirlink/new.txt", "pwned")
    assert sb.glob("dirlink/**") == [] and "abs_link" in sb.glob("*")  # glob never descends links
    assert outside.read_text() == "original" and not (tmp_path / "new.txt").exists()


def test_hardlink_and_special_file_escapes(sb, repo_env):
    repo, env = repo_env
    layer = load(env).layers[0]
    before = tree_digest(layer)
    r = sb.exec("ln /etc/passwd h1; ln /env/bin/python h2; ln /usr/bin/sh h3; ls h1 h2 h3", timeout=10)
    assert r.exit_code != 0 and "h1" not in r.stdout
    # A hardlink inside the workspace to a base file, then the host writes through it.
    assert sb.exec("ln README.md hl && mkfifo fifo").ok
    sb.write_file("hl", "changed via host")
    assert sb.read_file("README.md") == "changed via host"
    assert tree_digest(layer) == before  # the base layer is never written
    t0 = time.monotonic()
    with pytest.raises(UnsafePath):
        sb.read_file("fifo")  # would block forever if opened blindly
    with pytest.raises(UnsafePath):
        sb.write_file("fifo", "x")
    assert sb.exec(py("import socket; s=socket.socket(socket.AF_UNIX); s.bind('sock')")).ok
    with pytest.raises(UnsafePath):
        sb.read_file("sock")
    assert time.monotonic() - t0 < 5


def test_other_processes_proc_signals_and_ptrace(sb, repo_env):
    victim = subprocess.Popen(["sleep", "60"])
    try:
        _, env = repo_env
        with start(env) as other:
            other_bg = other.exec("sleep 60", background=True)
            r = sb.exec(py(f"""
                import ctypes, os, signal
                pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
                print("pids", len(pids))
                for target in ({victim.pid}, {os.getpid()}):
                    try:
                        print(open(f"/proc/{{target}}/environ").read()[:20])
                    except OSError as e:
                        print("noproc", e.errno)
                    try:
                        os.kill(target, signal.SIGKILL); print("KILLED")
                    except OSError as e:
                        print("nokill", e.errno)
                import subprocess
                own = subprocess.Popen(["sleep", "60"])
                os.kill(own.pid, signal.SIGKILL); print("own", own.wait())
                libc = ctypes.CDLL(None, use_errno=True)
                for target in ({victim.pid}, 1):
                    rc = libc.ptrace(16, target, 0, 0)  # PTRACE_ATTACH
                    print("ptrace", target, rc, ctypes.get_errno())
            """), timeout=15)
            out = r.stdout
            assert "KILLED" not in out and out.count("nokill") == 2 and out.count("noproc") == 2
            assert "own -9" in out  # positive control: kill works on the sandbox's own processes
            # Host processes do not exist in the sandbox's pid namespace (ESRCH); tracing the
            # sandbox's own processes (gdb, strace) stays possible and confers nothing.
            assert f"ptrace {victim.pid} -1 {errno.ESRCH}" in out
            # kill(-1) reaches every process this uid can see: only the sandbox's own (it may take
            # down its own executor, which is then reported as an infrastructure failure).
            try:
                sb.exec(py("import os, signal; os.kill(-1, signal.SIGKILL)"), timeout=10)
            except SandboxError:
                pass
            assert victim.poll() is None, "a host process was killed from inside a sandbox"
            assert other_bg.poll() is None and other.exec("echo alive").stdout == "alive\n"
            other_bg.kill()
    finally:
        victim.kill()
        victim.wait()


def test_mount_and_namespace_escapes(sb):
    r = sb.exec("mkdir -p /tmp/m; mount -t tmpfs none /tmp/m && echo MOUNTED; "
                "unshare -Ur true && echo USERNS; unshare -m true && echo MNTNS; "
                "grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status; grep NoNewPrivs /proc/self/status",
                timeout=10)
    assert "MOUNTED" not in r.stdout and "USERNS" not in r.stdout and "MNTNS" not in r.stdout
    # Positive control: the attack tools exist and ran; they were refused, not missing.
    assert sb.exec("command -v mount && command -v unshare").ok
    assert "not found" not in r.stderr and r.stderr.count("unshare failed: Operation not permitted") == 2, r.stderr
    assert "must be superuser" in r.stderr or "ermission denied" in r.stderr, r.stderr  # mount refused
    assert "CapEff:\t0000000000000000" in r.stdout and "CapBnd:\t0000000000000000" in r.stdout


def test_base_layer_and_env_cannot_change(repo_env):
    repo, env = repo_env
    image = load(env)
    before = (tree_digest(image.layers[0]), tree_digest(image.venv), tree_snapshot(repo))
    with start(env) as box:
        r = box.exec("rm -rf /workspace/* /workspace/.[!.]* 2>/dev/null; ls -A /workspace | wc -l; "
                     "rm -rf /env/bin/python; echo x > /env/new; chmod 777 /workspace", timeout=20)
        assert r.stdout.split()[0] == "0"
    with start(env) as fresh:
        assert fresh.read_file("README.md") == "demo repo\n"
    assert (tree_digest(image.layers[0]), tree_digest(image.venv), tree_snapshot(repo)) == before


@needs_root
def test_fork_bomb_hits_pids_limit(repo_env):
    _, env = repo_env
    with start(env, pids=64) as box:
        # Capped on the attacker side: a binary tree of depth 7 (at most 255 live shells, ~4x the
        # limit), each leaf sleeping 5 s, under `timeout -s KILL 20`; host-side timeout 30 s.
        bomb = "b() { if [ ${#1} -lt 7 ]; then b x$1 & b x$1 & wait; else sleep 5; fi; }; b"
        r = box.exec(f"timeout -s KILL 20 sh -c '{bomb}'", timeout=30)
        assert r.killed_reason == "pids" and r.duration_s < 10, r
        assert len(box.host_pids()) < 64
        assert box.exec("echo alive").stdout == "alive\n"
    assert_no_leftovers(box)


@needs_root
def test_memory_bomb_is_oom_killed(repo_env):
    _, env = repo_env
    with start(env, memory_bytes=128 << 20) as box:
        # Capped at 4x the limit.
        r = box.exec(py("""
            chunks = []
            for _ in range(512):
                chunks.append(bytearray(1 << 20))
            print("SURVIVED", len(chunks))
        """), timeout=30)
        assert r.killed_reason == "oom" and r.exit_code == 137 and "SURVIVED" not in r.stdout, r
        assert box.exec("echo alive").stdout == "alive\n"
    assert_no_leftovers(box)
    with start(env, memory_bytes=1 << 30) as box:  # positive control: the same program, a larger limit
        r = box.exec(py("chunks = [bytearray(1 << 20) for _ in range(512)]; print('SURVIVED', len(chunks))"),
                     timeout=60)
        assert r.ok and r.stdout.strip() == "SURVIVED 512", r


@needs_root
def test_disk_fill_and_file_size_limits(repo_env):
    _, env = repo_env
    with start(env, disk_bytes=16 << 20, file_size_bytes=8 << 20, tmp_bytes=4 << 20) as box:
        # Capped: 8 x 7 MiB = 56 MiB attempted, 3.5x the 16 MiB quota.
        r = box.exec("for i in 1 2 3 4 5 6 7 8; do head -c 7M /dev/zero > f$i || exit 1; done", timeout=30)
        assert r.killed_reason == "disk" and r.exit_code != 0 and "No space" in r.stderr, r
        assert box.exec("rm -f f*").ok  # the sandbox stays usable and can clean up
        r = box.exec("head -c 16M /dev/zero > /tmp/big", timeout=30)  # 4x the /tmp quota
        assert r.exit_code != 0 and "No space" in r.stderr, r
        r = box.exec("rm /tmp/big; head -c 32M /dev/zero > big", timeout=30)  # 4x the file-size limit
        assert r.killed_reason == "fsize" and r.exit_code == 153, r
        assert int(box.exec("stat -c %s big").stdout) == 8 << 20  # cut exactly at the file-size limit
        # The host holds no more than the quotas: the writable upper dir is a size-capped tmpfs.
        upper = os.path.join(box.dir, "rw", "upper")
        held = sum(os.lstat(os.path.join(d, f)).st_size for d, _, fs in os.walk(upper) for f in fs)
        assert held <= 16 << 20, held
        assert box.exec("head -c 1M /dev/zero > small && echo ok").stdout == "ok\n"
    assert_no_leftovers(box)
    # Positive control: the same writes succeed where the limits are larger, so the limits stopped them.
    with start(env, disk_bytes=96 << 20, file_size_bytes=64 << 20, tmp_bytes=32 << 20) as box:
        r = box.exec("for i in 1 2 3 4 5 6 7 8; do head -c 7M /dev/zero > f$i || exit 1; done; rm f*; "
                     "head -c 16M /dev/zero > /tmp/big && head -c 32M /dev/zero > big && stat -c %s big", timeout=60)
        assert r.ok and r.stdout.split() == [str(32 << 20)], r
    assert_no_leftovers(box)


def test_output_flood_is_truncated_and_killed(repo_env):
    _, env = repo_env
    with start(env, output_bytes=64 << 10, output_kill_bytes=4 << 20) as box:
        r = box.exec("yes flood | head -c 200000000", timeout=30)  # capped at 200 MB
        assert r.killed_reason == "output" and r.stdout_truncated and len(r.stdout) == 64 << 10, \
            (r.killed_reason, r.stdout_truncated, len(r.stdout))
        r = box.exec("head -c 100000 /dev/zero | tr '\\0' e >&2; echo done", timeout=30)
        assert r.stderr_truncated and not r.stdout_truncated and r.stdout == "done\n" and r.killed_reason is None
    assert_no_leftovers(box)


def test_infinite_loop_and_cpu_time(repo_env):
    _, env = repo_env
    with start(env, cpu_s=1) as box:
        t0 = time.monotonic()
        r = box.exec("while :; do :; done", timeout=1.0)
        assert r.killed_reason == "timeout" and time.monotonic() - t0 < 6
        r = box.exec(py("while True: pass"), timeout=30)  # the CPU-seconds rlimit ends it
        assert r.killed_reason == "timeout" and r.duration_s < 20, r
        assert box.exec("echo alive").stdout == "alive\n"
    assert_no_leftovers(box)


def test_setsid_daemon_does_not_outlive_the_sandbox(repo_env):
    _, env = repo_env
    box = start(env)
    r = box.exec("setsid sh -c 'sleep 1000' >/dev/null 2>&1 & "
                 "nohup sh -c 'trap \"\" HUP TERM; sleep 1000' >/dev/null 2>&1 & "
                 "(sh -c 'sleep 1000 &' &) ; echo started", timeout=10)
    assert r.stdout == "started\n"
    time.sleep(0.2)
    inside = box.host_pids()
    assert len(inside) >= 4  # the daemons are running (plus the executor)
    starts = {pid: envs_state_mod.proc_start_time(pid) for pid in inside}
    box.close()
    assert_no_leftovers(box)
    for pid, t0 in starts.items():  # none of those processes exists any more (pid reuse aside)
        assert envs_state_mod.proc_start_time(pid) != t0


def test_stdin_waiters_never_hang(sb):
    r = sb.exec("read x; echo got:$x; cat", timeout=10)
    assert r.stdout == "got:\n" and r.killed_reason is None
    p = sb.exec("read x; echo never", background=True)  # stdin kept open by the host
    r = p.wait(0.5)
    assert r is None
    r = sb.exec("sleep 100 < /dev/tty 2>/dev/null || sleep 100", timeout=0.5)
    assert r.killed_reason == "timeout"
    p.kill()


def test_sandbox_lifetime_limit(repo_env):
    _, env = repo_env
    box = start(env, lifetime_s=1.0)
    r = box.exec("sleep 30", timeout=30)
    assert r.killed_reason == "lifetime" and r.duration_s < 10
    assert not box.alive
    box.close()
    assert_no_leftovers(box)


def test_sigkill_of_parent_leaves_nothing_and_next_start_reaps(repo_env, tmp_path):
    _, env = repo_env
    script = textwrap.dedent(f"""
        import os, sys, time
        from c2jax.envs import start
        sb = start({env!r})
        sb.exec("setsid sh -c 'sleep 1000' >/dev/null 2>&1 &")
        time.sleep(0.2)
        print(sb.id, sb.dir, " ".join(map(str, sorted(sb.host_pids()))), sb._pidns, flush=True)
        time.sleep(600)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        line = child.stdout.readline().split()
        assert line, "child did not start a sandbox"
        sb_id, sb_dir, *rest = line
        pidns = rest[-1]
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        from c2jax.envs.sandbox import pids_in_namespace

        deadline = time.monotonic() + 10
        while pids_in_namespace(pidns) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pids_in_namespace(pidns) == set(), "sandbox processes outlived their SIGKILLed parent"
        assert os.path.isdir(sb_dir)  # state remains until the next start reaps it
        from c2jax.envs import reaper

        reaper.last_reap = False  # as in a fresh process: its first start() reaps
        with start(env) as box:
            assert box.exec("true").ok
        assert not os.path.exists(sb_dir)
        with open("/proc/self/mountinfo") as f:
            assert sb_id not in f.read()
    finally:
        if child.poll() is None:
            child.kill()


def test_reaper_spares_live_owners(repo_env):
    _, env = repo_env
    with start(env) as box:
        assert box.id not in envs_state_mod.reap_orphans()
        assert box.exec("echo alive").stdout == "alive\n"


def test_host_keyrings_and_kernel_attack_surface(sb):
    """The sandbox uid maps to the host uid that started it: without the seccomp filter keyctl could
    reach that user's keyrings. Denied calls fail with EPERM; ordinary work is unaffected."""
    assert sb.limits_report["seccomp"].startswith("enforced")
    host_keyrings = []
    with open("/proc/keys") as f:
        for line in f:
            if " _uid" in line:
                host_keyrings.append(int(line.split()[0], 16))
    r = sb.exec(py(f"""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        buf = ctypes.create_string_buffer(4096)
        for kid in {host_keyrings!r}:
            rc = libc.syscall(250, 6, kid, buf, 4096)   # keyctl(KEYCTL_DESCRIBE, host keyring)
            print("keyctl", rc, ctypes.get_errno())
        print("user-keyring", libc.syscall(250, 0, -4, 0), ctypes.get_errno())
        for name, nr in (("bpf", 321), ("io_uring_setup", 425), ("perf_event_open", 298),
                         ("userfaultfd", 323), ("unshare", 272)):
            print(name, libc.syscall(nr, 0, 0, 0, 0, 0), ctypes.get_errno())
    """), timeout=15)
    lines = r.stdout.splitlines()
    assert lines and all(line.endswith(" -1 1") for line in lines), r  # every call: -1, EPERM
    assert sb.exec("git --version && python -c 'import ssl, sqlite3, subprocess'").ok
