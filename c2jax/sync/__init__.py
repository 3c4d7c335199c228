"""Weight sync between the trainer and the inference engine (foundations floor: numpy, jax, zstandard).

The trainer publishes each version as a zstd-compressed XOR-of-bits delta against its previous
upload, with a full snapshot every ``full_every`` uploads, from a background thread; the engine's
side rebuilds a version by applying the chain, verified bit for bit. API (weight_store.py):

    pub = WeightPublisher(store_dir_or_None, full_every=10, wire_dtype="bfloat16")
    fut = pub.publish(params, version)            # non-blocking; fut.result() -> PublishStats
    pub.publish_stats.identical_share             # {dtype: share of bit-identical elements vs the last upload}
    pub.publish_stats.stored_over_raw             # delta bytes / full (uncompressed) bytes
    sub = WeightSubscriber(store_dir or pub.store)
    sub.latest(); params = sub.rebuild(version)   # nested dicts of read-only numpy arrays
    publish_to_engine(engine, sub, version)       # rebuild + engine.update_weights
    WeightSync(engine, {"mode": "delta", "full_every": 10})   # what an RL step calls (engine_sync.py)

Errors (errors.py) name the versions involved; see records.py for the file format.
"""
from c2jax.sync.codec import Held, PublishStats
from c2jax.sync.errors import (BaseMismatchError, CorruptRecordError, MissingLinkError, PublishError,
                               StaleRecordError, TreeMismatchError, WeightSyncError)
from c2jax.sync.stores import DirStore, MemoryStore, Store, open_store
from c2jax.sync.weight_store import WeightPublisher, WeightSubscriber, publish_to_engine, store_index
from c2jax.sync.engine_sync import WeightSync, resolve_weight_sync

__all__ = ["BaseMismatchError", "CorruptRecordError", "DirStore", "Held", "MemoryStore", "MissingLinkError",
           "PublishError", "PublishStats", "StaleRecordError", "Store", "TreeMismatchError", "WeightPublisher",
           "WeightSubscriber", "WeightSync", "WeightSyncError", "open_store", "publish_to_engine",
           "resolve_weight_sync", "store_index"]
