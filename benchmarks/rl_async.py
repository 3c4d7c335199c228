"""Asynchronous RL services vs the synchronous stage, under heavy-tailed environment latency.

    python benchmarks/rl_async.py                      # the latency model only (seconds)
    python benchmarks/rl_async.py --real [--steps 6] [--repeats 3] [--staleness 2] [--env-mu 0.0] [--env-sigma 1.0]
    python benchmarks/rl_async.py --real --dry-run     # smallest real shapes (numbers meaningless)

Baseline: the synchronous stage itself (`c2jax.train.rl_step.rl_step`: roll out every group of a
step, then train, then publish), on the same model, engine slots, harness, tasks, latency draws and
number of trained samples. Every ratio below is async / sync of the SAME code base; there is no
external system to compare against.

Two parts:
1. The latency model (`c2jax.train.async_rl.simulate`, virtual time, the real `Reconciler`):
   rollout latency = policy tokens x s/token + environment time ~ lognormal(env_mu, env_sigma);
   for max_staleness in {0, 1, 2, 4}: wall time ratio vs the synchronous schedule for the same
   trained samples, trainer idle fraction, staleness histogram (never beyond the bound), drops; and
   the naive admission rule (control) with its stale drops and its shortened trained lengths.
2. ``--real``: the tiny rl_quickstart:smoke model shape (random init), the real harness, engine and
   sandbox on toyfix tasks, every grading preceded by a sleep ~ lognormal(env_mu, env_sigma)
   seconds (the sandbox/test latency of real tasks; sleeping costs no CPU, as a remote sandbox
   would not). One untimed synchronous warm-up step compiles; then ``--repeats`` times, on fresh
   tasks each time, three arms on the SAME tasks (same order) with the SAME latency for the k-th
   grading of each task: ``--steps`` synchronous steps, ``--steps`` asynchronous ones
   (``max_staleness = --staleness``, in-flight updates), and the asynchronous run without in-flight
   updates; the arms' order rotates between repeats. Printed per repeat and as the median over
   repeats: wall ratio async/sync, trainer idle fraction of each, staleness histograms; and
   |log pi_train - log pi_behaviour| by token position (the learner's logprobs before the update vs
   the sampler's, over loss tokens) with and without in-flight updates.

Timings on a shared or loaded machine are not results: rerun on an idle one. ``--out`` writes JSON.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HERE = os.path.dirname(os.path.abspath(__file__))


# ---- part 1: the latency model ---------------------------------------------------------------
def model_part(args) -> dict:
    from c2jax.train.async_rl.simulate import SimConfig, simulate, simulate_sync

    base = dict(steps=args.sim_steps, batch_groups=args.tasks_per_step, group_size=args.group_size,
                max_running=args.tasks_per_step, env_mu=args.env_mu, env_sigma=args.env_sigma,
                train_s=args.sim_train_s, seed=args.seed)
    sync = simulate_sync(SimConfig(**base))
    rows = []
    for s in (0, 1, 2, 4):
        r = simulate(SimConfig(**base, max_staleness=s))
        rows.append({"max_staleness": s, "wall_ratio": r.wall / sync.wall, "trainer_idle": r.trainer_idle_fraction,
                     "staleness_hist": r.staleness, "max_lag": max(r.staleness), "drops": r.drops,
                     "trained_len_mean": float(r.trained_lengths.mean())})
    naive = simulate(SimConfig(**dict(base, max_running=2 * args.tasks_per_step), max_staleness=1,
                               admission="unbounded"))
    out = {"sync_trainer_idle": sync.trainer_idle_fraction, "rows": rows,
           "control_unbounded": {"drops": naive.drops, "trained_len_mean": float(naive.trained_lengths.mean()),
                                 "completed_len_mean": float(naive.completed_lengths.mean())}}
    print(f"\n== latency model: {args.sim_steps} steps x {args.tasks_per_step} groups x {args.group_size}, env ~ "
          f"lognormal({args.env_mu}, {args.env_sigma}) s, train {args.sim_train_s} s/update ==")
    print(f"sync: trainer idle {sync.trainer_idle_fraction:.2f}")
    print(f"{'max_staleness':>13} {'wall async/sync':>16} {'trainer idle':>13} {'max lag':>8} {'drops':>6}  "
          f"staleness hist")
    for r in rows:
        print(f"{r['max_staleness']:>13} {r['wall_ratio']:>16.3f} {r['trainer_idle']:>13.2f} {r['max_lag']:>8} "
              f"{sum(r['drops'].values()):>6}  {r['staleness_hist']}")
    c = out["control_unbounded"]
    print(f"control (naive admission, drop stale at training): drops {c['drops']}, trained mean length "
          f"{c['trained_len_mean']:.1f} vs completed {c['completed_len_mean']:.1f}")
    return out


# ---- part 2: the real path -------------------------------------------------------------------
def _load(name: str, path: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


class SlowGrade:
    """The real grader after a sleep ~ lognormal(mu, sigma): the environment's heavy-tailed latency.

    The k-th grading of task T sleeps d(seed, T, k), a pure function of its arguments, so every arm of
    the A/B sees the same latencies for each group, whatever order its samples finish in (a shared
    random stream would hand the sync and async arms different draws)."""

    def __init__(self, mu: float, sigma: float, seed: int) -> None:
        from c2jax.train.rl_rollouts import grade_validated

        self.grade, self.mu, self.sigma, self.seed = grade_validated, mu, sigma, seed
        self.counts: dict[str, int] = {}
        self.lock = threading.Lock()

    def delay(self, task_id: str, k: int) -> float:
        return random.Random(f"{self.seed}:{task_id}:{k}").lognormvariate(self.mu, self.sigma)

    def __call__(self, task: Any, diff: str) -> Any:
        with self.lock:
            k = self.counts.get(task.instance_id, 0)
            self.counts[task.instance_id] = k + 1
        time.sleep(self.delay(task.instance_id, k))
        return self.grade(task, diff)


def mismatch_by_position(records: list, bucket: int) -> dict[int, float]:
    """Mean |log pi_learner - log pi_behaviour| over live loss tokens, by position // bucket."""
    import numpy as np

    sums: dict[int, list[float]] = {}
    for batch, lp in records:
        if lp is None:
            continue
        ti = batch["traj_index"]
        live = (batch["loss_mask"] > 0) & (ti >= 0)
        live &= np.where(ti >= 0, batch["infra_failed"][np.clip(ti, 0, None)] == 0, False)
        d = np.abs(np.asarray(lp, np.float64) - batch["behaviour_logp"])[live]
        pos = batch["positions"][live] // bucket
        for p, v in zip(pos.tolist(), d.tolist()):
            s = sums.setdefault(int(p) * bucket, [0.0, 0.0])
            s[0] += v
            s[1] += 1
    return {p: s[0] / s[1] for p, s in sorted(sums.items())}


