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

if not os.environ.get("C2JAX_ENVS_DIR"):
    _ENVS_DIR = tempfile.mkdtemp(prefix="c2jax_test_envs_")
    os.environ["C2JAX_ENVS_DIR"] = _ENVS_DIR

    @atexit.register
    def _remove_envs_dir() -> None:
        try:
            from c2jax.envs.sandbox import flush_cleanup

            flush_cleanup(30.0)  # closed sandboxes' mounts and files first
        except Exception:
            pass
        shutil.rmtree(_ENVS_DIR, ignore_errors=True)
