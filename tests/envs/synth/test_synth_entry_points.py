"""sdist workspaces keep the entry points a package looks up in its own metadata (as a minimal
dist-info), never the egg-info itself; the package's plugin lookup then works from the tree."""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile

from c2jax.envs.synth.sources import sdist_codebase


def _sdist(tmp_path, name: str, entry_points: str | None) -> str:
    top = tmp_path / f"{name}-1.0"
    pkg = top / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "from importlib.metadata import entry_points\n\n"
        f"def plugins():\n    return sorted(ep.name for ep in entry_points(group='{name}.plugins'))\n")
    (top / "tests").mkdir()
    (top / "tests" / "test_it.py").write_text(f"import {name}\n\ndef test_plugins():\n    assert {name}.plugins()\n")
    egg = top / f"{name}.egg-info"
    egg.mkdir()
    (egg / "SOURCES.txt").write_text(f"{name}/__init__.py\n")
    (egg / "PKG-INFO").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n\nlong description\n")
    if entry_points is not None:
        (egg / "entry_points.txt").write_text(entry_points)
    path = str(tmp_path / f"{name}-1.0.tar.gz")
    with tarfile.open(path, "w:gz") as tf:
        tf.add(top, arcname=top.name)
    return path


def _sha(path: str) -> str:
    import hashlib

    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_plugin_entry_points_become_a_minimal_dist_info(tmp_path):
    path = _sdist(tmp_path, "plugpkg", "[console_scripts]\nplug = plugpkg:main\n\n[plugpkg.plugins]\n"
                                       "alpha = plugpkg:alpha\nbeta = plugpkg:beta\n")
    cb = sdist_codebase("plugpkg", "1.0", path, _sha(path), "MIT", str(tmp_path / "out"))
    listing = sorted(os.listdir(cb.root))
    assert "plugpkg-1.0.dist-info" in listing and not any(x.endswith(".egg-info") for x in listing)
    info = os.path.join(cb.root, "plugpkg-1.0.dist-info")
    assert sorted(os.listdir(info)) == ["METADATA", "entry_points.txt"]
    assert "long description" not in open(os.path.join(info, "METADATA")).read()
    out = subprocess.run([sys.executable, "-c", "import plugpkg; print(plugpkg.plugins())"], cwd=cb.root,
                         capture_output=True, text=True, check=True, env={"PATH": os.environ["PATH"]})
    assert out.stdout.strip() == "['alpha', 'beta']"
    assert cb.source_files == ["plugpkg/__init__.py"]  # metadata files are never mutation targets


def test_console_scripts_only_or_no_entry_points_keep_nothing(tmp_path):
    for name, eps in (("scriptpkg", "[console_scripts]\ns = scriptpkg:main\n"), ("plainpkg", None)):
        path = _sdist(tmp_path, name, eps)
        cb = sdist_codebase(name, "1.0", path, _sha(path), "MIT", str(tmp_path / "out"))
        assert not [x for x in os.listdir(cb.root) if x.endswith((".dist-info", ".egg-info"))]
