"""The built-in PyPI source list: permissive pure-Python packages whose sdists ship their tests.

Each entry is pinned by version and the sdist's sha256. `prefetch(cache)` is the ONLY step that
talks to a package index (`pip download --require-hashes`, sdists only); builds and tests read the
cache and verify the hash again before extracting. Default cache: $C2JAX_PYPI_CACHE or
~/.cache/c2jax/pypi.

    python -m c2jax.bench prefetch            # fill the cache (needs the registry)
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
import tempfile


@dataclasses.dataclass(frozen=True)
class Pinned:
    name: str
    version: str
    sha256: str
    license: str  # SPDX
    filename: str
    test_globs: tuple[str, ...] = ()  # subset of the shipped test files to use ("" = all)
    max_test_file_s: float | None = None  # per-package override of Targets.max_test_file_s (big suites)

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version} --hash=sha256:{self.sha256}"


PACKAGES: tuple[Pinned, ...] = (
    Pinned("toolz", "1.2.0", "9667a038e9d6ecba37995e26cb2f59ec6420b6ad8dd9677de59db9b956b08490", "BSD-3-Clause",
           "toolz-1.2.0.tar.gz"),
    Pinned("more-itertools", "11.2.1", "cbf08fd0af284dc69718b9b76a8e6203df624d70209ea511e4219d350c856f63", "MIT",
           "more_itertools-11.2.1.tar.gz", max_test_file_s=60.0),  # 2 test files, ~25 s a run each
    Pinned("cachetools", "8.0.2", "30ac523adfc118b51d2b2e7bad8a0ddb31370dfe2700c7f10ca224f36ccf81e0", "MIT",
           "cachetools-8.0.2.tar.gz"),
    Pinned("boltons", "26.2.0", "d39cfd15c1a1c3bd4d705c82252fa9edb8e4f5e8cc039f8e39afac7b1b47e92c", "BSD-3-Clause",
           "boltons-26.2.0.tar.gz"),
    Pinned("idna", "3.20", "a7db850025b95ded1eae8a46181a1a6c56c92c96f0e2b005d9ff8dc0210cab44", "BSD-3-Clause",
           "idna-3.20.tar.gz"),
    Pinned("isodate", "0.7.2", "4cd1aa0f43ca76f4a6c6c0292a85f40b35ec2e43e315b59f06e6d32171a953e6", "BSD-3-Clause",
           "isodate-0.7.2.tar.gz"),
    Pinned("jmespath", "1.1.0", "472c87d80f36026ae83c6ddd0f1d05d4e510134ed462851fd5f754c8c3cbb88d", "MIT",
           "jmespath-1.1.0.tar.gz"),
    Pinned("markdown", "3.11.3", "81eb91631dc97ad1efbc76019ef0f80fe90ca49ddf81546752d79989c3bfff3e", "BSD-3-Clause",
           "markdown-3.11.3.tar.gz"),
    Pinned("semver", "3.1.2", "bea193552413194252d33ff26ce0962b76669bd1c6fb17e8e203ac37f072feaf", "BSD-3-Clause",
           "semver-3.1.2.tar.gz"),
    Pinned("sqlparse", "0.6.1", "ca722573f848ff2d30e40ea30f53a104b7dea7635ea9285891263eb2c58fb6e7", "BSD-3-Clause",
           "sqlparse-0.6.1.tar.gz"),
    Pinned("webcolors", "25.10.0", "62abae86504f66d0f6364c2a8520de4a0c47b80c03fc3a5f1815fedbef7c19bf", "BSD-3-Clause",
           "webcolors-25.10.0.tar.gz"),
    Pinned("tabulate", "0.10.0", "e2cfde8f79420f6deeffdeda9aaec3b6bc5abce947655d17ac662b126e48a60d", "MIT",
           "tabulate-0.10.0.tar.gz"),
    Pinned("parse", "1.22.4", "706d458feed5a81b02768d3156e8070baf6cee7d150a3a3c0cd43101a875c3b5", "MIT",
           "parse-1.22.4.tar.gz"),
)


def default_cache() -> str:
    return os.environ.get("C2JAX_PYPI_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "c2jax", "pypi")


def by_name(name: str) -> Pinned:
    for p in PACKAGES:
        if p.name == name:
            return p
    raise KeyError(f"{name!r} is not in the built-in PyPI list ({', '.join(p.name for p in PACKAGES)})")


def cached_path(p: Pinned, cache: str | None = None) -> str | None:
    """Path of the verified sdist in the cache, or None if missing / hash mismatch."""
    path = os.path.join(cache or default_cache(), p.filename)
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        if hashlib.sha256(f.read()).hexdigest() != p.sha256:
            return None
    return path


def prefetch(cache: str | None = None, names: list[str] | None = None) -> dict[str, str]:
    """Download the pinned sdists into the cache (pip, hashes required); returns name -> path."""
    cache = cache or default_cache()
    os.makedirs(cache, exist_ok=True)
    todo = [p for p in PACKAGES if (names is None or p.name in names) and cached_path(p, cache) is None]
    if todo:
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write("\n".join(p.requirement for p in todo) + "\n")
            req = f.name
        try:
            r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                                "--require-hashes", "-q", "-d", cache, "-r", req], capture_output=True, text=True)
        finally:
            os.unlink(req)
        if r.returncode != 0:
            raise RuntimeError(f"pip download failed:\n{r.stderr[-3000:]}")
    out = {}
    for p in PACKAGES:
        if names is None or p.name in names:
            path = cached_path(p, cache)
            if path is None:
                raise RuntimeError(f"{p.filename}: missing from {cache} or sha256 mismatch after prefetch")
            out[p.name] = path
    return out
