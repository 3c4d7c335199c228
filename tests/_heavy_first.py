"""The test files collected first under pytest-xdist (used by `tests/conftest.py`)."""

# Test files that take minutes on 2 cores (compiling learners, sharded steps, end-to-end stages), in
# about the order of their cost. They are collected first so that pytest-xdist (`--dist loadfile`
# hands out whole files in collection order) starts them early instead of leaving one worker alone
# with them at the end. Order only: every test still runs, and none depends on another's order.
HEAVY_FIRST = (
    "tests/train/test_rl_step_exact.py", "tests/train/test_rl_smoke.py",
    "tests/model/parallel/test_sharding_train.py", "tests/model/parallel/test_sharding_model.py",
    "tests/train/async_rl/test_async_rl_exact.py", "tests/train/async_rl/test_async_rl_faults.py",
    "tests/train/test_train_loop.py", "tests/train/test_rl_optimizer.py", "tests/envs/test_grading_tamper.py",
    "tests/bench/test_bench_materialize.py", "tests/benchmarks/test_benchmark_sampling.py",
    "tests/experiments/test_model_smoke_run.py", "tests/serve/test_serve_openai.py",
)
