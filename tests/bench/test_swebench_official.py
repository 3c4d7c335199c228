"""The SWE-bench adapter against the official `swebench` package's own loaders (extra `clients`;
skipped, saying so, when it is not installed): it reads the same instance files (JSONL and JSON
array) and finds every instance id of the predictions.jsonl that `bench run --predictions` writes,
ids with '/' included (positive control: the old '/' -> '__' rewrite is not found)."""
from __future__ import annotations

import json
import os

import pytest

from _bench_common import DATA
from c2jax.bench.adapters import read_swebench
from c2jax.bench.adapters.swebench import task_id_for
from c2jax.bench.run import write_predictions

utils = pytest.importorskip("swebench.harness.utils", reason="swebench is not installed (pip install -e .[clients])")


def test_official_loaders_agree_and_find_our_prediction_ids(tmp_path):
    recs = [json.loads(line) for line in open(os.path.join(DATA, "swebench", "instances.jsonl")) if line.strip()]
    recs.append(dict(recs[0], instance_id="c2jax-fixtures/calc-9"))  # an id the old adapter rewrote
    jsonl, arr = tmp_path / "dataset.jsonl", tmp_path / "dataset.json"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in recs))
    arr.write_text(json.dumps(recs))
    ids = [r["instance_id"] for _, r in read_swebench(str(arr))]
    for path in (jsonl, arr):
        official = utils.load_swebench_dataset(str(path))
        assert [d["instance_id"] for d in official] == ids == [r["instance_id"] for _, r in read_swebench(str(path))]
    per_task = [{"instance_id": task_id_for(i), "category": "swebench", "samples": [{"diff": f"patch {i}"}]}
                for i in ids]
    pred = write_predictions(per_task, str(tmp_path / "predictions.jsonl"), "c2jax")
    preds = utils.get_predictions_from_file(pred, str(arr), "test")
    wanted = [p["instance_id"] for p in preds]
    assert wanted == ids
    assert len(utils.load_swebench_dataset(str(arr), instance_ids=wanted)) == len(ids)  # all found
    with pytest.raises(ValueError, match="not found"):  # positive control: the old rewrite
        utils.load_swebench_dataset(str(arr), instance_ids=[i.replace("/", "__") for i in ids])
