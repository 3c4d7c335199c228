"""JAX's persistent compilation cache (c2jax/compile_cache.py): a second process compiling the same
program loads it from the cache (a hit, the same result); a cache left off records nothing; the run
script's default directory sits beside the config's build cache."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import ml_collections

from c2jax.compile_cache import default_cache_dir, enable_compile_cache

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# One process: count JAX's persistent-cache hit events while compiling and running a small program.
_CHILD = r"""
import json, sys
import jax, jax.numpy as jnp
from c2jax.compile_cache import enable_compile_cache
hits = []
jax.monitoring.register_event_listener(lambda name, **kw: hits.append(name) if "cache_hits" in name else None)
enable_compile_cache(sys.argv[1] or None, min_compile_time_s=0.0)
f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum(axis=0) * 3.0)
y = f(jnp.arange(64.0).reshape(8, 8) / 64.0)
print(json.dumps({"hits": len(hits), "y": [float(v) for v in y]}))
"""


def _child(cache_dir: str) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", _CHILD, cache_dir], capture_output=True, text=True, env=env,
                         timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_the_compiled_program_from_the_cache(tmp_path):
    cache = str(tmp_path / "xla")
    first = _child(cache)
    assert first["hits"] == 0 and os.listdir(cache)  # compiled, then written to the cache
    second = _child(cache)
    assert second["hits"] >= 1 and second["y"] == first["y"]  # loaded, not compiled: the same result
    off = _child("")
    assert off["hits"] == 0 and off["y"] == first["y"]  # control: with the cache off nothing is loaded


def test_default_directory_is_beside_the_build_cache_and_empty_means_off():
    with_build = ml_collections.ConfigDict({"build": {"dir": "runs/cache", "stages": ["cpt"]}})
    assert default_cache_dir(with_build) == os.path.join("runs/cache", "xla")
    assert default_cache_dir(ml_collections.ConfigDict({"train": {"steps": 1}})) is None
    assert enable_compile_cache("") is None and enable_compile_cache(None) is None
