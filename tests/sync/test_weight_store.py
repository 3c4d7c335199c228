"""WeightPublisher / WeightSubscriber: chains, background publishing, stats and every bad input
(each with a positive control: the same operation succeeds on the intact store)."""
from __future__ import annotations

import os
import shutil
import threading

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from c2jax.sync import (BaseMismatchError, CorruptRecordError, DirStore, MemoryStore, MissingLinkError, PublishError,
                        StaleRecordError, TreeMismatchError, WeightPublisher, WeightSubscriber, WeightSync,
                        publish_to_engine, resolve_weight_sync, store_index)
from c2jax.sync.deltas import changed_share_by_dtype, flatten_tree
from c2jax.sync.records import record_name


def _bits(x) -> bytes:
    return np.ascontiguousarray(np.asarray(x)).reshape(-1).view(np.uint8).tobytes()


def _params(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"layers": [{"w": rng.standard_normal((32, 16)).astype(np.float32)} for _ in range(2)],
            "embed": rng.standard_normal((64, 16)).astype(np.float32),
            "count": np.arange(5, dtype=np.int32)}


def _step(p: dict, v: int, frac: float = 0.1) -> dict:
    """A new version: `frac` of each float leaf's elements move (deterministic)."""
    rng = np.random.default_rng(1000 + v)

    def upd(x):
        if x.dtype != np.float32:
            return x.copy()
        m = rng.random(x.shape) < frac
        return np.where(m, x + rng.standard_normal(x.shape).astype(np.float32), x).astype(np.float32)
    return {"layers": [{"w": upd(l["w"])} for l in p["layers"]], "embed": upd(p["embed"]), "count": p["count"] + v}


def _same(a, b) -> bool:
    fa, fb = flatten_tree(a), flatten_tree(b)
    return list(fa) == list(fb) and all(_bits(fa[k]) == _bits(fb[k]) and fa[k].dtype == fb[k].dtype for k in fa)


def _publish_versions(store, n: int, full_every: int = 3, **kw) -> list[dict]:
    out, p = [], _params()
    with WeightPublisher(store, full_every=full_every, **kw) as pub:
        for v in range(1, n + 1):
            p = _step(p, v)
            pub.publish(p, v)
            out.append(p)
    return out


def test_chain_layout_and_rebuild_of_every_version(tmp_path):
    versions = _publish_versions(str(tmp_path), 7, full_every=3, keep_full=None, workers=3)  # leaves in parallel
    idx = store_index(DirStore(str(tmp_path)))
    assert [(v, r.kind, r.base_version) for v, r in sorted(idx.items())] == [
        (1, "full", None), (2, "delta", 1), (3, "delta", 2), (4, "full", None), (5, "delta", 4),
        (6, "delta", 5), (7, "full", None)]
    for v in (6, 2, 7, 3, 1):  # fresh reader per version: rebuilt from the nearest full snapshot
        assert _same(WeightSubscriber(str(tmp_path)).rebuild(v), versions[v - 1])
    sub = WeightSubscriber(str(tmp_path), workers=2)
    for v in range(1, 8):  # one reader walking forward: applies only the new records
        assert _same(sub.rebuild(v), versions[v - 1]) and sub.version == v
    assert sub.latest() == 7 and _same(sub.rebuild(), versions[-1])
    assert _same(sub.rebuild(5), versions[4])  # going back: from full 4


def test_stats_match_a_brute_force_count_and_sizes():
    store = MemoryStore()
    p1 = _params()
    p2 = _step(p1, 2, frac=0.05)
    with WeightPublisher(store, full_every=10) as pub:
        s1 = pub.publish(p1, 1).result()
        s2 = pub.publish(p2, 2).result()
        s3 = pub.publish(p2, 3).result()  # nothing changed
    want = changed_share_by_dtype(flatten_tree(p1), flatten_tree(p2))
    assert s2.identical_share == pytest.approx(want) and 0.9 < want["float32"] < 0.99
    assert s2.identical_share["int32"] == 0.0  # count += 2 changes every element
    assert s1.kind == "full" and s1.identical_share is None
    raw = sum(x.nbytes for x in flatten_tree(p1).values())
    assert s1.raw_bytes == s2.raw_bytes == raw
    assert s2.stored_over_raw == s2.stored_bytes / raw and s2.stored_bytes < s1.stored_bytes
    assert s3.identical_share == {"float32": 1.0, "int32": 1.0} and s3.stored_over_raw < 0.05
    m = s2.metrics()
    assert m["weight_sync/identical_share/float32"] == want["float32"] and m["weight_sync/is_full"] == 0.0
    assert pub.publish_stats is s3 and [s.version for s in pub.history] == [1, 2, 3]


