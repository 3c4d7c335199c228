"""One process of the 2-process x 4-CPU-device test (tests/model/parallel/test_sharding_multiprocess.py).

Environment: C2JAX_COORDINATOR=127.0.0.1:PORT, C2JAX_NUM_PROCESSES=2, C2JAX_PROCESS_ID=p (read by
experiments/run.py's `maybe_initialize_distributed`), argv: OUT_DIR CKPT_DIR.
Writes OUT_DIR/result_<p>.json with the sharded losses, the single-device reference losses
(computed by this process on one local device), and the checkpoint restore checks.
"""
import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE), os.path.join(os.path.dirname(HERE), "experiments")]

import json  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from run import maybe_initialize_distributed  # noqa: E402  (experiments/run.py)


def main(out_dir: str, ckpt_dir: str) -> None:
    maybe_initialize_distributed()
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding, PartitionSpec as P

    from _sharding_common import LOSS, packed_batch, tiny_cfg, tiny_params
    from c2jax.model.params_spec import logical_axes, trainable_mask
    from c2jax.model.parallel.sharded import abstract_state, jit_train_step, sharded_apply_fn, state_shardings
    from c2jax.model.parallel.sharding import MeshConfig, batch_shardings, global_batch, make_mesh
    from c2jax.train import optim
    from c2jax.checkpoint import Checkpointer
    from c2jax.train.pretrain import model_apply_fn
    from c2jax.train.state import TrainState
    from c2jax.train.step import make_train_step

    pid, nproc = jax.process_index(), jax.process_count()
    assert nproc == 2 and jax.device_count() == 8 and jax.local_device_count() == 4
    cfg = tiny_cfg()
    params = tiny_params(cfg)
    B, S, steps = 8, 32, 2
    batches = [packed_batch(cfg, B, S, seed=20 + i) for i in range(steps)]

    def new_state():
        sched = optim.make_schedule({"name": "constant", "peak_lr": 3e-3}, 10)
        tx = optim.make_optimizer({"name": "adamw", "weight_decay": 0.01}, sched, params,
                                  trainable=trainable_mask(cfg), axes=logical_axes(cfg))
        return TrainState.create(params, tx)

    # single-device reference on this process's first device
    with jax.default_device(jax.local_devices()[0]):
        ref_step = jax.jit(make_train_step(model_apply_fn(cfg), LOSS))
        st = new_state()
        ref = []
        for b in batches:
            st, m = ref_step(st, b)
            ref.append(float(m["loss"]))

    # sharded: data=2 spans the processes, expert and context inside each
    mesh = make_mesh(MeshConfig(data=2, expert=2, context=2))
    state = new_state()
    ssh = state_shardings(state, cfg, mesh)
    put = lambda x, s: jax.make_array_from_callback(np.shape(x), s, lambda idx: np.asarray(x)[idx])
    state = jax.tree_util.tree_map(put, state, ssh)
    bsh = batch_shardings(batches[0], mesh)
    step = jit_train_step(make_train_step(sharded_apply_fn(cfg, mesh), LOSS), ssh, bsh)
    rows = slice(pid * B // nproc, (pid + 1) * B // nproc)  # the loader's per-process slice
    losses = []
    for b in batches:
        state, m = step(state, global_batch({k: v[rows] for k, v in b.items()}, mesh))
        losses.append(float(m["loss"]))

    ck = Checkpointer(ckpt_dir, async_save=True)
    ck.save(steps, state.to_tree(), {"step": steps})
    ck.close()
    saved = multihost_utils.process_allgather(state.to_tree(), tiled=True)

    # restore onto a different mesh: fsdp=4 x context=2 (weights re-sharded 8 ways)
    mesh2 = make_mesh(MeshConfig(fsdp=4, context=2))
    sh2 = state_shardings(state, cfg, mesh2)
    abstract = abstract_state(state.to_tree(), {"step": sh2.step, "params": sh2.params, "opt_state": sh2.opt_state})
    got_step, tree, loader, _ = Checkpointer(ckpt_dir).restore_latest(abstract)
    restored = multihost_utils.process_allgather(tree, tiled=True)
    same = all(np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(restored),
                                                    jax.tree_util.tree_leaves(saved)))
    shard_ok = all(a.sharding.is_equivalent_to(s.sharding, a.ndim) for a, s in
                   zip(jax.tree_util.tree_leaves(tree), jax.tree_util.tree_leaves(abstract)))
    emb = tree["params"]["embed"]["embedding"]
    emb_local, emb_size = int(emb.addressable_shards[0].data.size), int(emb.size)  # read before donation
    # one more step on the new mesh from the restored state
    state2 = state.replace(step=tree["step"], params=tree["params"], opt_state=tree["opt_state"])
    bsh2 = batch_shardings(batches[0], mesh2)
    step2 = jit_train_step(make_train_step(sharded_apply_fn(cfg, mesh2), LOSS), sh2, bsh2)
    state2, m2 = step2(state2, global_batch({k: v[rows] for k, v in batches[0].items()}, mesh2))
    with open(os.path.join(out_dir, f"result_{pid}.json"), "w") as f:
        json.dump({"ref": ref, "losses": losses, "restored_step": int(got_step), "loader": loader,
                   "identical": bool(same), "shardings_ok": bool(shard_ok),
                   "emb_local_shard_size": emb_local, "emb_size": emb_size,
                   "step_after_restore": int(state2.step), "loss_after_restore": float(m2["loss"])}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
