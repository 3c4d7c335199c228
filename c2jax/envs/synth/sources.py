"""Codebases tasks are synthesised from: a workspace tree, its test files, and its provenance.

Three kinds:
- `stdlib_codebase(modules)`: pure-Python standard-library modules of the running CPython, each
  with its own `Lib/test/test_<module>.py`, laid out as `<module>.py` + `tests/test_<module>.py`.
  The whole standard library counts as ONE codebase ("stdlib"). Modules the test runner itself
  imports (pytest's import closure) are refused: a mutation there would break the runner.
- `installed_codebase(dist)`: a pure-Python distribution installed in this Python whose wheel
  ships its tests (e.g. mpmath); no network needed.
- `sdist_codebase(spec, cache)`: a pinned PyPI sdist from the local prefetch cache
  (`c2jax.envs.synth.pypi`), verified by sha256 before extraction.

A `Codebase` knows which files are source (mutable) and which are tests (hidden per task), and
the command that runs a test file under pytest inside a sandbox.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zipfile

from c2jax.envs.tasks import Source

STDLIB_LICENSE = "PSF-2.0"


@dataclasses.dataclass
class Codebase:
    """A prepared workspace tree plus what synthesis needs to know about it.

    root: host directory holding the workspace (copied into the environment's base layer).
    source_files: workspace-relative .py files that may be mutated.
    test_files: workspace-relative test files; `tests_for(path)` maps a source file to its tests.
    pythonpath: in-sandbox PYTHONPATH for the tests ("" = the workspace root via the cwd).
    """

    name: str
    source: Source
    root: str
    source_files: list[str]
    test_files: list[str]
    test_map: dict[str, list[str]]
    pythonpath: str = ""
    import_names: list[str] = dataclasses.field(default_factory=list)
    stdlib_modules: list[str] = dataclasses.field(default_factory=list)
    pytest_args: list[str] = dataclasses.field(default_factory=list)  # extra args before the test files

    def tests_for(self, path: str) -> list[str]:
        return self.test_map.get(path, self.test_files)

    def test_cmd(self, test_files: list[str]) -> list[str]:
        return ["python", "-m", "pytest", "-q", "-rN", "--tb=line", "-p", "no:cacheprovider", *self.pytest_args,
                *test_files]

    def test_env(self) -> dict[str, str]:
        return {"PYTHONPATH": self.pythonpath} if self.pythonpath else {}


def tree_sha256(root: str, files: list[str]) -> str:
    h = hashlib.sha256()
    for rel in sorted(files):
        with open(os.path.join(root, rel), "rb") as f:
            h.update(rel.encode() + b"\0" + hashlib.sha256(f.read()).digest())
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def runner_imported_modules() -> frozenset[str]:
    """Top-level modules a pytest session imports in this Python (they cannot be task modules)."""
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "test_probe.py"), "w") as f:
            f.write("def test_probe():\n    assert True\n")
        code = ("import sys, json, pytest; pytest.main(['-q', '-p', 'no:cacheprovider', %r]); "
                "print('@@' + json.dumps(sorted({m.split('.')[0] for m in sys.modules})))" % d)
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=d)
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("@@"))
    return frozenset(json.loads(line[2:]))


def stdlib_root() -> str:
    return sysconfig.get_paths()["stdlib"]


def stdlib_codebase(modules: list[str], out_dir: str) -> Codebase:
    """Standard-library modules + their Lib/test files as one workspace under `out_dir`."""
    std = stdlib_root()
    bad = sorted(set(modules) & runner_imported_modules())
    if bad:
        raise ValueError(f"stdlib modules {bad} are imported by pytest itself; pick others")
    root = os.path.join(out_dir, "stdlib")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(os.path.join(root, "tests"))
    src, tests, tmap = [], [], {}
    for m in modules:
        mod, test = os.path.join(std, f"{m}.py"), os.path.join(std, "test", f"test_{m}.py")
        if not os.path.isfile(mod) or not os.path.isfile(test):
            raise ValueError(f"stdlib module {m}: needs {mod} and {test}")
        shutil.copyfile(mod, os.path.join(root, f"{m}.py"))
        shutil.copyfile(test, os.path.join(root, "tests", f"test_{m}.py"))
        src.append(f"{m}.py")
        tests.append(f"tests/test_{m}.py")
        tmap[f"{m}.py"] = [f"tests/test_{m}.py"]
    ver = ".".join(map(str, sys.version_info[:3]))
    source = Source("stdlib", "stdlib", ver, tree_sha256(root, src + tests), STDLIB_LICENSE,
                    "https://www.python.org/downloads/")
    return Codebase("stdlib", source, root, src, tests, tmap, "", list(modules), list(modules))


def _split_py(files: list[str]) -> tuple[list[str], list[str]]:
    src, tests = [], []
    for f in files:
        if not f.endswith(".py"):
            continue
        base = os.path.basename(f)
        if "/tests/" in f"/{f}" or "/test/" in f"/{f}" or base.startswith("test_") or base.endswith("_test.py"):
            if base.startswith("test_") or base.endswith("_test.py"):
                tests.append(f)
        elif base not in ("conftest.py", "setup.py", "noxfile.py") and "/docs/" not in f"/{f}":
            src.append(f)
    return sorted(src), sorted(tests)


def _map_tests(src: list[str], tests: list[str]) -> dict[str, list[str]]:
    """Source file -> test files named after it (test_<stem>.py), else every test file."""
    out = {}
    for s in src:
        stem = os.path.splitext(os.path.basename(s))[0].lstrip("_")
        named = [t for t in tests if os.path.basename(t) in (f"test_{stem}.py", f"{stem}_test.py")]
        out[s] = named or list(tests)
    return out


def installed_codebase(dist_name: str, out_dir: str, test_files: list[str] | None = None,
                       license: str = "") -> Codebase:
    """A pure-Python installed distribution (its wheel ships tests) as a workspace."""
    dist = md.distribution(dist_name)
    files = [str(f) for f in dist.files or [] if str(f).endswith(".py") and not str(f).startswith("..")]
    top = sorted({f.split("/")[0] for f in files if "/" in f and ".dist-info" not in f})
    root = os.path.join(out_dir, dist_name)
    shutil.rmtree(root, ignore_errors=True)
    for f in files:
        if f.split("/")[0] not in top:
            continue
        dst = os.path.join(root, f)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(dist.locate_file(f), dst)
    rel = sorted(os.path.relpath(os.path.join(d, n), root) for d, _, ns in os.walk(root) for n in ns)
    src, tests = _split_py(rel)
    if test_files is not None:
        missing = sorted(set(test_files) - set(tests))
        if missing:
            raise ValueError(f"{dist_name}: test files {missing} not in the distribution")
        tests = list(test_files)
    lic = license or _licence_of(dist.metadata)
    source = Source("installed", _norm(dist.metadata["Name"]), dist.version, tree_sha256(root, rel), lic,
                    f"https://pypi.org/project/{dist.metadata['Name']}/{dist.version}/")
    return Codebase(_norm(dist.metadata["Name"]), source, root, src, tests, _map_tests(src, tests), "", top)


def _norm(name: str) -> str:
    import re

    return re.sub(r"[-_.]+", "-", name).lower()


def _licence_of(meta) -> str:
    expr = meta.get("License-Expression")
    if expr:
        return expr
    for c in meta.get_all("Classifier") or []:
        for key, spdx in (("MIT", "MIT"), ("BSD", "BSD-3-Clause"), ("Apache", "Apache-2.0"),
                          ("Python Software Foundation", "PSF-2.0"), ("ISC", "ISC"), ("Mozilla", "MPL-2.0")):
            if c.startswith("License ::") and key in c:
                return spdx
    return meta.get("License", "") or "UNKNOWN"


# Options of pytest plugins the runner venv does not have (pytest-cov, pytest-xdist, ...).
_PLUGIN_OPTS = re.compile(r"(?<![\w-])(--cov\b|--no-cov\b|-n\s*(auto|\d)|--dist\b|--benchmark-|--flake8|--mypy)")
_PYTEST_CONFIGS = (("pytest.ini", "[pytest]"), (".pytest.ini", "[pytest]"),
                   ("pyproject.toml", "[tool.pytest.ini_options]"), ("tox.ini", "[pytest]"),
                   ("setup.cfg", "[tool:pytest]"))


def pytest_config_args(root: str) -> list[str]:
    """`-o addopts=` when the tree's pytest config adds options of plugins the runner lacks.

    pytest reads the first config file holding a pytest section (pytest.ini, .pytest.ini,
    pyproject.toml, tox.ini, setup.cfg, in that order); if its `addopts` names e.g. `--cov`
    (pytest-cov), every run stops at argument parsing and reports no test at all.
    """
    for fname, header in _PYTEST_CONFIGS:
        path = os.path.join(root, fname)
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        if fname not in ("pytest.ini", ".pytest.ini") and header not in text:
            continue
        section = text.split(header, 1)[1] if header in text else text
        section = re.split(r"\n\[", section, maxsplit=1)[0]  # up to the next section
        m = re.search(r"^addopts\s*=(.*?)(?=^\S|\Z)", section, re.M | re.S)
        return ["-o", "addopts="] if m and _PLUGIN_OPTS.search(m.group(1)) else []
    return []


def extract_sdist(path: str, dest: str) -> str:
    """Extract a .tar.gz / .zip sdist safely (no absolute paths, links or '..'); returns its top dir."""
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    if path.endswith(".zip"):
        with zipfile.ZipFile(path) as zf:
            for n in zf.namelist():
                if n.startswith("/") or ".." in n.split("/"):
                    raise ValueError(f"{path}: unsafe member {n!r}")
            zf.extractall(dest)
    else:
        with tarfile.open(path) as tf:
            tf.extractall(dest, filter="data")
    tops = os.listdir(dest)
    return os.path.join(dest, tops[0]) if len(tops) == 1 else dest


_SCRIPT_GROUPS = ("console_scripts", "gui_scripts")


def _keep_entry_points(top: str, root: str, name: str, version: str) -> list[str]:
    """Recreate the entry points the package looks up in its own metadata; returns the dirs made.

    Packages that find their own plugins through `importlib.metadata.entry_points` (Markdown's
    extensions by short name) fail those tests unless the distribution is installed. The
    workspace is imported from its tree, so a minimal `NAME-VERSION.dist-info` (METADATA with name
    and version, and the sdist egg-info's entry_points.txt) beside the packages makes the lookup
    work. Console scripts alone are not worth it. Nothing else of the egg-info is kept (its
    SOURCES.txt and long description; the leak scan rejects any *.egg-info in the workspace).
    """
    kept = []
    for d, dirs, _ in os.walk(top):
        for sub in list(dirs):
            if not sub.endswith(".egg-info"):
                continue
            dirs.remove(sub)
            eps = os.path.join(d, sub, "entry_points.txt")
            if not os.path.isfile(eps):
                continue
            with open(eps, encoding="utf-8") as f:
                text = f.read()
            groups = re.findall(r"^\[([^\]]+)\]", text, re.M)
            if not [g for g in groups if g.strip() not in _SCRIPT_GROUPS]:
                continue
            dst = os.path.join(root, os.path.relpath(d, top), f"{_norm(name).replace('-', '_')}-{version}.dist-info")
            os.makedirs(dst, exist_ok=True)
            with open(os.path.join(dst, "METADATA"), "w", encoding="utf-8") as f:
                f.write(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
            with open(os.path.join(dst, "entry_points.txt"), "w", encoding="utf-8") as f:
                f.write(text)
            kept.append(os.path.relpath(dst, root))
    return kept


def sdist_codebase(name: str, version: str, sdist_path: str, sha256: str, license: str, out_dir: str,
                   test_globs: list[str] | tuple[str, ...] = ()) -> Codebase:
    """A verified sdist from the prefetch cache as a workspace (tests as shipped).

    Layout is detected: a `src/` directory puts /workspace/src on PYTHONPATH; otherwise the
    top-level packages (directories with __init__.py) and modules are imported from the cwd.
    """
    with open(sdist_path, "rb") as f:
        got = hashlib.sha256(f.read()).hexdigest()
    if got != sha256:
        raise ValueError(f"{sdist_path}: sha256 {got} != pinned {sha256}")
    tmp = os.path.join(out_dir, f".x-{name}")
    top = extract_sdist(sdist_path, tmp)
    root = os.path.join(out_dir, _norm(name))
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(top, root, symlinks=False,
                    ignore=shutil.ignore_patterns("*.pyc", "__pycache__", "*.egg-info", "PKG-INFO", ".git*"))
    _keep_entry_points(top, root, name, version)
    shutil.rmtree(tmp, ignore_errors=True)
    rel = sorted(os.path.relpath(os.path.join(d, n), root) for d, _, ns in os.walk(root) for n in ns)
    src, tests = _split_py(rel)
    skip_top = ("doc", "docs", "example", "examples", "bench", "benchmarks", "tools", "scripts", "misc", "tests",
                "test", "setup.py", "conftest.py", "noxfile.py", "tasks.py", "fabfile.py")
    if os.path.isdir(os.path.join(root, "src")):
        pythonpath = "/workspace/src"
        src = [s for s in src if s.startswith("src/")]
        tops = sorted({s.split("/")[1].removesuffix(".py") for s in src})
    else:
        pythonpath = ""
        keep = []
        for s in src:
            first = s.split("/")[0]
            if first in skip_top or first.startswith("."):
                continue
            if "/" in s and not os.path.exists(os.path.join(root, first, "__init__.py")):
                continue
            keep.append(s)
        src = keep
        tops = sorted({s.split("/")[0].removesuffix(".py") for s in src})
    if test_globs:
        import fnmatch

        tests = [t for t in tests if any(fnmatch.fnmatch(t, g) for g in test_globs)]
    if not src or not tests:
        raise ValueError(f"{name} {version}: no {'source' if not src else 'test'} files found in the sdist")
    source = Source("pypi", _norm(name), version, sha256, license, f"https://pypi.org/project/{name}/{version}/")
    return Codebase(_norm(name), source, root, src, tests, _map_tests(src, tests), pythonpath, tops,
                    pytest_args=pytest_config_args(root))
