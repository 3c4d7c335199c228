"""The imitation-gap analysis: which operator each sample wrote, and the two reference policies'
pass rates computed from the family's own shares (checked by hand on a small made-up evaluation)."""
from __future__ import annotations

import json
import types

import pytest

from c2jax.train.rl_imitation_gap import analyse, main, report_lines, stage_summary, written_op


def _task(iid: str, op: str):
    return types.SimpleNamespace(instance_id=iid, provenance={"bugs": [{"new": f"    acc = x {op} y"}]})


def _diff(op: str) -> str:
    return ("diff --git a/p/m.py b/p/m.py\n--- a/p/m.py\n+++ b/p/m.py\n@@ -1,3 +1,3 @@ def f(x, y):\n"
            f"-    acc = x + y\n+    acc = x {op} y\n     return acc\n")


def test_written_op_reads_the_assignment_line_only():
    assert written_op(_diff("*")) == "*" and written_op(_diff("-")) == "-"
    assert written_op("") == "none"
    assert written_op(_diff("//")) == "other"
    two = _diff("*") + "+    other = x - y\n"
    assert written_op(two) == "other"  # two rewritten assignments: not one clean fix


def test_shares_pass_rates_and_references_by_hand():
    ev = [_task("a", "*"), _task("b", "*"), _task("c", "-")]
    demo = [_task(f"d{i}", "*" if i < 3 else "-") for i in range(4)]  # 3 of 4 demonstrations write `*`
    rows = [
        {"instance_id": "a", "samples": [{"diff": _diff("*"), "resolved": True}, {"diff": _diff("-"), "resolved": False}]},
        {"instance_id": "b", "samples": [{"diff": _diff("*"), "resolved": True}, {"diff": "", "resolved": False}]},
        {"instance_id": "c", "samples": [{"diff": _diff("*"), "resolved": False}, {"diff": _diff("-"), "resolved": True}]},
    ]
    r = analyse(rows, ev, demo)
    assert r["samples"] == 6 and r["share"] == {"*": 3 / 6, "-": 2 / 6, "none": 1 / 6, "other": 0.0}
    assert r["pass_at_1"] == pytest.approx(3 / 6) and r["pass_at_1_clean"] == pytest.approx(3 / 5)
    assert r["demo_share_mul"] == 0.75 and r["eval_share_mul"] == pytest.approx(2 / 3)
    assert r["imitation_reference"] == pytest.approx(0.75 * 2 / 3 + 0.25 * 1 / 3)
    assert r["likelier_fix_reference"] == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="not a held-out task"):
        analyse([{"instance_id": "zz", "samples": []}], ev, demo)


def test_cli_reads_a_bench_run_and_a_family(tmp_path, monkeypatch, capsys):
    from c2jax.envs import tasks as tasks_mod

    fam = tmp_path / "fam"
    fam.mkdir()
    ev, demo = [_task("a", "*")], [_task("d", "*"), _task("e", "-")]
    monkeypatch.setattr(tasks_mod, "load_tasks", lambda p: ev if p.endswith("eval.jsonl") else demo)
    rows = [{"instance_id": "a", "samples": [{"diff": _diff("*"), "resolved": True}]}]
    stage_eval = tmp_path / "stage_eval"  # an RL stage's evaluation: rows.json beside results.json
    stage_eval.mkdir()
    (stage_eval / "rows.json").write_text(json.dumps(rows))
    (stage_eval / "results.json").write_text(json.dumps({"overall": {"pass@1": 1.0}}))
    bench_out = tmp_path / "bench_out"  # `bench run --out`: the rows inside results.json
    bench_out.mkdir()
    (bench_out / "results.json").write_text(json.dumps({"summary": {}, "tasks": rows}))
    argv = ["--eval", str(stage_eval), "--eval", str(bench_out), "--family", str(fam), "--out", str(tmp_path / "o.json")]
    assert main(argv) == 0
    assert capsys.readouterr().out.count("imitation 0.500, likelier fix 1.000") == 2
    res = json.loads((tmp_path / "o.json").read_text())
    assert res[str(stage_eval)]["pass_at_1"] == res[str(bench_out)]["pass_at_1"] == 1.0


def test_report_section_lists_each_policy_and_the_references():
    ev, demo = [_task("a", "*")], [_task("d", "*"), _task("e", "-")]
    rows = [{"instance_id": "a", "samples": [{"diff": _diff("*"), "resolved": True}, {"diff": _diff("-"), "resolved": False}]}]
    lines = report_lines({"before": analyse(rows, ev, demo), "after": analyse(rows[:1], ev, demo)})
    text = "\n".join(lines)
    assert "imitation (`*` at the demonstrations' share 0.500) 0.500, always the likelier fix 1.000" in text
    assert "| before | 2 | 0.500 | 0.500 | 0.000 | 0.000 | 0.500 |" in text


def test_stages_summarise_only_the_variant():
    ev, demo = [_task("a", "*")], [_task("d", "*")]
    rows = [{"instance_id": "a", "samples": [{"diff": _diff("*"), "resolved": True}]}]
    evals = {"before": {"rows": rows}, "after": {"rows": rows}}
    assert stage_summary({"tasks": {"ambiguous": 0.0}}, ev, demo, evals) is None
    got = stage_summary({"tasks": {"ambiguous": 0.75}}, ev, demo, evals)
    assert set(got) == {"before", "after"} and got["after"]["share"]["*"] == 1.0
