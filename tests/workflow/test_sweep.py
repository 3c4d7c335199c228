"""Sweep planning and results, in-process and without running any cell: search-space parsing, bad
input named before anything runs, resume bookkeeping over pre-finished cells, the CSV and the seed
CIs (against scipy's t interval and a hand-computed one)."""
from __future__ import annotations

import json
import math
import os

import pytest

from c2jax.workflow import results
from c2jax.workflow.space import SpaceError, parse_grid, parse_random, points, split_top_level
from c2jax.workflow.sweep import DONE, SweepError, plan_sweep, run_sweep
from _paths import REPO_ROOT  # noqa: E402

ROOT = REPO_ROOT
TINY = os.path.join(ROOT, "experiments", "configs", "tiny.py")


def test_grid_parsing_keeps_values_as_command_line_text():
    assert parse_grid("rl.rewards.length.q=[0,0.5,1,2]") == ("rl.rewards.length.q", ["0", "0.5", "1", "2"])
    assert parse_grid("--config.model.moe.impl=[dropless, 'capacity']") == ("model.moe.impl", ["dropless", "capacity"])
    assert split_top_level('1,[2,3],"a,b"') == ["1", "[2,3]", '"a,b"']
    for bad in ("q=0.5", "q=[]", "q=[1,1]", "=[1]", "seed=[0,1]", "q=[1,[2]"):
        with pytest.raises(SpaceError):
            parse_grid(bad)


def test_points_product_and_reproducible_random_search():
    pts = points(["a.x=[1,2]", "b=[p,q,r]"])
    assert len(pts) == 6 and {"a.x": "2", "b": "q"} in pts
    r1 = points([], ["lr=loguniform(1e-4,1e-2)", "n=randint(1,3)", "c=choice([u,v])"], samples=50, search_seed=3)
    r2 = points([], ["lr=loguniform(1e-4,1e-2)", "n=randint(1,3)", "c=choice([u,v])"], samples=50, search_seed=3)
    assert r1 == r2 and len(r1) == 50
    assert all(1e-4 <= float(p["lr"]) <= 1e-2 and p["n"] in {"1", "2", "3"} and p["c"] in {"u", "v"} for p in r1)
    assert len(points(["a=[1,2]"], ["lr=uniform(0,1)"], samples=3)) == 6
    assert points([]) == [{}]
    for bad in (dict(grid=["a=[1]", "a=[2]"]), dict(grid=[], random_specs=["lr=uniform(1,0)"], samples=1),
                dict(grid=[], random_specs=["lr=loguniform(0,1)"], samples=1),
                dict(grid=[], random_specs=["lr=uniform(0,1)"], samples=0), dict(grid=[], samples=2)):
        with pytest.raises(SpaceError):
            points(**bad)


def test_unknown_key_and_out_of_range_value_fail_before_anything_runs(tmp_path):
    work = tmp_path / "sw"
    with pytest.raises(SweepError) as e:
        plan_sweep(TINY, str(work), grid=["smoke.stepz=[1,2]"])
    assert "smoke.stepz" in str(e.value) and "unknown key" in str(e.value)
    with pytest.raises(SweepError) as e:
        plan_sweep(TINY, str(work), grid=["smoke.learning_rate=[1e-3,-1]"], seeds=2)
    msg = str(e.value)
    assert "smoke.learning_rate" in msg and "-1" in msg and "1e-3" not in msg.split("bad cell")[1].split(":")[0]
    assert msg.count("cell smoke.learning_rate=-1") == 2  # both seeds of the bad point named
    with pytest.raises(SweepError, match="model.moe.impl"):
        plan_sweep(TINY, str(work), grid=["model.moe.impl=[magic]"])
    with pytest.raises(SweepError, match="smoke.steps"):  # unparsable value for an int field
        plan_sweep(TINY, str(work), grid=["smoke.learning_rate=[1e-3]"], fixed={"smoke.steps": "abc"})
    with pytest.raises(SweepError, match="both fixed and swept"):
        plan_sweep(TINY, str(work), grid=["smoke.steps=[1]"], fixed={"smoke.steps": "2"})
    with pytest.raises(SweepError, match="config file not found"):
        plan_sweep("experiments/configs/nope.py", str(work))
    assert not work.exists()  # nothing written, nothing run


