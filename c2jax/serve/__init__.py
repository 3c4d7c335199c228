"""Serve a c2jax checkpoint as an OpenAI-compatible API (see server.py; CLI: `python -m c2jax.serve`)."""
from c2jax.sampling.checkpoint import ServeCheckpointError, load_serving_checkpoint, save_serving_checkpoint
from c2jax.serve.server import APIError, ChatServer

__all__ = ["ChatServer", "APIError", "load_serving_checkpoint", "save_serving_checkpoint", "ServeCheckpointError"]
