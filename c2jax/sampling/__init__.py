"""Sampling engine: batched KV-cache generation with logprobs, routed experts, in-flight weight updates."""
