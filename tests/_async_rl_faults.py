"""Fault injection for the asynchronous RL services (tests/train/async_rl/test_async_rl_faults.py and its
process, tests/train/async_rl/fault_run.py): a rollout worker killed mid-group (`KillableRollout`),
the engine's thread killed while it serves (`kill_engine`), an episode's sandbox (its bwrap)
SIGKILLed as the episode next uses it, at seeded random moments (`plan_faults`, `FaultInjector`); an auditing trainer
(`AuditTrainer`) and `audit_fault_run`, which checks a killed-and-resumed run against the ledger;
`fault_run`, one process of such a run."""
from __future__ import annotations

import os
from typing import Any

from _async_rl_common import build, learner_for, make_async, param_hash, rl_section, tasks, tiny_model


class WorkerKilled(BaseException):
    """A rollout worker ended mid-group (the embedded backend's "worker process killed"). A
    BaseException, like SystemExit, so no episode-level ``except Exception`` turns it into a masked
    sample: the group's future fails and the driver sees a lost worker."""


class EngineKilled(RuntimeError):
    """Raised inside the engine's scheduler thread: the thread (the embedded inference service) dies."""


class KillableRollout:
    """A rollout `Service` whose groups die mid-rollout: for each ``kill_at[n] = j``, the j-th lifecycle
    event (an episode starting, or its grading starting) counted over the groups submitted from
    submission n on raises `WorkerKilled` in that group's rollout (counting across groups, a kill
    still fires when group n itself was lost to another fault first); the service then reports
    itself dead until the driver's health check restarts it."""

    def __init__(self, svc: Any, kill_at: dict) -> None:
        import threading

        self.svc, self.name, self.kill_at = svc, svc.name, {int(k): int(v) for k, v in kill_at.items()}
        self.submitted = self.kills = self.restarts = 0
        self.dead = False
        self.on_kill: Any = None  # called with a record of each kill (the driver logs it durably)
        self._seen: dict = {}
        self._fired: set = set()
        self._lock = threading.Lock()

    def submit(self, method: str, task: Any, batch: int, on_state: Any = None) -> Any:
        n, self.submitted = self.submitted, self.submitted + 1
        armed = [k for k in self.kill_at if k <= n]
        if armed:
            inner = on_state

            def on_state(t: Any, k: int, state: str) -> None:  # noqa: F811 - the dying wrapper
                fire = None
                with self._lock:
                    for key in armed:
                        if key in self._fired:
                            continue
                        self._seen[key] = self._seen.get(key, 0) + 1
                        if fire is None and self._seen[key] > self.kill_at[key]:
                            self._fired.add(key)
                            fire = key
                if fire is not None:
                    self.dead, self.kills = True, self.kills + 1
                    what = f"submission {n} ({state} of sample {k}; planned at submission {fire})"
                    if self.on_kill is not None:
                        self.on_kill({"kind": "worker", "what": what})
                    raise WorkerKilled(f"rollout worker killed: {what}")
                if inner is not None:
                    inner(t, k, state)
        return self.svc.submit(method, task, batch, on_state)

    def call(self, method: str, *args: Any, **kw: Any) -> Any:
        return self.svc.call(method, *args, **kw)

    def alive(self) -> bool:
        return not self.dead and self.svc.alive()

    def restart(self) -> None:
        self.svc.restart()
        self.dead, self.restarts = False, self.restarts + 1

    def shutdown(self) -> None:
        self.svc.shutdown()


def kill_engine(handle: Any) -> None:
    """Make the current engine's scheduler thread die (`EngineKilled`) at its next step: at once while it
    serves requests, at the next request while it is idle."""
    def dying_step() -> None:
        raise EngineKilled("inference engine killed by the fault injector")

    handle.current.step = dying_step


