"""Every file `tests/conftest.py` schedules first under pytest-xdist exists: a renamed or moved heavy
file would silently drop back to its alphabetical place and leave one worker alone with it at the end."""
import os

from _paths import REPO_ROOT
from _heavy_first import HEAVY_FIRST


def test_heavy_first_files_exist():
    missing = [p for p in HEAVY_FIRST if not os.path.isfile(os.path.join(REPO_ROOT, p))]
    assert not missing, missing
    assert len(set(HEAVY_FIRST)) == len(HEAVY_FIRST)