def real_part(args) -> dict:
    import jax

    from c2jax.agent.policies import EnginePolicy
    from c2jax.envs import SandboxPool
    from c2jax.rl.loss import resolve_rl_config
    from c2jax.rl.stage_config import resolve_stage
    from c2jax.sampling import Engine, EngineConfig
    from c2jax.train.async_rl.publisher import EnginePublisher
    from c2jax.train.async_rl.runner import AsyncRL
    from c2jax.train.async_rl.services import LocalBackend
    from c2jax.train.async_rl.workers import RolloutWorker, Trainer
    from c2jax.train.rl_family import make_harness
    from c2jax.train.rl_learner import make_learner
    from c2jax.train.rl_step import RLContext, rl_step
    from c2jax.train.rl_tasks import TaskStream
    from c2jax.train.state import TrainState

    bench_step = _load("_c2jax_bench_rl_step", os.path.join(HERE, "rl_step.py"))
    config = bench_step.load_config(args.config)
    raw = config.rl.to_dict()
    raw.update(group_size=args.group_size, tasks_per_step=args.tasks_per_step, max_in_flight=args.slots,
               max_len=args.max_len, steps=args.steps + 1, max_staleness=0, replay_metrics=False)
    # A random-init policy never solves a task, so its advantages (and updates) are ~0 and the weights
    # would not move: a k3 KL term in the loss toward a fixed reference (the initial weights x 1.05)
    # makes every update move them, so the staleness mismatch below measures something.
    raw["kl"] = dict(coef=args.kl_coef, estimator="k3", placement="loss", log_ratio_clip=20.0)
    rl = resolve_rl_config({k: v for k, v in raw.items() if k not in resolve_stage({})})
    rl.update(resolve_stage(raw))
    config.agent.max_turns, config.agent.max_new_tokens = args.max_turns, args.max_new_tokens
    tps = args.tasks_per_step
    n_tasks = (1 + args.repeats * args.steps) * tps
    ns = argparse.Namespace(n_train=max(16, -(-n_tasks // 16) * 16), tasks_dir=None, difficulty=1, seed=args.seed,
                            steps=0, retries=0, groups=[], tasks_per_step=[])
    tasks, _ = bench_step.build_tasks(ns)
    from c2jax.model import init
    from c2jax.train.pretrain import base_model_config

    cfg = base_model_config(config)
    params = jax.tree_util.tree_map(jax.numpy.asarray, init(cfg, jax.random.PRNGKey(args.seed)))
    tok = bench_step.bench_tokenizer(cfg.vocab_size)
    learner = make_learner(cfg, rl, params)
    ref = jax.tree_util.tree_map(lambda x: x * 1.05, params) if args.kl_coef > 0 else None
    harness, fmt = make_harness(config, tok)

    def context(max_staleness: int, grade: SlowGrade) -> tuple[RLContext, Any]:
        r = dict(rl, max_staleness=max_staleness)
        engine = Engine(params, cfg, EngineConfig(max_slots=args.slots, max_len=args.max_len,
                                                  recompute_cache_on_update=True), tokenizer=tok, version=0)
        policy = EnginePolicy(engine, fmt, temperature=1.0, seed=args.seed)
        pool = SandboxPool(max_concurrency=args.slots)
        return RLContext(rl=r, learner=learner, engine=engine, policy=policy, harness=harness, pool=pool,
                         ref_params=ref, seed=args.seed, grade_fn=grade), pool

    def run_sync(stream: TaskStream, grade: SlowGrade, warm: bool = False) -> dict:
        ctx, pool = context(0, grade)
        state, version = TrainState.create(params, learner.tx), 0
        try:
            t0 = time.monotonic()
            busy, hist, trained = 0.0, {}, 0
            for step in range(1 if warm else args.steps):
                out = rl_step(ctx, state, stream.take(tps, step), step=step, version=version, engine_version=version)
                state, version = out.state, out.version
                busy += out.metrics["time/learner_s"] + out.metrics["time/diagnostics_s"]
                trained += len(out.samples)
                for k, v in out.metrics.items():
                    if k.startswith("staleness/hist/"):
                        hist[int(k.rsplit("/", 1)[1])] = hist.get(int(k.rsplit("/", 1)[1]), 0) + int(v)
            wall = time.monotonic() - t0
        finally:
            ctx.engine.shutdown()
            pool.close()
        return {"wall_s": wall, "trainer_idle": 1 - busy / wall, "staleness_hist": hist, "trained": trained,
                "tasks": sorted(stream.used)}

    class RecordingTrainer(Trainer):
        def __init__(self, c: RLContext, into: list) -> None:
            super().__init__(c)
            self.into = into

        def train(self, st, samples, v):
            out = super().train(st, samples, v)
            self.into.append((out.batch, out.logp))
            return out

    def run_async(stream: TaskStream, grade: SlowGrade, inflight: bool, records: list, out_dir: str) -> dict:
        ctx, pool = context(args.staleness, grade)
        be = LocalBackend()
        workers = max(1, args.slots // args.group_size)
        rollout = be.spawn("rollout", lambda: RolloutWorker(harness, ctx.policy, pool, ctx.rl, grade_fn=grade,
                                                             seed=args.seed), workers=workers)
        trainer = be.spawn("trainer", lambda: RecordingTrainer(ctx, records))
        run = AsyncRL(ctx, rollout=rollout, trainer=trainer, publisher=EnginePublisher(ctx.engine),
                      stream=stream, steps=args.steps, inflight_updates=inflight, out_dir=out_dir)
        try:
            run.run(TrainState.create(params, learner.tx))
        finally:
            rollout.shutdown()
            trainer.shutdown()
            ctx.engine.shutdown()
            pool.close()
        sm = run.summary()
        return {"wall_s": sm["wall_s"], "trainer_idle": sm["trainer_idle_fraction"],
                "staleness_hist": sm["staleness_hist"], "ledger": sm["ledger"], "trained": sm["ledger"]["trained"],
                "tasks": sorted(stream.used)}

    # One untimed synchronous step compiles the engine and the learner's row buckets. Then each repeat
    # runs the three arms on the SAME tasks (a fresh single-epoch stream over the repeat's slice, same
    # seed, so the same order) with the SAME latency per (task, k-th grading), in a rotated order so no
    # arm always runs first (a prompt-length bucket first met mid-run compiles in whichever arm meets it).
    run_sync(TaskStream(tasks[:tps], seed=args.seed, upsample_after_step=None), SlowGrade(-9.0, 0.0, 0), warm=True)
    arms = ("sync", "async", "async_no_inflight")
    records: dict[str, list] = {"async": [], "async_no_inflight": []}
    repeats: list[dict] = []
    for rep in range(args.repeats):
        chunk = tasks[tps + rep * args.steps * tps: tps + (rep + 1) * args.steps * tps]
        row: dict[str, Any] = {}
        for arm in arms[rep % 3:] + arms[:rep % 3]:
            stream = TaskStream(chunk, seed=args.seed + rep, upsample_after_step=None)
            grade = SlowGrade(args.env_mu, args.env_sigma, args.seed + rep)
            if arm == "sync":
                row[arm] = run_sync(stream, grade)
            else:
                row[arm] = run_async(stream, grade, arm == "async", records[arm],
                                     os.path.join(args.workdir, f"{arm}_r{rep}"))
        # The arms did the same work: the same tasks, every sample trained once, nothing dropped.
        want = args.steps * tps * args.group_size
        for arm in arms:
            if row[arm]["trained"] != want or row[arm]["tasks"] != row["sync"]["tasks"]:
                raise RuntimeError(f"repeat {rep}: arm {arm} trained {row[arm]['trained']} samples of "
                                   f"{len(row[arm]['tasks'])} tasks, sync {want} of {len(row['sync']['tasks'])}: "
                                   "the wall times would not compare the same work")
        row["wall_ratio"] = row["async"]["wall_s"] / row["sync"]["wall_s"]
        row["wall_ratio_no_inflight"] = row["async_no_inflight"]["wall_s"] / row["sync"]["wall_s"]
        repeats.append(row)
    import statistics

    results: dict[str, Any] = {
        "repeats": repeats,
        "wall_ratio": statistics.median(r["wall_ratio"] for r in repeats),
        "wall_ratio_no_inflight": statistics.median(r["wall_ratio_no_inflight"] for r in repeats),
        "mismatch_by_position": {k: mismatch_by_position(v, args.position_bucket) for k, v in records.items()}}
    print(f"\n== real path: {args.repeats} repeats x {args.steps} steps x {tps} tasks x {args.group_size} rollouts, "
          f"{args.slots} slots, grading after a sleep ~ lognormal({args.env_mu}, {args.env_sigma}) s; each repeat: "
          f"the three arms on the same tasks and latencies ==")
    for i, r in enumerate(repeats):
        for k in arms:
            print(f"  repeat {i} {k:>18}: wall {r[k]['wall_s']:6.1f} s, trainer idle {r[k]['trainer_idle']:.2f}, "
                  f"staleness {r[k]['staleness_hist']}")
        print(f"  repeat {i} wall async/sync = {r['wall_ratio']:.3f} (no in-flight updates: "
              f"{r['wall_ratio_no_inflight']:.3f})")
    print(f"wall async (max_staleness={args.staleness}) / sync, median of {args.repeats} = {results['wall_ratio']:.3f} "
          f"(no in-flight updates: {results['wall_ratio_no_inflight']:.3f}; same trained samples per arm: "
          f"{args.steps * tps * args.group_size})")
    a, n = results["mismatch_by_position"]["async"], results["mismatch_by_position"]["async_no_inflight"]
    print("|log pi_train - log pi_behaviour| by token position (with / without in-flight updates):")
    for p in sorted(set(a) | set(n)):
        print(f"  pos {p:>5}+: {a.get(p, float('nan')):.5f} / {n.get(p, float('nan')):.5f}")
    return results


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--real", action="store_true", help="also run the real harness/engine/sandbox path")
    p.add_argument("--dry-run", action="store_true", help="smallest real shapes (numbers meaningless)")
    p.add_argument("--config", default="experiments/configs/rl_quickstart.py:smoke")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--repeats", type=int, default=3, help="real path: A/B repeats (each on fresh tasks)")
    p.add_argument("--staleness", type=int, default=2)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--tasks-per-step", type=int, default=4)
    p.add_argument("--slots", type=int, default=16)
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--env-mu", type=float, default=0.0, help="log of the median environment seconds")
    p.add_argument("--env-sigma", type=float, default=1.0, help="lognormal sigma (heavy tail)")
    p.add_argument("--sim-steps", type=int, default=200)
    p.add_argument("--sim-train-s", type=float, default=1.0)
    p.add_argument("--position-bucket", type=int, default=64)
    p.add_argument("--kl-coef", type=float, default=0.1, help="k3 KL-in-loss toward initial x 1.05 (0: off)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default="runs/bench/rl_async")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.dry_run:
        args.real = True
        args.steps, args.group_size, args.tasks_per_step, args.slots, args.repeats = 2, 2, 2, 4, 1
        args.max_turns, args.max_new_tokens, args.sim_steps, args.env_mu, args.env_sigma = 1, 16, 20, -3.0, 0.5
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    out: dict[str, Any] = {"args": vars(args), "model": model_part(args)}
    if args.real:
        out["real"] = real_part(args)
    print("\nTimings taken on a shared/loaded machine are not results: rerun on an idle machine.")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