class FaultInjector:
    """Seeded faults at random moments of a run: after update `at[kind]`, kill 'engine' (its thread,
    `kill_engine`) after a random 0..`jitter_s` seconds, or 'sandbox' at once (SIGKILL the bwrap of the
    first episode that uses its sandbox within 10 s, a tool call or the final diff, just before). Rollout-worker kills are planned
    up front (`plan_worker_kills` -> `KillableRollout`). `done` counts what was actually killed."""

    def __init__(self, seed: int, at: dict, engine: Any, jitter_s: float = 1.0, record: Any = None) -> None:
        import random
        import threading

        self.rng = random.Random(seed)
        self.at = {k: int(v) for k, v in at.items()}
        self.engine, self.jitter_s, self.record = engine, float(jitter_s), record
        self.done: dict = {}
        self.log: list = []
        self._lock = threading.Lock()
        self._threads: list = []

    def on_step(self, step: int, metrics: dict | None = None) -> None:
        import threading

        for kind, at in self.at.items():
            if at == step:
                delay = self.rng.uniform(0, self.jitter_s)
                if kind == "sandbox":
                    # armed at once: the next sandbox use after the update is already a random moment, and
                    # a delay could outlast every remaining episode of a fast run (the test then saw no kill)
                    delay = 0.0
                t = threading.Thread(target=self._fire, args=(kind, delay), daemon=True)
                t.start()
                self._threads.append(t)

    def _fire(self, kind: str, delay: float) -> None:
        import time

        time.sleep(delay)
        if kind == "engine":  # at a moment it is serving requests (else the loss costs nothing)
            t_end = time.monotonic() + 10.0
            while not self.engine.current.has_work() and time.monotonic() < t_end:
                time.sleep(0.005)
            kill_engine(self.engine)
            what = "engine thread"
        elif kind == "sandbox":
            what = self._kill_sandbox_at_next_use(timeout_s=10.0)
            if what is None:
                return
        else:
            raise ValueError(f"unknown fault kind {kind!r}")
        rec = {"kind": kind, "what": what, "delay_s": round(delay, 3)}
        with self._lock:
            self.done[kind] = self.done.get(kind, 0) + 1
            self.log.append(rec)
            if self.record is not None:
                self.record(rec)

    def _kill_sandbox_at_next_use(self, timeout_s: float) -> str | None:
        """SIGKILL the bwrap of the first episode that uses its sandbox from now on (a tool call or the
        final diff), just before that use, so the episode must see its sandbox die. (A sandbox killed
        from outside at a random moment may be past its episode's last use, and then nothing notices:
        that made this test flaky.) Patches `Toolbox.call` and `Sandbox.diff` for at most `timeout_s`;
        the patches are removed before returning."""
        import signal
        import threading

        from c2jax.agent.tools import Toolbox
        from c2jax.envs.sandbox import Sandbox

        call0, diff0, done, taken, killed = Toolbox.call, Sandbox.diff, threading.Event(), [], []

        def kill_once(sb: Any, use: str) -> None:
            with self._lock:
                if taken:
                    return
                taken.append(use)
            pid = sb._proc.pid
            os.kill(pid, signal.SIGKILL)
            sb._proc.wait(timeout=10)  # dead before the use goes on (a signal is delivered asynchronously)
            killed.append(f"bwrap {pid} (as its episode's {use} began)")
            done.set()

        def call(box: Any, name: Any, arguments: Any):
            kill_once(box.sb, f"{name} call")
            return call0(box, name, arguments)

        def diff(sb: Any) -> str:
            kill_once(sb, "final diff")
            return diff0(sb)

        Toolbox.call, Sandbox.diff = call, diff
        try:
            if not done.wait(timeout_s) and taken:
                done.wait(15.0)  # a kill that began just before the deadline
        finally:
            Toolbox.call, Sandbox.diff = call0, diff0
        return killed[0] if killed else None

    def join(self, timeout: float = 15.0) -> None:
        for t in self._threads:
            t.join(timeout)