def test_wire_dtype_publishes_bf16_of_f32_masters():
    p = {"w": jnp.asarray(np.random.default_rng(0).standard_normal((8, 8)), jnp.float32),
         "i": jnp.arange(3, dtype=jnp.int32)}
    with WeightPublisher(None, wire_dtype="bfloat16") as pub:
        pub.publish(p, 1).result()
        sub = WeightSubscriber(pub.store)
        got = sub.rebuild(1)
    assert got["w"].dtype == np.dtype(ml_dtypes.bfloat16) and got["i"].dtype == np.int32
    assert _bits(got["w"]) == _bits(np.asarray(p["w"].astype(jnp.bfloat16)))
    with pytest.raises(ValueError, match="floating"):
        WeightPublisher(None, wire_dtype="int8")


def test_publish_returns_before_the_worker_writes_and_applies_back_pressure():
    gate = threading.Event()

    class SlowStore(MemoryStore):
        def put(self, name, data):
            gate.wait(30)
            super().put(name, data)

    store = SlowStore()
    pub = WeightPublisher(store, max_pending=1)
    p = _params()
    fut = pub.publish(p, 1)
    assert not fut.done() and store.names() == []  # publish returned while the write is blocked
    p["embed"][:] = 0.0  # the caller may overwrite its buffers at once: the snapshot was copied
    second_returned = threading.Event()
    t = threading.Thread(target=lambda: (pub.publish(_step(p, 2), 2), second_returned.set()))
    t.start()
    t.join(0.3)
    assert not second_returned.is_set()  # max_pending=1: the second publish waits for a slot
    gate.set()
    t.join(30)
    pub.close()
    assert second_returned.is_set() and fut.result().version == 1
    assert _same(WeightSubscriber(store).rebuild(1), _params())


def test_donated_jax_buffers_do_not_reach_the_worker():
    """publish() snapshots jax leaves on device; the buffers may be donated right after."""
    import jax

    gate = threading.Event()

    class GatedStore(MemoryStore):
        def put(self, name, data):
            gate.wait(30)
            super().put(name, data)

    step = jax.jit(lambda t: jax.tree_util.tree_map(lambda x: x * 2.0 + 1.0, t), donate_argnums=0)
    p = {"w": jnp.arange(1024, dtype=jnp.float32)}
    want = np.asarray(p["w"]).copy()
    store = GatedStore()
    pub = WeightPublisher(store, max_pending=2)
    pub.publish(p, 1)
    q = step(p)
    if not p["w"].is_deleted():
        pytest.skip("this backend did not donate the buffer")  # control: donation really happened
    pub.publish(q, 2)
    gate.set()
    pub.close()
    sub = WeightSubscriber(store)
    assert _bits(sub.rebuild(1)["w"]) == _bits(want) and _bits(sub.rebuild(2)["w"]) == _bits(want * 2 + 1)


def test_corrupt_record_is_named_and_reader_keeps_its_weights(tmp_path):
    versions = _publish_versions(str(tmp_path), 4, full_every=10)
    sub = WeightSubscriber(str(tmp_path))
    assert _same(sub.rebuild(2), versions[1])  # control
    path = os.path.join(str(tmp_path), record_name(3, "delta", 2))
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x10
    open(path, "wb").write(bytes(data))
    with pytest.raises(CorruptRecordError, match="version 3") as e:
        sub.rebuild(4)
    assert e.value.version == 3 and "checksum" in e.value.reason
    assert sub.version == 2 and _same(sub.rebuild(2), versions[1])  # still the intact version 2
    with pytest.raises(CorruptRecordError):
        WeightSubscriber(str(tmp_path)).rebuild(3)
    open(path, "wb").write(bytes(data[:100]))  # truncated
    with pytest.raises(CorruptRecordError):
        WeightSubscriber(str(tmp_path)).rebuild(3)


def test_stale_record_copied_under_a_newer_name(tmp_path):
    versions = _publish_versions(str(tmp_path), 4, full_every=10)
    assert _same(WeightSubscriber(str(tmp_path)).rebuild(4), versions[3])  # control
    d = str(tmp_path)
    # an old delta (2 from 1) replayed as 3-from-2: labels in the file disagree with its name
    shutil.copyfile(os.path.join(d, record_name(2, "delta", 1)), os.path.join(d, record_name(3, "delta", 2)))
    sub = WeightSubscriber(d)
    with pytest.raises(StaleRecordError, match="should hold version 3") as e:
        sub.rebuild(3)
    assert e.value.version == 2 and sub.version == 2 and _same(sub.rebuild(2), versions[1])


