"""The ``sft_matched`` control trains on demonstrations of the RL stage's own train tasks: exactly the
``trained_tasks`` an RL run recorded (``tasks_from``), or the RL stream's first steps x tasks_per_step
tasks; a ``tasks_from`` without them fails validation naming the key, before any compute. With
``tasks_from`` it trains for that run's measured RL time (``match_rl_wall``), not the preset's figure."""
from __future__ import annotations

import importlib.util
import json
import os
from types import SimpleNamespace

import pytest
from _paths import REPO_ROOT

CONFIG = os.path.join(REPO_ROOT, "experiments", "configs", "rl_quickstart.py")


def _config(preset: str = "sft_matched"):
    spec = importlib.util.spec_from_file_location("rl_quickstart", CONFIG)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m.get_config(preset)


def _write_rl_run(root, ids, nested=True, rl_s=321.5):
    d = os.path.join(root, "rl") if nested else root
    os.makedirs(d, exist_ok=True)
    summary = {"steps": 2, "trained_tasks": ids}
    if rl_s is not None:
        summary["time"] = {"rl_s": rl_s, "eval_before_s": 999.0}
    with open(os.path.join(d, "summary.json"), "w") as f:
        json.dump(summary, f)


@pytest.mark.parametrize("nested", [True, False])
def test_tasks_from_reads_the_rl_runs_trained_tasks(tmp_path, nested):
    from c2jax.train.sft_matched import matched_task_ids

    _write_rl_run(str(tmp_path), ["t3", "t1", "t7"], nested=nested)
    got = matched_task_ids({}, {"steps": 99, "tasks_per_step": 99}, 0, str(tmp_path))
    assert got == {"t3", "t1", "t7"}


def test_default_is_the_rl_streams_first_tasks(monkeypatch):
    from c2jax.train import rl_family
    from c2jax.train.rl_tasks import TaskStream
    from c2jax.train.sft_matched import matched_task_ids

    tasks = [SimpleNamespace(instance_id=f"t{i:02d}", metadata={}) for i in range(20)]
    monkeypatch.setattr(rl_family, "load_split", lambda fam, split: tasks)
    got = matched_task_ids({}, {"steps": 3, "tasks_per_step": 2}, 5, None)
    stream = TaskStream(tasks, seed=5)
    want = {t.instance_id for step in range(3) for t in stream.take(2, step)}
    assert got == want and len(got) == 6
    assert matched_task_ids({}, {"steps": 3, "tasks_per_step": 2}, 6, None) != got  # the seed's order


def test_bad_tasks_from_fails_validation_naming_the_key(tmp_path):
    from c2jax.config import ConfigError, validate

    cfg = _config()
    validate(cfg, warn=False)  # the preset itself is valid (tasks_from unset)
    cfg.sft_matched.tasks_from = str(tmp_path / "no_such_run")
    with pytest.raises(ConfigError) as e:
        validate(cfg, warn=False)
    assert "sft_matched.tasks_from" in str(e.value) and "trained_tasks" in str(e.value)
    _write_rl_run(str(tmp_path / "run"), ["a", "b"])
    cfg.sft_matched.tasks_from = str(tmp_path / "run")
    validate(cfg, warn=False)


@pytest.mark.parametrize("layout", ["rl_dir", "stage_summary", "workdir_summary"])
def test_time_budget_is_the_named_rl_runs_training_time(tmp_path, layout):
    from c2jax.train.sft_matched import SFT_MATCHED_DEFAULTS, training_budget_s

    if layout == "workdir_summary":  # run.py's {stage: summary} file at the workdir's root
        with open(tmp_path / "summary.json", "w") as f:
            json.dump({"rl": {"trained_tasks": ["a"], "time": {"rl_s": 287.25}}}, f)
    else:
        _write_rl_run(str(tmp_path), ["a"], nested=layout == "rl_dir", rl_s=287.25)
    c = dict(SFT_MATCHED_DEFAULTS, max_wall_s=466.0, tasks_from=str(tmp_path))
    secs, source = training_budget_s(c)
    assert secs == 287.25 and "time.rl_s" in source  # not the evaluations' time, not max_wall_s
    assert training_budget_s(dict(c, match_rl_wall=False)) == (466.0, "sft_matched.max_wall_s")
    assert training_budget_s(dict(c, tasks_from=None)) == (466.0, "sft_matched.max_wall_s")


def test_rl_run_without_its_time_fails_validation_unless_unmatched(tmp_path):
    from c2jax.config import ConfigError, validate

    cfg = _config()
    _write_rl_run(str(tmp_path / "run"), ["a", "b"], rl_s=None)
    cfg.sft_matched.tasks_from = str(tmp_path / "run")
    with pytest.raises(ConfigError) as e:
        validate(cfg, warn=False)
    assert "sft_matched.tasks_from" in str(e.value) and "time.rl_s" in str(e.value)
    assert "match_rl_wall=False" in str(e.value)
    cfg.sft_matched.match_rl_wall = False
    validate(cfg, warn=False)
