"""The RL stage's printed evaluation command uses the run's own harness settings.

A run started with ``--config.agent.max_turns=8`` evaluates with 8 turns; a command naming only the
config file would rebuild the harness with the file's 6 (the positive control below), so the stage
writes the resolved agent section to ``agent.json`` and the command passes that file to
``python -m c2jax.bench run --agent-config``."""
from __future__ import annotations

import importlib.util
import os
import shlex

from c2jax.bench.agent_eval import load_agent_config
from c2jax.train.rl import eval_command, write_agent_config

CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "experiments", "configs", "rl_quickstart.py")


def _config(preset: str = "smoke"):
    spec = importlib.util.spec_from_file_location("rl_quickstart", CONFIG)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m.get_config(preset)


def test_eval_command_carries_an_agent_override(tmp_path):
    cfg = _config()
    assert cfg.agent.max_turns == 6
    cfg.agent.max_turns = 8  # as --config.agent.max_turns=8 does
    path = write_agent_config(cfg, str(tmp_path))
    cmd = shlex.split(eval_command("SUITE", "CKPT", cfg.rl, 0, "OUT", path))
    spec = cmd[cmd.index("--agent-config") + 1]
    assert spec == path and load_agent_config(spec).max_turns == 8
    assert load_agent_config(spec).tools == load_agent_config(CONFIG + ":smoke").tools
    # positive control: the config file alone gives the file's value, not the run's
    assert load_agent_config(CONFIG + ":smoke").max_turns == 6


def test_every_rl_quickstart_preset_validates(tmp_path):
    """Each preset of the config file builds and passes validation before any compute (a preset that
    wrote a key the validators do not know would fail here, not minutes into a run). A preset that
    starts from another run's cold start (`agent_sft.init_from="run:..."`) validates once that run
    exists, and fails validation naming the key while it does not."""
    import json

    import pytest

    from c2jax.config import ConfigError, validate

    spec = importlib.util.spec_from_file_location("rl_quickstart", CONFIG)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    finished = tmp_path / "finished_run"  # a finished run's layout: summary.json -> its agent_sft build dir
    (tmp_path / "build" / "agent_sft" / "checkpoints").mkdir(parents=True)
    finished.mkdir()
    (finished / "summary.json").write_text(json.dumps({"agent_sft": {"build_dir": str(tmp_path / "build")}}))
    for preset in m.PRESETS:
        cfg = m.get_config("" if preset == "default" else preset)
        if str(cfg.agent_sft.init_from).startswith("run:"):
            cfg.agent_sft.init_from = f"run:{tmp_path / 'not_run_yet'}"
            with pytest.raises(ConfigError, match="agent_sft.init_from"):
                validate(cfg, warn=False)
            cfg.agent_sft.init_from = f"run:{finished}"
        validate(cfg, warn=False)
    # the default's cold start is kind-balanced; the presets measured unbalanced say so
    assert m.get_config("").agent_sft.balance == m.get_config("kind_balanced").agent_sft.balance == "kind"
    assert m.get_config("retry").agent_sft.balance == m.get_config("smoke").agent_sft.balance == "none"


def test_more_samples_than_k_are_in_the_command_and_fewer_fail_validation(tmp_path):
    """`rl.eval.samples` > k: the command samples that many per task and still reports pass@1 and
    pass@k (`--k SAMPLES --ks 1,K`); unset, it is k and the command is the one it always was; fewer
    than k fails validation naming both keys."""
    import pytest

    from c2jax.config import ConfigError, validate

    cfg = _config("")
    assert cfg.rl.eval.samples == 16 and cfg.rl.eval.k == 8  # the quickstart's default
    cfg.rl.eval.samples = None  # unset: k samples per task
    path = write_agent_config(cfg, str(tmp_path))
    plain = eval_command("SUITE", "CKPT", cfg.rl, 0, "OUT", path)
    assert "--k 8 --temperature" in plain and "--ks" not in plain
    cfg.rl.eval.k = 4  # overriding k alone still validates (samples follows it)
    validate(cfg, warn=False)
    assert "--k 4 --temperature" in eval_command("SUITE", "CKPT", cfg.rl, 0, "OUT", path)
    cfg.rl.eval.k = 8
    cfg.rl.eval.samples = 16
    validate(cfg, warn=False)
    cmd = shlex.split(eval_command("SUITE", "CKPT", cfg.rl, 0, "OUT", path))
    assert cmd[cmd.index("--k") + 1] == "16" and cmd[cmd.index("--ks") + 1] == "1,8"
    cfg.rl.eval.samples = 4
    with pytest.raises(ConfigError, match=r"eval\.samples.*eval\.k"):
        validate(cfg, warn=False)


def test_eval_command_passes_the_runs_compile_cache_on(tmp_path):
    """The command names the run's JAX compilation cache (`--compile-cache`, quoted) so rerunning it
    loads the executables the run compiled; without a cache (the positive control) the flag is absent.
    `active_compile_cache` reports the directory `enable_compile_cache` set, and None when it is off."""
    import jax

    from c2jax.compile_cache import active_compile_cache, enable_compile_cache

    cfg = _config()
    path = write_agent_config(cfg, str(tmp_path))
    assert "--compile-cache" not in eval_command("SUITE", "CKPT", cfg.rl, 0, "OUT", path, None)
    cache = str(tmp_path / "xla cache")
    cmd = shlex.split(eval_command("SUITE", "CKPT", cfg.rl, 0, "OUT", path, cache))
    assert cmd[cmd.index("--compile-cache") + 1] == cache and cmd[-2:] == ["--compile-cache", cache]
    before = jax.config.jax_compilation_cache_dir
    try:
        jax.config.update("jax_compilation_cache_dir", None)
        assert active_compile_cache() is None
        assert enable_compile_cache(cache) == active_compile_cache() == os.path.abspath(cache)
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
