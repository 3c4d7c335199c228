"""The README's test command is exactly what `.ci/run` runs, and the README sends newcomers to no
file outside the repository."""
import os
import re

from _paths import REPO_ROOT


def _readme() -> str:
    with open(os.path.join(REPO_ROOT, "README.md")) as f:
        return f.read()


def test_readme_test_command_is_what_ci_runs():
    blocks = re.findall(r"```bash\n(.*?)\n```", _readme(), flags=re.S)
    test_cmds = [b for b in blocks if "pytest -q" in b and "python3 -m venv" in b]
    assert len(test_cmds) == 1, test_cmds
    with open(os.path.join(REPO_ROOT, ".ci", "run")) as f:
        ci = [ln for ln in f.read().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert ci[-1].strip() == test_cmds[0].strip()
    assert not [ln for ln in ci if ln.startswith(("python", "pip"))][:-1], "CI runs more than the README says"


def test_readme_points_inside_the_repository():
    text = _readme()
    assert "../shared" not in text and "/work/" not in text
    for link in re.findall(r"\]\(([^)#]+)\)", text):
        if not link.startswith(("http://", "https://")):
            assert os.path.exists(os.path.join(REPO_ROOT, link)), link
