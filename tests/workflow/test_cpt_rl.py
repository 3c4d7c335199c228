"""The micro CPT -> RL experiment behind cpt_loss_predicts_rl (c2jax.workflow.cpt_rl): the rule
language and its reward (fast), and one seed end to end with two budgets (slow)."""
from __future__ import annotations

import numpy as np
import pytest

from c2jax.workflow.cpt_rl import ADD, MUL, cpt_then_rl, rule_batch, rule_reward


def test_rule_language_and_reward():
    rows = rule_batch(np.random.default_rng(0), 256, 4, 16, noise=0.0)
    assert rows.shape == (4, 17) and ((MUL * rows[:, :-1] + ADD) % 256 == rows[:, 1:]).all()
    assert rule_reward(rows[0, 0], rows[0, 1:], 256) == 1.0
    wrong = rows[0, 1:].copy()
    wrong[3] = (wrong[3] + 1) % 256  # breaks the rule at 3 and, as the next token's predecessor, at 4
    assert rule_reward(rows[0, 0], wrong, 256) == pytest.approx(14 / 16)
    noisy = rule_batch(np.random.default_rng(1), 256, 64, 64, noise=0.1)
    follow = ((MUL * noisy[:, :-1] + ADD) % 256 == noisy[:, 1:]).mean()
    assert 0.75 < follow < 0.9  # about (1 - noise)^2 of the pairs keep the rule
    with pytest.raises(ValueError, match="rl_steps"):
        cpt_then_rl(0, [0, 10], rl_steps=0)


@pytest.mark.slow
def test_cpt_then_rl_one_seed():
    rows = cpt_then_rl(0, [0, 60], rl_steps=2, eval_prompts=16)
    assert [r["budget"] for r in rows] == [0, 60]
    assert rows[0]["cpt_loss"] == pytest.approx(np.log(256), abs=0.1) and rows[1]["cpt_loss"] < 2.5
    assert rows[1]["reward_after"] > rows[0]["reward_after"] + 0.2