def test_stale_and_wrong_base_on_the_push_path():
    store = MemoryStore()
    versions = _publish_versions(store, 3, full_every=10)
    names = {v: r.name for v, r in store_index(store).items()}
    sub = WeightSubscriber(store)
    assert sub.apply(store.get(names[1]), names[1]) == 1  # control: in order it works
    with pytest.raises(BaseMismatchError) as e:
        sub.apply(store.get(names[3]), names[3])  # 3 is a delta from 2; the reader holds 1
    assert (e.value.version, e.value.base_version, e.value.held_version) == (3, 2, 1)
    assert sub.apply(store.get(names[2]), names[2]) == 2
    with pytest.raises(StaleRecordError) as e2:
        sub.apply(store.get(names[2]), names[2])  # replayed
    assert (e2.value.version, e2.value.held_version) == (2, 2)
    assert sub.apply(store.get(names[3]), names[3]) == 3
    assert _same(sub.rebuild(3), versions[2])


def test_delta_from_another_run_with_the_same_version_numbers_is_refused():
    run_a, run_b = MemoryStore(), MemoryStore()
    _publish_versions(run_a, 2, full_every=10)
    p = _params(seed=7)
    with WeightPublisher(run_b) as pub:  # same version numbers, other weights
        pub.publish(p, 1)
        pub.publish(_step(p, 2), 2)
    sub = WeightSubscriber(run_a)
    sub.rebuild(1)
    delta_b = run_b.get(record_name(2, "delta", 1))
    assert WeightSubscriber(run_b).rebuild(1) is not None
    with pytest.raises(BaseMismatchError, match="base digest differs"):
        sub.apply(delta_b, record_name(2, "delta", 1))
    assert sub.apply(run_a.get(record_name(2, "delta", 1)), record_name(2, "delta", 1)) == 2  # control


def test_missing_link_names_the_missing_version(tmp_path):
    versions = _publish_versions(str(tmp_path), 5, full_every=10)
    d = str(tmp_path)
    assert _same(WeightSubscriber(d).rebuild(5), versions[4])  # control
    os.unlink(os.path.join(d, record_name(3, "delta", 2)))
    with pytest.raises(MissingLinkError) as e:
        WeightSubscriber(d).rebuild(5)
    assert (e.value.version, e.value.missing) == (5, 3)
    with pytest.raises(MissingLinkError, match="never published or pruned"):
        WeightSubscriber(d).rebuild(9)
    with pytest.raises(MissingLinkError, match="no weights yet"):
        WeightSubscriber(MemoryStore()).rebuild()
    assert _same(WeightSubscriber(d).rebuild(2), versions[1])  # what is still there still rebuilds


def test_pruning_keeps_the_last_full_snapshots_and_readers_recover():
    store = MemoryStore()
    sub = WeightSubscriber(store)
    p = _params()
    with WeightPublisher(store, full_every=3, keep_full=1) as pub:
        for v in range(1, 9):
            p = _step(p, v)
            pub.publish(p, v).result()
            if v == 2:
                sub.rebuild()
    assert sorted(store_index(store)) == [7, 8]
    assert sub.version == 2 and _same(sub.rebuild(), p)  # from full 7, the held 2 is no longer on any chain
    with pytest.raises(MissingLinkError):
        WeightSubscriber(store).rebuild(5)


def test_publish_bad_input_is_refused_before_anything_is_written():
    store = MemoryStore()
    pub = WeightPublisher(store)
    p = _params()
    pub.publish(p, 3).result()
    for bad, err in [((p, 3), StaleRecordError), ((p, 2), StaleRecordError), ((p, -1), ValueError),
                     ((p, 4.0), ValueError), (({**p, "embed": p["embed"][:, :8]}, 4), TreeMismatchError),
                     (({**p, "extra": np.zeros(2)}, 4), TreeMismatchError), (({**p, "embed": 1.5}, 4), TreeMismatchError),
                     (({**p, "embed": p["embed"].astype(np.float64)}, 4), TreeMismatchError)]:
        with pytest.raises(err):
            pub.publish(*bad)
    pub.flush()
    assert sorted(store_index(store)) == [3]
    pub.publish(_step(p, 4), 4).result()  # control: a good publish still goes through, as a delta
    assert store_index(store)[4].kind == "delta"
    pub.close()
    with pytest.raises(RuntimeError, match="closed"):
        pub.publish(p, 5)
    for kw in ({"full_every": 0}, {"max_pending": 0}, {"keep_full": 0}, {"level": 99}, {"workers": 0}):
        with pytest.raises(ValueError):
            WeightPublisher(None, **kw)
    with pytest.raises(ValueError, match="existing store"):
        WeightSubscriber(None)


