"""Counts in words that agree in number: "1 step", "3 steps", "rank 2", "ranks 1, 3"."""

from __future__ import annotations


def noun(n: int, singular: str, plural: str | None = None) -> str:
    """`singular` for exactly one, else `plural` (default: singular + "s")."""
    return singular if n == 1 else (plural or singular + "s")


def count(n: int, singular: str, plural: str | None = None) -> str:
    """ "1 step", "0 steps", "1,024 ranks"."""
    return f"{n:,} {noun(n, singular, plural)}"


def of_peak(label: str, share: float) -> str:
    """A utilisation (MFU, HFU) as "MFU 41.2%"; above 100% of peak, which no device reaches, it is refused
    with the reason instead of printed."""
    if share <= 1:
        return f"{label} {100 * share:.1f}%"
    return f"{label} not shown ({100 * share:,.0f}% of peak is impossible: the inputs do not describe one run)"


def format_ms(seconds: float) -> str:
    """Seconds as milliseconds, small values kept readable ("0.03 ms", "< 0.01 ms")."""
    ms = 1e3 * seconds
    if ms == 0 or ms >= 1:
        return f"{ms:,.1f} ms"
    return f"{ms:.2f} ms" if ms >= 0.01 else "< 0.01 ms"
