"""2 processes x 4 CPU devices on 127.0.0.1 (jax.distributed via experiments/run.py's env vars):
sharded train steps match one device, checkpoint save + restore onto a different mesh."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from _paths import TESTS_DIR  # noqa: E402

HERE = TESTS_DIR  # the helper scripts live in tests/


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_train_save_restore(tmp_path):
    port = _free_port()
    procs = []
    for pid in range(2):
        env = dict(os.environ, C2JAX_COORDINATOR=f"127.0.0.1:{port}", C2JAX_NUM_PROCESSES="2",
                   C2JAX_PROCESS_ID=str(pid), XLA_FLAGS="--xla_force_host_platform_device_count=4")
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "_sharding_multiprocess_worker.py"),
                                       str(tmp_path), str(tmp_path / "ckpt")], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=900)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-4000:]
    res = [json.loads((tmp_path / f"result_{i}.json").read_text()) for i in range(2)]
    for r in res:
        assert r["losses"] == pytest.approx(r["ref"], rel=2e-5)
        assert r["restored_step"] == 2 and r["loader"] == {"step": 2} and r["step_after_restore"] == 3
        assert r["identical"] and r["shardings_ok"]
        assert r["emb_local_shard_size"] * 8 == r["emb_size"]
    assert res[0]["losses"] == res[1]["losses"] and res[0]["loss_after_restore"] == res[1]["loss_after_restore"]
