"""Fixture trees for tests/bench/test_bench_adapters.py: task formats and repositories, not tests to collect."""
collect_ignore_glob = ["*"]
