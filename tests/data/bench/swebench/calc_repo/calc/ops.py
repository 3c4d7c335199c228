"""Arithmetic helpers."""


def add(a, b):
    """Sum of a and b."""
    return a + b


def mul(a, b):
    """Product of a and b, by repeated addition (b must be an int)."""
    total = 0
    for _ in range(abs(b)):
        total = add(total, a)
    return total


def power(a, n):
    """a to the n-th power (n >= 0)."""
    out = 1
    for _ in range(n):
        out = mul(out, a)
    return out
