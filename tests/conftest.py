"""Test setup: CPU only, 8 simulated devices (set before JAX is imported anywhere)."""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in flags:
    os.environ["XLA_FLAGS"] = (flags + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# One private sandbox-environments state directory for the whole session. Environment ids are
# resolved against $C2JAX_ENVS_DIR at call time, so every test area (envs, bench/grading, agent,
# serve) must see the same directory: an area that switched it for the rest of the session made
# the environments another area had built unreachable.
import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

import pytest  # noqa: E402

from _heavy_first import HEAVY_FIRST  # noqa: E402  (own module, so tests/test_heavy_first.py can import it)

# Under pytest-xdist (the README's test command runs two workers) each worker gets its own directory
# inside the one the controller made: tests assert that their sandboxes are gone afterwards, which a
# listing shared with the other worker's live sandboxes would contradict.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if not os.environ.get("C2JAX_ENVS_DIR") or _WORKER:
    _parent = os.environ.get("C2JAX_ENVS_DIR") if _WORKER else None
    if _parent:
        os.makedirs(_parent, exist_ok=True)
    _ENVS_DIR = tempfile.mkdtemp(prefix=f"c2jax_test_envs_{_WORKER or ''}", dir=_parent)
    os.environ["C2JAX_ENVS_DIR"] = _ENVS_DIR

    @atexit.register
    def _remove_envs_dir() -> None:
        try:
            from c2jax.envs.sandbox import flush_cleanup

            flush_cleanup(30.0)  # closed sandboxes' mounts and files first
        except Exception:
            pass
        shutil.rmtree(_ENVS_DIR, ignore_errors=True)


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "sandbox_required(problem): the test needs bwrap sandboxes (or root); "
                            "problem None = available (tests/_envs_common.py)")
    config.addinivalue_line("markers", "reference_required(problem): the test needs the torch extra; "
                            "problem None = installed (tests/_reference_imports.py)")


def pytest_collection_modifyitems(session, config, items) -> None:
    root = str(config.rootpath)
    rank = {path: i for i, path in enumerate(HEAVY_FIRST)}

    def key(item) -> int:
        rel = os.path.relpath(str(item.path), root)
        return rank.get(rel, len(HEAVY_FIRST))

    items.sort(key=key)  # stable: the rest keep their order


def pytest_runtest_setup(item) -> None:
    """Sandbox tests fail loudly where sandboxes are missing, unless C2JAX_SANDBOX_UNAVAILABLE=1;
    reference-parity tests likewise where the torch extra is missing, unless C2JAX_ALLOW_NO_TORCH=1."""
    for mark in item.iter_markers("sandbox_required"):
        if mark.args and mark.args[0]:
            from _envs_common import check_sandbox_requirement

            check_sandbox_requirement(mark.args[0])
    for mark in item.iter_markers("reference_required"):
        if mark.args and mark.args[0]:
            from _reference_imports import check_reference_requirement

            check_reference_requirement(mark.args[0])


@pytest.fixture(scope="module")
def repo_env():
    """(repo dir, env id) of a tiny buggy repository with its environment built (once per session):
    the agent, serve, RL-step, async-RL and bench tests run episodes on it."""
    from _agent_common import build_repo_env

    return build_repo_env()
