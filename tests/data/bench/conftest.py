"""Fixture trees for tests/test_bench_adapters.py: task formats and repositories, not tests to collect."""
collect_ignore_glob = ["*"]
