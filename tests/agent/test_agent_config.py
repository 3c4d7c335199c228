"""config.agent: defaults round-trip into HarnessConfig, every mistake is reported before compute."""
from __future__ import annotations

import ml_collections
import pytest

from c2jax.agent.config import agent_config_dict, harness_config_from
from c2jax.config import ConfigError, validate


def test_agent_section_round_trip_and_errors():
    cd = agent_config_dict(max_turns=7, summary_trigger_tokens=4000, tools={"bash_only": True})
    h = harness_config_from(cd)
    assert h.max_turns == 7 and h.summary_trigger_tokens == 4000 and h.tools.bash_only
    assert h.tools.tool_names() == ("run_terminal_cmd",)
    validate(ml_collections.ConfigDict({"agent": cd}))
    for bad, frag in [({"max_turns": 0}, "max_turns"), ({"tools": {"disabled": ["nope"]}}, "unknown tool"),
                      ({"tools": {"colour": 1}}, "unknown field"), ({"summary_trigger_tokens": -5}, "summary_trigger")]:
        d = agent_config_dict().to_dict()
        for k, v in bad.items():
            d[k] = dict(d[k], **v) if k == "tools" else v
        with pytest.raises(ConfigError, match=frag):
            validate(ml_collections.ConfigDict({"agent": d}, type_safe=False))
    with pytest.raises(ConfigError, match="unknown key"):
        agent_config_dict(max_turnz=3)
