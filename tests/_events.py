"""Build small event tables by hand for derive/detect tests."""

from __future__ import annotations

import polars as pl

from tracediag.schema import conform


def events(rows: list[dict]) -> pl.DataFrame:
    """An event table from dicts (missing columns null; rank 0 and device -1 by default)."""
    full = [{"rank": 0, "device": -1, "pid": 1, "tid": 1, **r} for r in rows]
    return conform(pl.DataFrame(full, infer_schema_length=None))
