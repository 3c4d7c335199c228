"""Paths the tests need, whatever folder under tests/ a test file sits in (tests/ is on sys.path
through tests/conftest.py, so `from _paths import REPO_ROOT` works from every folder)."""
from __future__ import annotations

import os

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))  # the shared helpers (`_*.py`) and data/
REPO_ROOT = os.path.dirname(TESTS_DIR)
