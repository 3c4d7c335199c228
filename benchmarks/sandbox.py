"""Sandbox speed: start + `exec true` + close latency, pool throughput, overlay vs copy.

    python benchmarks/sandbox.py [--n 100] [--seconds 10] [--repo-mb 1024] [--skip-overlay]

Prints, each against a baseline measured in the same process:
1. median / p99 of start + exec("true") + close, for close(wait=True) (files, mount and cgroups
   removed before returning) and close(wait=False) (every process dead on return; the janitor
   thread removes the rest). Baselines: a bare `bwrap --unshare-all ... true` and a plain `true`.
2. sandboxes per second at the pool's concurrency (default: cores), each doing start + exec true +
   close through `SandboxPool.session`, from that many client threads; and (2b) the latency of
   taking a sandbox from a warm pool (started ahead of a burst), running `true`, releasing it.
3. workspace creation over a ~1 GB repository: start a sandbox and write one file through the
   overlay, against `cp -a` of the same tree plus the same write (what a copy-per-sandbox design
   would pay); teardown (close vs rm -r) reported separately.
Aims (issue 7, 2 cores): median <= 30 ms, >= 30 sandboxes/s, overlay >= 100x faster than a copy.
Uses a private state directory under --workdir (default: a temp dir) and removes it at the end.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def cpu_seconds() -> float:
    """CPU time of this process plus its waited-for children (bwrap and everything it reaped)."""
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def ms(x: float) -> str:
    return f"{1000 * x:7.1f} ms"


def bench_latency(env: str, n: int) -> dict:
    from c2jax.envs import start
    from c2jax.envs.bwrap import bwrap_path
    from c2jax.envs.sandbox import flush_cleanup

    out = {}
    for wait in (True, False):
        start(env).close()  # warm caches
        xs = []
        cpu0 = cpu_seconds()
        for _ in range(n):
            t0 = time.perf_counter()
            sb = start(env)
            r = sb.exec("true")
            sb.close(wait=wait)
            xs.append(time.perf_counter() - t0)
            assert r.exit_code == 0
        flush_cleanup()
        out[f"close(wait={wait})"] = xs
        out[f"cpu per sandbox, close(wait={wait})"] = (cpu_seconds() - cpu0) / n
    bw = [bwrap_path(), "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr",
          "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
          "--proc", "/proc", "--dev", "/dev", "true"]
    for name, argv in (("baseline: bare bwrap true", bw), ("baseline: plain true", ["true"])):
        xs = []
        for _ in range(n):
            t0 = time.perf_counter()
            subprocess.run(argv, check=True)
            xs.append(time.perf_counter() - t0)
        out[name] = xs
    return out


def bench_pool(env: str, seconds: float, concurrency: int) -> tuple[float, dict]:
    from c2jax.envs.pool import SandboxPool
    from c2jax.envs.sandbox import flush_cleanup

    done = [0]
    lock = threading.Lock()
    stop = time.monotonic() + seconds
    with SandboxPool(max_concurrency=concurrency, max_queue=4 * concurrency) as pool:
        def client():
            while time.monotonic() < stop:
                with pool.session(env) as sb:
                    assert sb.exec("true").exit_code == 0
                with lock:
                    done[0] += 1

        t0 = time.perf_counter()
        threads = [threading.Thread(target=client) for _ in range(concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        metrics = pool.metrics()
    flush_cleanup()
    return done[0] / elapsed, metrics


def bench_warm(env: str, n: int, warm: int) -> list[float]:
    """Latency of acquire + exec true + release from a pool that keeps `warm` sandboxes started."""
    from c2jax.envs.pool import SandboxPool
    from c2jax.envs.sandbox import flush_cleanup

    xs = []
    with SandboxPool(max_concurrency=warm, warm=warm, warm_env=env) as pool:
        for _ in range(n):
            pool.wait_warm(30)  # a burst arrives when the pool is full
            t0 = time.perf_counter()
            with pool.session(env) as sb:
                assert sb.exec("true").exit_code == 0
            xs.append(time.perf_counter() - t0)
    flush_cleanup()
    return xs


def make_big_repo(path: str, total_mb: int, file_kb: int = 64) -> tuple[int, int]:
    """A repository of ~total_mb MB: nested directories of incompressible files."""
    n_files = max(1, total_mb * 1024 // file_kb)
    block = os.urandom(file_kb * 1024)
    for i in range(n_files):
        d = os.path.join(path, f"pkg{i // 1000:03d}", f"mod{(i // 50) % 20:02d}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{i:06d}.py"), "wb") as f:
            f.write(i.to_bytes(8, "little") + block[8:])
    return n_files, n_files * file_kb * 1024


def bench_overlay(workdir: str, repo_mb: int) -> dict:
    from c2jax.envs import build_env, start
    from c2jax.envs.images import load
    from c2jax.envs.sandbox import flush_cleanup

    repo = os.path.join(workdir, "bigrepo")
    os.makedirs(repo)
    n_files, size = make_big_repo(repo, repo_mb)
    env = build_env(repo)  # one-time cost, shared by every sandbox over this repository
    layer = load(env).layers[0]
    shutil.rmtree(repo)
    overlay, overlay_close = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        sb = start(env)  # creates the copy-on-write workspace over the 1 GB base layer
        sb.write_file("pkg000/mod00/f000000.py", "edited\n")
        t1 = time.perf_counter()
        assert sb.exec("head -c 6 pkg000/mod00/f000000.py").stdout == "edited"
        t2 = time.perf_counter()
        sb.close()
        overlay.append(t1 - t0)
        overlay_close.append(time.perf_counter() - t2)
    flush_cleanup()
    subprocess.run(["sync"], check=True)
    copies, copy_rm = [], []
    for i in range(2):
        dst = os.path.join(workdir, f"copy{i}")
        t0 = time.perf_counter()
        subprocess.run(["cp", "-a", layer, dst], check=True)
        with open(os.path.join(dst, "pkg000/mod00/f000000.py"), "w") as f:
            f.write("edited\n")
        t1 = time.perf_counter()
        shutil.rmtree(dst)
        copies.append(t1 - t0)
        copy_rm.append(time.perf_counter() - t1)
    return {"files": n_files, "bytes": size, "overlay": overlay, "copy": copies,
            "overlay_close": overlay_close, "copy_rm": copy_rm}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100, help="sequential start+exec+close samples")
    parser.add_argument("--seconds", type=float, default=10.0, help="pool throughput duration")
    parser.add_argument("--concurrency", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repo-mb", type=int, default=1024, help="size of the overlay benchmark repository")
    parser.add_argument("--skip-overlay", action="store_true")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()

    workdir = tempfile.mkdtemp(prefix="c2jax-bench-", dir=args.workdir)
    os.environ["C2JAX_ENVS_DIR"] = os.path.join(workdir, "state")
    try:
        from c2jax.envs import build_env

        small = os.path.join(workdir, "small")
        os.makedirs(small)
        with open(os.path.join(small, "main.py"), "w") as f:
            f.write("print('hello')\n")
        env = build_env(small)
        try:
            load = os.getloadavg()[0]
        except OSError:
            load = float("nan")
        print(f"machine: {os.cpu_count()} cores, load average {load:.1f}, euid {os.geteuid()}")

        print(f"\n1. start + exec('true') + close, {args.n} sequential sandboxes")
        lat = bench_latency(env, args.n)
        base = statistics.median(lat["baseline: bare bwrap true"])
        for name, xs in lat.items():
            if name.startswith("cpu"):
                print(f"   {name:28s} {ms(xs)}  (host + sandbox CPU time; load-independent work)")
                continue
            med = statistics.median(xs)
            print(f"   {name:28s} median {ms(med)}  p99 {ms(pct(xs, 0.99))}  ({med / base:4.2f}x bare bwrap)")

        print(f"\n2. pool throughput: concurrency {args.concurrency}, {args.seconds:.0f} s, "
              "start + exec true + close per sandbox")
        rate, metrics = bench_pool(env, args.seconds, args.concurrency)
        seq = 1.0 / statistics.median(lat["close(wait=False)"])
        print(f"   {rate:6.1f} sandboxes/s  ({rate / seq:4.2f}x one-at-a-time {seq:.1f}/s); "
              f"start p50 {ms(metrics['start_latency_p50_s'])}, p99 {ms(metrics['start_latency_p99_s'])}, "
              f"failures {metrics['failures']}")

        xs = bench_warm(env, max(10, args.n // 2), args.concurrency)
        print(f"\n2b. warm pool ({args.concurrency} started ahead): acquire + exec true + release "
              f"median {ms(statistics.median(xs))}  p99 {ms(pct(xs, 0.99))}")

        if not args.skip_overlay:
            print(f"\n3. workspace over a ~{args.repo_mb} MB repository: overlay vs copy")
            ov = bench_overlay(workdir, args.repo_mb)
            o, c = statistics.median(ov["overlay"]), statistics.median(ov["copy"])
            print(f"   repository: {ov['files']} files, {ov['bytes'] / 1e9:.2f} GB")
            print(f"   create: overlay (start + write 1 file) median {ms(o)};  "
                  f"baseline cp -a + write 1 file median {ms(c)}  -> overlay {c / o:,.0f}x faster")
            oc, cr = statistics.median(ov["overlay_close"]), statistics.median(ov["copy_rm"])
            print(f"   teardown: close() median {ms(oc)};  baseline rm -r of the copy median {ms(cr)}")
    finally:
        from c2jax.envs.sandbox import flush_cleanup

        flush_cleanup()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
