"""A tiny calculator package (fixture for the SWE-bench adapter tests)."""
from calc.ops import add, mul, power

__all__ = ["add", "mul", "power"]
