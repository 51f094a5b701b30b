"""A file that holds its events twice: a trace concatenated with itself (a merge that took one rank's file
twice, `jq -s` over a doubled list), read as it is, would count every operator, kernel and collective
double and the analysis would say nothing. Real traces repeat few events exactly (two zero-length runtime
calls in one microsecond, a nested op starting with its parent): at most 5.8% of the rows of the 1.5M read
from fixtures/ and ../shared (HTA's negative_queue_length_values_check, integer-microsecond times)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import polars as pl

DOUBLED_SHARE = 0.5
"""A file more than this share of whose rows repeat another row exactly holds its events twice: a doubled
list repeats every row (1.0), a real trace its few twins (0.058 at most, `__doc__`)."""


def doubled_problem(events: pl.DataFrame) -> str | None:
    """Why `events` (one file's, `schema.conform`ed) hold the file's events twice, or None. Costs one count
    of distinct start times (2.4 ms for HTA's 75k-row control trace, 2% of reading it); rows are compared
    whole only where at least a quarter of the starts repeat, as they must where more than half the rows
    have an exact twin."""
    n = events.height
    if n < 2 or events.get_column("ts").n_unique() > n * (1 - DOUBLED_SHARE / 2):
        return None
    repeated = int(events.is_duplicated().sum())
    if repeated <= n * DOUBLED_SHARE:
        return None
    return (
        f"{repeated:,} of its {n:,} events repeat another exactly (same thread, name, start, duration and ids): "
        "the file holds its events twice (a trace concatenated with itself?)"
    )