def test_sweep_cli_bad_input_exit_2(tmp_path, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("sweep_cli", os.path.join(ROOT, "experiments", "sweep.py"))
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    rc = cli.main(["--config", TINY, "--workdir", str(tmp_path / "w"), "--grid", "smoke.seq_len=[1]"])
    assert rc == 2 and "smoke.seq_len" in capsys.readouterr().err
    rc = cli.main(["--config", TINY, "--workdir", str(tmp_path / "w"), "--grid", "smoke.steps=[1]", "--x", "nope"])
    assert rc == 2 and "not a swept key" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


def _prefinish(plan, losses):
    """Mark the plan's cells finished as a real run + sweep would (summary.json, then DONE.json)."""
    for cell, loss in zip(plan.cells, losses):
        os.makedirs(cell.dir, exist_ok=True)
        json.dump({"smoke": {"final_loss": loss, "loss_decreased": True, "losses": [1.0, loss], "moe_impl": "x"}},
                  open(os.path.join(cell.dir, "summary.json"), "w"))
        json.dump({"identity": cell.identity(plan.config, plan.fixed)}, open(os.path.join(cell.dir, DONE), "w"))


def test_finished_cells_are_not_rerun_and_results_have_seed_cis(tmp_path):
    plan = plan_sweep(TINY, str(tmp_path / "sw"), grid=["smoke.learning_rate=[1e-3,3e-3]"], seeds=3,
                      fixed={"smoke.steps": "2"})
    assert len(plan.cells) == 6 and plan.swept_keys == ["smoke.learning_rate"]
    losses = [5.0, 5.2, 5.6, 4.0, 4.1, 4.5]  # cells in order: lr=1e-3 seeds 0..2, lr=3e-3 seeds 0..2
    _prefinish(plan, losses)
    logs = []
    res = run_sweep(plan, metric="smoke.final_loss", log=logs.append)
    assert res.ran == [] and res.ok and "6 already finished, 0 to run" in logs[0]
    rows = results.read_csv(res.csv_path)
    assert len(rows) == 6 and rows[0]["config.smoke.learning_rate"] == "1e-3"
    assert {"smoke.final_loss", "smoke.loss_decreased", "smoke.moe_impl"} <= set(rows[0]) and "smoke.losses" not in rows[0]
    assert os.path.getsize(res.plot_path) > 1000
    by_x = {t["x"]: t for t in res.table}
    # hand computation for lr=1e-3: mean 5.2667, sd = 0.3055, t_{0.975,2} = 4.302653
    sd = math.sqrt(((5.0 - 5.2666667) ** 2 + (5.2 - 5.2666667) ** 2 + (5.6 - 5.2666667) ** 2) / 2)
    assert by_x["1e-3"]["mean"] == pytest.approx(5.2666667, abs=1e-6) and by_x["1e-3"]["n"] == 3
    assert by_x["1e-3"]["ci95"] == pytest.approx(4.302653 * sd / math.sqrt(3), rel=1e-5)
    from scipy import stats

    lo, hi = stats.t.interval(0.95, 2, loc=by_x["3e-3"]["mean"], scale=stats.sem([4.0, 4.1, 4.5]))
    assert by_x["3e-3"]["ci95"] == pytest.approx((hi - lo) / 2, rel=1e-9)


def test_done_marker_of_another_cell_is_refused(tmp_path):
    plan = plan_sweep(TINY, str(tmp_path / "sw"), grid=["smoke.learning_rate=[1e-3]"], fixed={"smoke.steps": "2"})
    _prefinish(plan, [5.0])
    other = plan_sweep(TINY, str(tmp_path / "sw"), grid=["smoke.learning_rate=[1e-3]"], fixed={"smoke.steps": "3"})
    with pytest.raises(SweepError, match="different run"):
        run_sweep(other, log=lambda s: None)


def test_summary_without_done_marker_is_not_finished(tmp_path):
    """A killed run can leave summary.json of an early stage: only DONE.json (written by the sweep after
    exit status 0) marks the cell finished."""
    plan = plan_sweep(TINY, str(tmp_path / "sw"), grid=["smoke.learning_rate=[1e-3]"])
    _prefinish(plan, [5.0])
    os.remove(os.path.join(plan.cells[0].dir, DONE))
    assert not plan.is_done(plan.cells[0])


def test_flatten_keeps_scalars_with_dotted_keys():
    flat = results.flatten({"rl": {"pass_at_1_after": 0.5, "eval": {"k": 8, "ok": True, "name": None}, "xs": [1, 2]}})
    assert flat == {"rl.pass_at_1_after": 0.5, "rl.eval.k": 8, "rl.eval.ok": True, "rl.eval.name": None}
    assert math.isnan(results.mean_ci([3.0])[1]) and results.mean_ci([])[2] == 0
