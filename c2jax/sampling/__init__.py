"""Sampling engine: batched KV-cache generation with logprobs, routed experts, in-flight weight updates.

    from c2jax.sampling import Engine, EngineConfig, Request, SamplingParams
    results = Engine(params, model_cfg, EngineConfig(max_slots=8)).generate([Request([1, 2, 3])])

See engine.py for the design, types.py for what a Result holds.
"""
from c2jax.sampling.engine import Engine, EngineConfig, StreamEvent
from c2jax.sampling.types import Request, RequestError, Result, SamplingParams

__all__ = ["Engine", "EngineConfig", "StreamEvent", "Request", "RequestError", "Result", "SamplingParams"]
