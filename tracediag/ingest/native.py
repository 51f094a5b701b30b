"""Columns from the optional C scanner (`_chromescan.c`), typed for `chrome.decode`.

The scanner reads each JSON document in one pass into int64 columns, never a Python object per
event, and keeps the columns of a file's documents together until `rows`. It answers only for
documents it reads exactly as the msgspec path would; for anything else `Scanner.feed` returns None
and `chrome` decodes that document with msgspec. Without a C
compiler at install time the extension is absent and every document takes the msgspec path.
"""

from __future__ import annotations

from collections.abc import Iterable
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
"""What the scanner writes for a null integer."""
STRING_FIELDS = (
    "ph",
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
class Fed:
    """What one accepted document added."""

    n_events: int
    """Events in the document, counted ones included."""
    kept: int
    """Its X/B/E rows (the rows of the event frame; `M` rows are metadata)."""
    skipped: dict[str, int]
    """Events of the phases that are only counted, by reason."""
    top: dict[str, Any]
    """The top-level keys tracediag reads (Object form)."""
    ended: bool
    """The document's last event was the `marker` given to `feed` (and was left out)."""


class Scanner:
    """Reads a file's documents (the whole file, or its pieces in order) into one set of rows."""

    def __init__(self) -> None:
        self._scanner = _chromescan.Scanner() if _chromescan is not None else None
        self.pieces = 0
        """Documents accepted so far (the `piece` column numbers them from 0)."""

    def feed(self, doc: bytes | bytearray | memoryview, is_array: bool, marker: str | None = None) -> Fed | None:
        """Add a document's rows, or None (and nothing added) where the msgspec path must read it.

        `marker`: the name of an `M` event that may end the document; it is left out if it does.
        """
        if self._scanner is None:
            return None
        result = self._scanner.feed(doc, is_array, marker)
        if isinstance(result, str):  # the reason the scanner declined
            return None
        n_events, kept, skipped, spans, ended = result
        try:
            top = {key: msgspec.json.decode(doc[at : at + size]) for key, (at, size) in spans.items()}
        except msgspec.MsgspecError:  # valid JSON that msgspec refuses (a number out of range)
            self._scanner.drop_last()
            return None
        self.pieces += 1
        return Fed(n_events, kept, skipped, top, ended)

    def drop_last(self) -> None:
        """Forget the document `feed` accepted last."""
        if self._scanner is not None and self.pieces:
            self._scanner.drop_last()
            self.pieces -= 1

    def take(self) -> Columns:
        """The rows so far, as the scanner wrote them; the scanner starts afresh (the next document
        is piece 0)."""
        if self._scanner is None:
            raise RuntimeError("the C scanner is not built")
        columns, strings, raw = self._scanner.columns()
        self._scanner, self.pieces = _chromescan.Scanner(), 0
        table = pl.DataFrame(
            {name: np.frombuffer(column, dtype=np.int64) for name, column in zip(_chromescan.COLUMNS, columns)}
        )
        return Columns(table, pl.Series([*strings, None], dtype=pl.String), raw)


@dataclass
class Columns:
    """Scanned rows before typing: every column int64 (`has_args` 0/1, strings (`ph` too) as indexes
    into `strings`, nulls as -1 or INT64_MIN, raw args as places in `raw`), plus `piece` and `order`
    (the row's number among its document's rows that are not `M` metadata; -1 on those). Type only the
    rows and fields that are needed (`typed`): most args fields matter on few rows."""

    table: pl.DataFrame
    strings: pl.Series
    """The distinct strings, then a null (where the -1 indexes point)."""
    raw: bytes

    def typed(self, rows: pl.DataFrame, fields: Iterable[str]) -> pl.DataFrame:
        """`rows` (some rows of `table`) with `fields` typed: ph and strings String, has_args
        Boolean, ids/times/counts Int64 with nulls, raw args (`input_dims`, ...) Binary."""
        fields = list(fields)
        null_at = self.strings.len() - 1
        strings = [f for f in fields if f in STRING_FIELDS]
        codes = rows.select(
            pl.when(pl.col(f) >= 0).then(pl.col(f)).otherwise(null_at).cast(pl.UInt32) for f in strings
        )
        columns = [self.strings.gather(codes[f]).alias(f) for f in strings]
        for f in fields:
            if f == "has_args":
                columns.append(rows["has_args"].cast(pl.Boolean))
            elif f in RAW_FIELDS:
                columns.append(self._raw_values(rows[f"{f}_at"], rows[f"{f}_len"]).alias(f))
        ints = [pl.when(pl.col(f) != _NULL_INT).then(pl.col(f)).alias(f) for f in fields if f in _INT_FIELDS]
        return rows.with_columns(*ints, *columns)

    def _raw_values(self, at: pl.Series, size: pl.Series) -> pl.Series:
        """The raw JSON text of an args value per row (null where absent), as msgspec.Raw keeps it."""
        raw = self.raw
        return pl.Series([raw[a : a + n] if n else None for a, n in zip(at.to_list(), size.to_list())], dtype=pl.Binary)


_INT_FIELDS = frozenset(
    c
    for c in (_chromescan.COLUMNS if _chromescan is not None else ())
    if c not in STRING_FIELDS and c not in ("ph", "has_args", "piece", "order") and not c.endswith(("_at", "_len"))
)
