"""c2jax: continued pretraining and asynchronous agentic RL for DeepSeek-V3/Kimi-K2-style MoE models, in JAX."""
__version__ = "0.1.0"
