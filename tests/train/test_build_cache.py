"""`build_cache`: cached build stages are keyed stage by stage, so a change to a later build stage's
own sections reuses the earlier stages, and a change to anything an earlier stage reads rebuilds
every stage after it. Pure config arithmetic: nothing runs."""
from __future__ import annotations

import json
import os

from c2jax.train.stages import _inherit_data_pin, build_cache
from experiments.configs import rl_quickstart


def _dirs(*overrides: tuple[str, object]) -> dict[str, str]:
    config = rl_quickstart.get_config("default")
    for path, value in overrides:
        node = config
        *parents, leaf = path.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    stages, dirs, _ = build_cache(config)
    assert stages == ["cpt", "agent_sft"]
    return dirs


def test_later_stage_directory_nests_under_the_earlier_one():
    d = _dirs()
    assert os.path.dirname(d["agent_sft"]) == d["cpt"]
    assert os.path.basename(d["agent_sft"]).startswith("agent_sft-")


def test_sft_only_changes_reuse_the_cpt_directory():
    base = _dirs()
    for change in (("agent_sft.steps", 450), ("agent.max_turns", 5), ("rl.tasks.n_demo", 512)):
        d = _dirs(change)
        assert d["cpt"] == base["cpt"], change
        assert d["agent_sft"] != base["agent_sft"], change


def test_changes_an_earlier_stage_reads_rebuild_everything():
    base = _dirs()
    for change in (("train.steps", 900), ("model.hidden_size", 64), ("data.vocab_size", 2048)):
        d = _dirs(change)
        assert d["cpt"] != base["cpt"] and d["agent_sft"] != base["agent_sft"], change


def test_seed_and_rl_stage_keys_change_no_build_directory():
    base = _dirs()
    for change in (("seed", 1), ("rl.learning_rate", 1e-4), ("rl.group_size", 4), ("rl.eval.k", 4)):
        assert _dirs(change) == base, change


def test_data_pin_is_inherited_by_the_next_stage(tmp_path):
    dirs = {"cpt": str(tmp_path / "a"), "agent_sft": str(tmp_path / "a" / "agent_sft-x")}
    os.makedirs(dirs["cpt"])
    pin = {"corpus_dir": "/somewhere", "manifest_hash": "abc"}
    with open(os.path.join(dirs["cpt"], "data.json"), "w") as f:
        json.dump(pin, f)
    _inherit_data_pin(["cpt", "agent_sft"], dirs, "agent_sft")
    assert json.load(open(os.path.join(dirs["agent_sft"], "data.json"))) == pin
    # an existing pin is never overwritten (a resumed stage keeps the artefacts it started with)
    with open(os.path.join(dirs["cpt"], "data.json"), "w") as f:
        json.dump({"corpus_dir": "/elsewhere"}, f)
    _inherit_data_pin(["cpt", "agent_sft"], dirs, "agent_sft")
    assert json.load(open(os.path.join(dirs["agent_sft"], "data.json"))) == pin


def test_a_changed_task_generator_or_demonstrator_rebuilds_the_family_and_the_cold_start(monkeypatch, tmp_path):
    """The demonstrations and the SFT checkpoint are made from the family's tasks, so a generator change
    (its version or code: `toyfix.generator_key`) or a demonstrator change must give a new family
    directory and a new SFT build directory, while CPT (which never reads the family) is reused.
    Positive control: with the generator and demonstrator unchanged, the directories are the same."""
    from c2jax.envs.synth import toyfix
    from c2jax.train import rl_family

    config = rl_quickstart.get_config("default")
    base, base_family = _dirs(), rl_family.family_dir(config)
    assert _dirs() == base and rl_family.family_dir(config) == base_family  # control: deterministic
    monkeypatch.setattr(toyfix, "GENERATOR_VERSION", toyfix.GENERATOR_VERSION + "-changed")
    changed, changed_family = _dirs(), rl_family.family_dir(config)
    assert changed["cpt"] == base["cpt"]
    assert changed["agent_sft"] != base["agent_sft"] and changed_family != base_family
    monkeypatch.undo()
    from c2jax.envs.synth import toyfix_shell_demos

    edited_copy = tmp_path / "toyfix_shell_demos.py"  # the demonstrator's source with one byte more
    edited_copy.write_bytes(open(toyfix_shell_demos.__file__, "rb").read() + b"#")
    monkeypatch.setattr(toyfix_shell_demos, "__file__", str(edited_copy))
    edited, edited_family = _dirs(), rl_family.family_dir(config)
    monkeypatch.undo()
    assert edited["cpt"] == base["cpt"]
    assert edited["agent_sft"] != base["agent_sft"] and edited_family != base_family
