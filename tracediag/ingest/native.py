"""Columns from the optional C scanner (`_chromescan.c`), typed for `chrome.decode`.

The scanner reads a whole JSON document in one pass and returns int64 columns, never a Python
object per event. It answers only for documents it reads exactly as the msgspec path would; for
anything else `scan` returns None and `chrome` decodes the document with msgspec. Without a C
compiler at install time the extension is absent and every document takes the msgspec path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import polars as pl

try:
    from tracediag.ingest import _chromescan
except ImportError:  # built without a C compiler
    _chromescan = None

AVAILABLE = _chromescan is not None
"""Whether the C scanner was built with this install."""

_NULL_INT = -(2**63)
_PHASES = pl.Series(["X", "B", "E", "M"], dtype=pl.String)
STRING_FIELDS = (
    "cat",
    "name",
    "pid_str",
    "coll_name",
    "dtype",
    "pg_name",
    "step_num",
    "hlo_op",
    "hlo_module",
    "run_id",
    "label",
    "labels",
)
RAW_FIELDS = ("input_dims", "input_type", "concrete_inputs")
"""Kept as (`<field>_at`, `<field>_len`): where the value's JSON text lies in the document."""


@dataclass
class Scanned:
    """One document as rows: its X/B/E/M events in file order, every field a typed column."""

    n_events: int
    """Events in the document, counted ones included."""
    rows: pl.DataFrame
    """ph, the base fields (ts/dur in ns), `has_args` and every args field tracediag reads."""
    skipped: dict[str, int]
    """Events of the phases that are only counted, by reason."""
    top: dict[str, Any]
    """The top-level keys tracediag reads (Object form)."""


def scan(doc: bytes | bytearray | memoryview, is_array: bool) -> Scanned | None:
    """The document's columns, or None where the msgspec path must decode it."""
    if _chromescan is None:
        return None
    result = _chromescan.scan(doc, is_array)
    if isinstance(result, str):  # the reason the scanner declined
        return None
    n_events, n_rows, columns, strings, skipped, spans = result
    try:
        top = {key: msgspec.json.decode(doc[at : at + size]) for key, (at, size) in spans.items()}
    except msgspec.MsgspecError:
        return None
    raw = np.frombuffer(columns, dtype=np.int64).reshape(len(_chromescan.COLUMNS), n_rows)
    table = pl.DataFrame({name: raw[i] for i, name in enumerate(_chromescan.COLUMNS)})
    lookup = pl.Series([*strings, None], dtype=pl.String)
    codes = table.select(
        pl.when(pl.col(c) >= 0).then(pl.col(c)).otherwise(len(strings)).cast(pl.UInt32) for c in STRING_FIELDS
    )
    ints = [
        pl.when(pl.col(c) != _NULL_INT).then(pl.col(c)).alias(c)
        for c in table.columns
        if c not in STRING_FIELDS and c != "ph" and not c.endswith(("_at", "_len")) and c != "has_args"
    ]
    rows = table.with_columns(
        *ints,
        *(lookup.gather(codes[c]).alias(c) for c in STRING_FIELDS),
        ph=_PHASES.gather(table["ph"]),
        has_args=pl.col("has_args").cast(pl.Boolean),
    )
    return Scanned(n_events, rows, skipped, top)


def raw_values(doc: bytes | bytearray | memoryview, at: pl.Series, size: pl.Series) -> pl.Series:
    """The raw JSON text of an args value per row (null where absent), as msgspec.Raw would keep it."""
    return pl.Series(
        [bytes(doc[a : a + n]) if n else None for a, n in zip(at.to_list(), size.to_list())], dtype=pl.Binary
    )
