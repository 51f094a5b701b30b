"""Columns from the optional C scanner (`_chromescan.c`), typed for `chrome.decode`.

The scanner reads each JSON document in one pass into int64 columns, never a Python object per
event, and keeps the columns of a file's documents together until `rows`. It answers only for
documents it reads exactly as the msgspec path would; for anything else `Scanner.feed` returns None
and `chrome` decodes that document with msgspec. Without a C
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

    def take(self) -> tuple[pl.DataFrame, bytes]:
        """Every row so far (ph, the base fields with ts/dur in ns, `has_args`, every args field,
        `piece`, `order` within its piece), and the bytes the raw args columns point into; the
        scanner starts afresh (the next document is piece 0)."""
        if self._scanner is None:
            raise RuntimeError("the C scanner is not built")
        n_rows, columns, strings, raw = self._scanner.columns()
        self._scanner, self.pieces = _chromescan.Scanner(), 0
        data = np.frombuffer(columns, dtype=np.int64).reshape(len(_chromescan.COLUMNS), n_rows)
        table = pl.DataFrame({name: data[i] for i, name in enumerate(_chromescan.COLUMNS)})
        lookup = pl.Series([*strings, None], dtype=pl.String)
        codes = table.select(
            pl.when(pl.col(c) >= 0).then(pl.col(c)).otherwise(len(strings)).cast(pl.UInt32) for c in STRING_FIELDS
        )
        nullable = [c for c in table.columns if c not in _NOT_NULLABLE and c not in STRING_FIELDS]
        rows = table.with_columns(
            *(pl.when(pl.col(c) != _NULL_INT).then(pl.col(c)).alias(c) for c in nullable),
            *(lookup.gather(codes[c]).alias(c) for c in STRING_FIELDS),
            ph=_PHASES.gather(table["ph"]),
            has_args=pl.col("has_args").cast(pl.Boolean),
        )
        return rows, raw


_NOT_NULLABLE = {"ph", "has_args", "piece", "order"} | {f"{f}_{x}" for f in RAW_FIELDS for x in ("at", "len")}


def raw_values(raw: bytes, at: pl.Series, size: pl.Series) -> pl.Series:
    """The raw JSON text of an args value per row (null where absent), as msgspec.Raw keeps it."""
    return pl.Series([raw[a : a + n] if n else None for a, n in zip(at.to_list(), size.to_list())], dtype=pl.Binary)
