"""Units and how quantities are written: the event table's nanoseconds, milliseconds as text, counts
in words that agree in number ("1 step", "3 steps"), shares of a device's peak.

The event table counts time in integer nanoseconds (`schema.EVENT_SCHEMA`); the findings, reports and
sentences speak milliseconds. Every conversion divides by the constants here, and every duration a
person reads is written by `format_ms`, so one value reads the same everywhere.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

NS_PER_MS = 1e6
"""Nanoseconds in a millisecond: ``ns / NS_PER_MS`` is milliseconds."""
NS_PER_US = 1e3
"""Nanoseconds in a microsecond."""
NS_PER_S = 1e9
"""Nanoseconds in a second."""
MS_PER_S = 1e3
"""Milliseconds in a second: ``MS_PER_S * seconds`` is milliseconds."""


def format_ms(ms: float, digits: int | None = 1, *, sign: bool = False, small: bool = False, unit: bool = True) -> str:
    """Milliseconds as text: thousands separated, `digits` after the point ("1,234.5 ms"), the sign
    always shown with `sign` ("+3.2 ms").

    `digits=None`: the digits the value needs, 0 from 10 ms, 1 from 1 ms, else 2 ("255", "9.2",
    "0.18"), and "< 0.01" below 0.01 ms (zero included: never a step shown as 0 ms).
    `small`: a nonzero value below 1 ms keeps two digits ("0.03 ms") or reads "< 0.01 ms"; zero
    stays "0.0 ms". `unit=False`: the number alone, for a sentence that names the unit once.
    """
    if digits is None:
        text = f"{ms:,.{0 if ms >= 10 else 1 if ms >= 1 else 2}f}" if ms >= 0.01 else "< 0.01"
    elif small and not (ms == 0 or ms >= 1):
        text = f"{ms:.2f}" if ms >= 0.01 else "< 0.01"
    else:
        text = f"{ms:{'+' if sign else ''},.{digits}f}"
    return f"{text} ms" if unit else text


def noun(n: int, singular: str, plural: str | None = None) -> str:
    """`singular` for exactly one, else `plural` (default: singular + "s")."""
    return singular if n == 1 else (plural or singular + "s")


def count(n: int, singular: str, plural: str | None = None) -> str:
    """`n` and its noun: "1 step", "0 steps", "1,024 ranks"."""
    return f"{n:,} {noun(n, singular, plural)}"


def of_peak(label: str, share: float) -> str:
    """A utilisation (MFU, HFU) as "MFU 41.2%"; above 100% of peak, which no device reaches, it is refused
    with the reason instead of printed."""
    if share <= 1:
        return f"{label} {100 * share:.1f}%"
    return f"{label} not shown ({100 * share:,.0f}% of peak is impossible: the inputs do not describe one run)"


def spans(values: Iterable[int]) -> list[str]:
    """Sorted distinct `values` as runs of consecutive numbers: ``["0–3", "7", "9–10"]``."""
    runs: list[list[int]] = []
    for v in sorted(set(values)):
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return [str(a) if a == b else f"{a}–{b}" for a, b in runs]


def rank_list(ranks: tuple[int, ...] | list[int], shown: int = 8) -> str:
    """``rank 2`` / ``ranks 2, 6, 10``: the first `shown` in order, and past them how many in all, so that a
    sentence about a slow node of 256 ranks stays a sentence."""
    ordered = sorted(ranks)
    if len(ordered) == 1:
        return f"rank {ordered[0]}"
    head = ", ".join(map(str, ordered[:shown]))
    more = f" (+{len(ordered) - shown}, {len(ordered)} in all)" if len(ordered) > shown else ""
    return f"ranks {head}{more}"
