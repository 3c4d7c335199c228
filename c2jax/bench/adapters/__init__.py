"""Adapters from public task formats to c2jax task records (see each module)."""
from c2jax.bench.adapters.harbor import convert_harbor
from c2jax.bench.adapters.swebench import convert_swebench, read_swebench, read_swebench_jsonl

__all__ = ["convert_harbor", "convert_swebench", "read_swebench", "read_swebench_jsonl"]