def plan_faults(seed: int, start: int, lo: int, hi: int, groups_per_step: int,
                kinds: tuple = ("worker", "engine", "sandbox")) -> dict:
    """A seeded random plan for a process that starts at update `start`: the rollout-worker and engine
    kills after random updates in [lo, hi), the sandbox kill after a later one (<= hi), so no later
    fault of this process rolls its masked sample's group out again (the caller keeps the trainer
    kill and the run's end >= 3 updates after `hi`: the group is trained by then). Returns
    {"at": {"engine": u, "sandbox": u}, "worker": {submission number in this process: lifecycle
    event}} (the killed group is one admitted around that update), only for `kinds`; an empty plan
    if hi <= lo."""
    import random

    rng = random.Random(seed)
    if hi <= lo:
        return {"at": {}, "worker": {}}
    w, e = rng.randrange(lo, hi), rng.randrange(lo, hi)
    sandbox = rng.randrange(max(w, e) + 1, hi + 1)
    worker = {max(0, w - start) * groups_per_step + rng.randrange(groups_per_step): rng.randrange(4)}
    at = {k: v for k, v in (("engine", e), ("sandbox", sandbox)) if k in kinds}
    return {"at": at, "worker": worker if "worker" in kinds else {}}


class AuditTrainer:
    """`workers.Trainer` that appends, durably, what each update trained to `log_path`:
    {"run", "step", "live": sample ids it learns from, "masked": sample ids in its batch that are
    masked}. Independent of the ledger: the fault test compares the two."""

    def __init__(self, ctx: Any, log_path: str, run_id: str, first_step: int, learn: bool = True) -> None:
        from c2jax.train.async_rl.workers import Trainer

        self.inner, self.log_path, self.run_id, self.step = Trainer(ctx), log_path, run_id, int(first_step)
        self.learn = learn  # False: no gradient step, only the train state's step counter (fast tests)

    def train(self, state: Any, samples: Any, version: int) -> Any:
        import json
        import types

        if self.learn:
            out = self.inner.train(state, samples, version)
        else:
            out = types.SimpleNamespace(state=state.replace(step=state.step + 1), metrics={})
        self.step += 1
        rec = {"run": self.run_id, "step": self.step, "version": int(version),
               "live": [s.trajectory.sample_id for s in samples if not s.mask_reason],
               "masked": [s.trajectory.sample_id for s in samples if s.mask_reason]}
        with open(self.log_path, "a") as f:
            f.write(json.dumps(rec) + "\n")
            f.flush()
            os.fsync(f.fileno())
        return out


class AuditError(AssertionError):
    """A fault run lost, repeated or mis-recorded a sample (the message names the first one)."""