def test_a_new_run_does_not_interleave_with_a_previous_runs_versions():
    store = MemoryStore()
    _publish_versions(store, 5, full_every=10)
    p = _params(seed=3)
    with pytest.raises(StaleRecordError, match="earlier run"):
        WeightPublisher(store).publish(p, 3)
    assert sorted(store_index(store)) == [1, 2, 3, 4, 5]  # nothing dropped without consent
    with WeightPublisher(store, replace_newer=True) as pub:
        pub.publish(p, 3)
    assert sorted(store_index(store)) == [1, 2, 3] and store_index(store)[3].kind == "full"
    assert _same(WeightSubscriber(store).rebuild(3), p)


def test_a_failed_background_publish_is_raised_and_the_next_upload_is_full():
    class FlakyStore(MemoryStore):
        fail = False

        def put(self, name, data):
            if self.fail:
                raise OSError("disk full")
            super().put(name, data)

    store = FlakyStore()
    pub = WeightPublisher(store, full_every=100)
    p = _params()
    pub.publish(p, 1).result()
    store.fail = True
    with pytest.raises(OSError):
        pub.publish(_step(p, 2), 2).result()
    store.fail = False
    with pytest.raises(PublishError, match="version 2 failed: OSError: disk full"):
        pub.publish(_step(p, 3), 3)
    st = pub.publish(_step(p, 3), 3).result()  # raised once; then publishing resumes
    assert st.kind == "full"  # version 2 never reached the store: no delta may chain through it
    pub.close()
    assert _same(WeightSubscriber(store).rebuild(3), _step(p, 3))


class _FakeEngine:
    def __init__(self):
        self.updates = []

    def update_weights(self, params, version):
        self.updates.append((version, params))


def test_publish_to_engine_and_weight_sync_modes():
    p = _params()
    eng = _FakeEngine()
    with WeightPublisher(None) as pub:
        pub.publish(p, 1)
        pub.flush()
        assert publish_to_engine(eng, WeightSubscriber(pub.store)) == 1
    assert eng.updates[0][0] == 1 and _same(eng.updates[0][1], p)

    direct = WeightSync(eng)
    direct.publish(p, 2)
    assert eng.updates[-1] == (2, p) and direct.metrics() == {}
    sync = WeightSync(eng, {"mode": "delta", "full_every": 2})
    q = p
    for v in range(3, 7):
        q = _step(q, v)
        sync.publish(q, v)
    assert sync.wait() == 6
    assert [v for v, _ in eng.updates[-4:]] == [3, 4, 5, 6] and _same(eng.updates[-1][1], q)
    n_records = len(sync.publisher.store.names())
    sync.publish(q, 6)  # re-send (a restarted engine): delivered again from the store, nothing written
    assert sync.wait() == 6 and eng.updates[-1][0] == 6 and _same(eng.updates[-1][1], q)
    assert len(sync.publisher.store.names()) == n_records
    with pytest.raises(StaleRecordError):
        sync.publish(q, 5)
    assert sync.metrics()["weight_sync/version"] == 6.0
    sync.close()


def test_resolve_weight_sync_defaults_and_errors():
    assert resolve_weight_sync(None)["mode"] == "direct"
    assert resolve_weight_sync({"mode": "delta", "full_every": 5})["full_every"] == 5
    with pytest.raises(ValueError) as e:
        resolve_weight_sync({"mode": "xor", "full_every": 0, "wire_dtype": "int8", "bogus": 1, "level": 30})
    msg = str(e.value)
    for part in ("mode must be", "full_every must be", "wire_dtype must be", "unknown key 'bogus'", "level must be"):
        assert part in msg


def test_weight_sync_skips_a_version_pruned_behind_a_newer_snapshot():
    gate, entered = threading.Event(), threading.Event()

    class SlowEngine(_FakeEngine):
        def update_weights(self, params, version):
            entered.set()
            gate.wait(30)
            super().update_weights(params, version)

    eng = SlowEngine()
    sync = WeightSync(eng, {"mode": "delta", "full_every": 1, "keep_full": 1})
    p = _params()
    sync.publish(p, 1)  # its delivery blocks inside the engine ...
    assert entered.wait(30)  # ... once the reader got to it (on a loaded machine it may read 2 first)
    for v in (2, 3):
        p = _step(p, v)
        sync.publish(p, v)
    sync.publisher.flush()
    assert sorted(store_index(sync.publisher.store)) == [3]  # 2 was pruned before the reader got to it
    gate.set()
    assert sync.wait() == 3
    assert [v for v, _ in eng.updates] == [1, 3] and _same(eng.updates[-1][1], p)
    sync.close()
