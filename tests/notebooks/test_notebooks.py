"""Every notebook runs top to bottom with nbclient on a fresh kernel that does not have c2jax.

The kernel runs in a new virtual environment that sees this environment's dependencies (a .pth
line) but not c2jax, and starts in an empty directory: each notebook's first cell must install the
project (from ``C2JAX_INSTALL_SPEC``, set here to a copy of this checkout, as Colab would clone it)
and find its configs without assuming it runs from ``notebooks/``. Default run: the fast notebooks
(seconds); ``-m slow``: all of them.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest
from _paths import REPO_ROOT  # noqa: E402

nbformat = pytest.importorskip("nbformat", reason="pip install -e '.[test]' (nbformat, nbclient, ipykernel)")
nbclient = pytest.importorskip("nbclient", reason="pip install -e '.[test]' (nbformat, nbclient, ipykernel)")
pytest.importorskip("ipykernel", reason="pip install -e '.[test]' (nbformat, nbclient, ipykernel)")

ROOT = REPO_ROOT
NOTEBOOKS = sorted(n[:-6] for n in os.listdir(os.path.join(ROOT, "notebooks")) if n.endswith(".ipynb"))
FAST = ("kl_estimators", "length_penalty")
KERNEL = "c2jax-fresh"


@pytest.fixture(scope="module")
def fresh_kernel(tmp_path_factory, request):
    """A kernelspec whose Python has every dependency but not c2jax; a checkout copy to install from."""
    base = tmp_path_factory.mktemp("nbenv")
    checkout = base / "checkout"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split("\n")
    for f in filter(None, files):
        src = os.path.join(ROOT, f)
        if os.path.isfile(src) and not f.startswith("runs/"):
            os.makedirs(checkout / os.path.dirname(f), exist_ok=True)
            shutil.copy2(src, checkout / f)
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # The dependencies' directory as a plain path entry: its own .pth files (c2jax's editable finder) are not run.
    with open(os.path.join(purelib, "deps.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    probe = subprocess.run([str(py), "-c", "import c2jax"], cwd=str(base), capture_output=True, text=True)
    assert probe.returncode != 0, "the fresh environment must not see c2jax (the install cell would be skipped)"
    spec_dir = base / "jupyter" / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    env = {"C2JAX_INSTALL_SPEC": str(checkout), "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "",
           "C2JAX_PROGRESS": "0", "PYTHONNOUSERSITE": "1"}
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [str(py), "-m", "ipykernel_launcher", "-f", "{connection_file}"], "display_name": "c2jax fresh",
        "language": "python", "env": env}))
    mp = pytest.MonkeyPatch()
    mp.setenv("JUPYTER_PATH", str(base / "jupyter"))
    mp.delenv("C2JAX_ROOT", raising=False)
    yield {"venv": venv, "checkout": checkout, "cwd": base / "cwd"}
    mp.undo()


def _execute(name: str, kernel: dict):
    nb = nbformat.read(os.path.join(ROOT, "notebooks", f"{name}.ipynb"), as_version=4)
    first = "".join(nb.cells[1].source)
    assert "C2JAX_INSTALL_SPEC" in first and "pip" in first, f"{name}: the first code cell must install c2jax"
    kernel["cwd"].mkdir(exist_ok=True)
    client = nbclient.NotebookClient(nb, timeout=900, kernel_name=KERNEL,
                                     resources={"metadata": {"path": str(kernel["cwd"])}})
    client.execute()
    return nb


def _outputs(nb) -> str:
    text = []
    for c in nb.cells:
        for o in c.get("outputs", []):
            text.append(o.get("text", "") or json.dumps(o.get("data", {}).get("text/plain", "")))
    return "\n".join(text)


@pytest.mark.parametrize("name", FAST)
def test_fast_notebooks_run_on_a_fresh_kernel(name, fresh_kernel):
    nb = _execute(name, fresh_kernel)
    out = _outputs(nb)
    assert f"c2jax checkout: {fresh_kernel['checkout']}" in out  # installed from C2JAX_INSTALL_SPEC, found there
    assert any(o.get("output_type") == "display_data" and "image/png" in o.get("data", {})
               for c in nb.cells for o in c.get("outputs", [])), f"{name}: no figure"


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in NOTEBOOKS if n not in FAST])
def test_every_notebook_runs_on_a_fresh_kernel(name, fresh_kernel):
    nb = _execute(name, fresh_kernel)
    assert f"c2jax checkout: {fresh_kernel['checkout']}" in _outputs(nb)


def test_notebooks_listed():
    for n in ("quickstart", "model_and_hf", "low_precision", "kl_estimators", "router_replay", "rl_quickstart",
              "length_penalty"):
        assert n in NOTEBOOKS, n