def audit_fault_run(out_dir: str, steps: int) -> dict:
    """Check a (possibly killed and resumed) fault run from what it left in `out_dir`:
    ``runs.jsonl`` (each process: its id and the step it started from), ``trained.jsonl`` (the
    auditing trainer's log) and ``services/ledger.jsonl`` (the sample ledger's event log).

    The lineage of updates is, for each process, its updates up to the step the next process
    resumed from (later ones died with it). Raises `AuditError` unless: the lineage has updates
    1..steps exactly once each; no sample id is in two updates (nothing repeated) and no task's
    group is split over two; every sample id any process ever queued is trained or dropped with a
    reason in the final ledger (nothing lost); the final ledger is complete and its trained ids are
    exactly the lineage's live ids (its masked-drop ids exactly the lineage's masked ids).
    Returns counts."""
    import collections
    import json

    from c2jax.train.async_rl.ledger import LedgerError, SampleLedger

    runs = [json.loads(line) for line in open(os.path.join(out_dir, "runs.jsonl")) if line.strip()]
    recs = [json.loads(line) for line in open(os.path.join(out_dir, "trained.jsonl")) if line.strip()]
    lineage = []
    for i, run in enumerate(runs):
        upto = runs[i + 1]["start"] if i + 1 < len(runs) else steps
        lineage += [r for r in recs if r["run"] == run["run"] and r["step"] <= upto]
    got_steps = sorted(r["step"] for r in lineage)
    if got_steps != list(range(1, steps + 1)):
        raise AuditError(f"updates in the lineage: {got_steps}, expected 1..{steps} once each")
    seen: dict = {}
    group_step: dict = {}
    for r in lineage:
        for sid in r["live"] + r["masked"]:
            if sid in seen:
                raise AuditError(f"sample {sid} repeated: trained in updates {seen[sid]} and {r['step']}")
            seen[sid] = r["step"]
            task = sid.rsplit("#", 1)[0]
            if group_step.setdefault(task, r["step"]) != r["step"]:
                raise AuditError(f"group of {task} split over updates {group_step[task]} and {r['step']}")
    ledger_path = os.path.join(out_dir, "services", "ledger.jsonl")
    final = SampleLedger.load(ledger_path)

    def key(ledger_id: str) -> str:  # "g<admission>/<task>#<k>" -> "<task>#<k>" (the trainer's id)
        return ledger_id.split("/", 1)[1]

    final_keys = {key(i): r for i, r in final.records.items()}
    queued = set()
    for line in open(ledger_path):
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line of a killed process
        if ev.get("ev") == "queue":
            queued.add(key(ev["id"]))
    lost = sorted(k for k in queued if k not in final_keys or final_keys[k]["state"] not in ("trained", "dropped"))
    if lost:
        raise AuditError(f"{len(lost)} queued samples neither trained nor dropped (lost), e.g. {lost[:3]}")
    try:
        final.check_complete()
    except LedgerError as e:
        raise AuditError(f"final ledger incomplete: {e}") from None
    trained = {key(i): r["step"] for i, r in final.records.items() if r["state"] == "trained"}
    live = {sid: r["step"] for r in lineage for sid in r["live"]}
    ghost = sorted(set(trained) - set(live))
    if ghost:
        raise AuditError(f"{len(ghost)} samples the ledger marks trained that no surviving update learned from "
                         f"(lost with a killed update), e.g. {ghost[:3]}")
    unrecorded = sorted(set(live) - set(trained)) + sorted(k for k in live if k in trained and trained[k] != live[k])
    if unrecorded:
        raise AuditError(f"samples learned from but not recorded trained at that update, e.g. {unrecorded[:3]}")
    masked = {key(i) for i, r in final.records.items() if r["state"] == "dropped" and r["reason"].startswith("masked:")}
    lineage_masked = {sid for r in lineage for sid in r["masked"]}
    if masked != lineage_masked:
        raise AuditError(f"ledger masked drops != masked samples of trained batches: "
                         f"{sorted(masked ^ lineage_masked)[:3]}")
    reasons = collections.Counter(r["reason"].split(" ")[0] for r in final.records.values() if r["state"] == "dropped")
    return {"updates": len(lineage), "trained": len(trained), "dropped": dict(reasons), "runs": len(runs),
            "queued_ever": len(queued)}


FAULT_TASKS_PER_STEP, FAULT_GROUP = 2, 2


