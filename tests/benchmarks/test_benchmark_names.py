"""No benchmark script shadows an installed package: `python benchmarks/X.py` puts benchmarks/ first on
sys.path, and so do the benchmark tests, so a `benchmarks/kernels.py` was imported by transformers as the
HF `kernels` package (`ImportError: cannot import name 'CUDAProperties'`, every HF parity test after
the benchmark tests in CI). The script is now `benchmarks/kernel_bench.py`."""
import importlib.metadata
import os

from _paths import REPO_ROOT


def test_no_benchmark_module_is_named_like_an_installed_top_level_package():
    installed = set(importlib.metadata.packages_distributions())
    assert "jax" in installed and "numpy" in installed  # the check sees what is installed
    stems = {f[:-3] for f in os.listdir(os.path.join(REPO_ROOT, "benchmarks")) if f.endswith(".py")}
    assert stems and not stems & installed, sorted(stems & installed)
