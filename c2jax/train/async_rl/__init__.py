"""Asynchronous RL services (Composer 2 report, section 4.3): trainer, inference, rollout workers and
evaluation behind futures, a reconciler with bounded-staleness admission, a sample ledger, group-level
sample checkpoints, and an embedded (threads) or Ray backend chosen by ``rl.services.backend``.

Modules: `ledger` (every sample trained once or dropped with a reason), `reconciler` (slot lifecycle,
admission, the drop rules), `publisher` (weights to the engine, never blocking the trainer),
`group_store` (sample checkpoints of `rl_rollouts.Sample`), `engine_health` (the embedded
backend's engine behind a handle a health check can replace), `services` (the backend interface, embedded backend),
`ray_backend`, `workers` (rollout / trainer / evaluator service objects reusing `rl_step`),
`runner` (the driver), `simulate` (a discrete-event model of the same reconciler for tests and the
benchmark), `stage` (the ``rl`` stage's asynchronous loop).
"""