def fault_run(out: str, env_id: str, *, steps: int, seed: int = 0, staleness: int = 1, faults: tuple = (0, 0),
              learn: bool = True, recovery: bool = True, kinds: tuple = ("worker", "engine", "sandbox")) -> dict:
    """One process's share of a fault-injection run (tests/train/async_rl/fault_run.py is its command
    line; the test SIGKILLs that process at a random moment and calls this again to resume).

    The asynchronous driver on the embedded backend with the real harness, engine, sandbox pool and
    (``learn``) learner of the tiny model, a real checkpointer every update, the seeded faults of
    `plan_faults` of `kinds` over updates [faults[0], faults[1]) (`FaultInjector`, `KillableRollout`) and the
    `AuditTrainer` log. On a directory with a checkpoint it resumes: parameters, Adam, task stream,
    the engine's weights and version, and (unless not ``recovery``: the positive control) the
    reconciler, ledger and group checkpoints (`AsyncRL.restore`). Leaves in `out`, durably as it
    goes: runs.jsonl ({"run", "start", "pid"} first), trained.jsonl, faults.jsonl (each injected
    fault), health.jsonl (the driver's replacement counters after every update); returns (and
    writes to summary_<run>.json) the run's summary."""
    import json
    import uuid

    from c2jax.checkpoint import Checkpointer
    from c2jax.train.state import TrainState

    os.makedirs(out, exist_ok=True)
    B, G = FAULT_TASKS_PER_STEP, FAULT_GROUP
    rl = rl_section(max_staleness=staleness, max_len=512, steps=steps, tasks_per_step=B, group_size=G,
                    max_in_flight=2 * G, ckpt_every=1)
    task_list = tasks(env_id, 4 * steps * B)
    ckpt = Checkpointer(os.path.join(out, "checkpoints"), keep=2, async_save=False)
    init = TrainState.create(tiny_model()[1], learner_for(rl).tx)  # the tree to restore into
    start, version, loader, engine_params, tree = 0, 0, None, None, None
    got = ckpt.restore_latest(dict(init.to_tree(), engine_params=init.params))
    if got is not None:
        start, tree, loader, _ = got
        version, engine_params = int(loader["version"]), tree["engine_params"]
    parts = build(rl, task_list, seed=seed, engine_params=engine_params, version=version)
    state = parts.state if tree is None else parts.state.replace_tree(tree)
    if loader is not None:
        parts.stream.load_state(loader["stream"])
    run_id = uuid.uuid4().hex[:8]

    def append(name: str, rec: dict) -> None:
        with open(os.path.join(out, name), "a") as f:
            f.write(json.dumps(dict(rec, run=run_id)) + "\n")
            f.flush()
            os.fsync(f.fileno())

    append("runs.jsonl", {"start": start, "pid": os.getpid()})
    plan = plan_faults(seed * 1000 + start, start, faults[0], faults[1], B, kinds)
    holder: dict = {}

    def on_step(step: int, metrics: dict) -> None:
        append("health.jsonl", {"step": step, "restarts": dict(run.restarts)})
        holder["injector"].on_step(step, metrics)

    def killable(svc: Any) -> KillableRollout:
        holder["rollout"] = KillableRollout(svc, plan["worker"])
        holder["rollout"].on_kill = lambda rec: append("faults.jsonl", rec)
        return holder["rollout"]

    run = make_async(parts, os.path.join(out, "services"), steps, version=version, ckpt=ckpt, health_every_s=0.25,
                     max_retries=3, wrap_rollout=killable, on_step=on_step,
                     trainer_factory=lambda: AuditTrainer(parts.ctx, os.path.join(out, "trained.jsonl"), run_id,
                                                          start, learn=learn))
    injector = holder["injector"] = FaultInjector(seed + start, plan["at"], run.engine,
                                                  record=lambda rec: append("faults.jsonl", rec))
    counts = run.restore(loader, version) if loader is not None and recovery else {}
    injector.on_step(start)  # faults planned "after update `start`" fire now
    try:
        state, version = run.run(state, start_step=start, version=version)
        injector.join()
    finally:
        run.rollout.shutdown()
        run.trainer.shutdown()
        ckpt.close()
        parts.close()
    summary = dict(run.summary(), restored=counts, start=start, final_version=version, plan=plan,
                   injected=injector.done, worker_kills=holder["rollout"].kills,
                   worker_restarts=holder["rollout"].restarts, engine_replacements=run.engine.replacements,
                   engine_failed_requests=run.engine.failed_requests, param_hash=param_hash(state.params))
    with open(os.path.join(out, f"summary_{run_id}.json"), "w") as f:
        json.dump(summary, f, indent=2, sort_keys=True, default=str)
    return summary
