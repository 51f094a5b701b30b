"""Counts in words that agree in number: "1 step", "3 steps", "rank 2", "ranks 1, 3"."""

from __future__ import annotations


def noun(n: int, singular: str, plural: str | None = None) -> str:
    """`singular` for exactly one, else `plural` (default: singular + "s")."""
    return singular if n == 1 else (plural or singular + "s")


def count(n: int, singular: str, plural: str | None = None) -> str:
    """"1 step", "0 steps", "1,024 ranks"."""
    return f"{n:,} {noun(n, singular, plural)}"
