"""Typed columns from the optional C scanner (`_chromescan.c`) for `chrome.decode`.

The scanner reads each JSON document in one pass into columns, never a Python object per event,
keeps the rows of a file's documents together until `take`, and hands them to polars as Arrow
arrays (the PyCapsule interface: no copy, and no numpy). It answers only for
documents it reads exactly as the msgspec path would; for anything else `Scanner.feed` returns None
and `chrome` decodes that document with msgspec. Without a C
compiler at install time the extension is absent and every document takes the msgspec path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
import polars as pl

try:
    from tracediag.ingest import _chromescan
except ImportError:  # built without a C compiler
    _chromescan = None

AVAILABLE = _chromescan is not None
"""Whether the C scanner was built with this install."""

COLUMNS: tuple[str, ...] = _chromescan.COLUMNS if _chromescan is not None else ()
"""The columns of `Scanner.take`."""
RAW_FIELDS = ("input_dims", "input_type", "concrete_inputs")
"""Args kept as their JSON text (Binary)."""


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
    rows: int
    """Rows it added (its X/B/E rows and its `M` metadata)."""


class Scanner:
    """Reads a file's documents (the whole file, or its pieces in order) into one set of rows."""

    def __init__(self, batch_rows: int = 0) -> None:
        """`batch_rows`: the caller takes the rows once they reach about this many (0: unknown): room is
        reserved for no more."""
        self._scanner = _chromescan.Scanner(batch_rows) if _chromescan is not None else None
        self.pieces = 0
        """Documents accepted since the last `take`."""
        self.next_order = 0
        """The `order` the next document's first row gets: the rows of the documents the msgspec path
        read count too (the caller adds them)."""
        self._last_kept = 0
        self.strings = pl.Series(dtype=pl.String)
        """The distinct strings of the rows `take` gave last (every string column's, and maybe more):
        a superset of their names, to match a pattern once per distinct name."""

    def feed(
        self, doc: bytes | bytearray | memoryview, is_array: bool, marker: str | None = None, rest: int | None = None
    ) -> Fed | None:
        """Add a document's rows, or None (and nothing added) where the msgspec path must read it.

        `marker`: the name of an `M` event that may end the document; it is left out if it does.
        `rest`: the bytes from the document's start to the file's end, where known (a mapped file):
        the scanner then reserves room once for the rows to come (to the file's end or `batch_rows`),
        instead of growing by copies.
        """
        if self._scanner is None:
            return None
        result = self._scanner.feed(doc, is_array, marker, self.next_order, -1 if rest is None else rest)
        if isinstance(result, str):  # the reason the scanner declined
            return None
        n_events, kept, skipped, spans, ended, rows = result
        try:
            top = {key: msgspec.json.decode(doc[at : at + size]) for key, (at, size) in spans.items()}
        except msgspec.MsgspecError:  # valid JSON that msgspec refuses (a number out of range)
            self._scanner.drop_last()
            return None
        self.pieces += 1
        self.next_order += kept
        self._last_kept = kept
        return Fed(n_events, kept, skipped, top, ended, rows)

    def drop_last(self) -> None:
        """Forget the document `feed` accepted last."""
        if self._scanner is not None and self.pieces:
            self._scanner.drop_last()
            self.pieces -= 1
            self.next_order -= self._last_kept
            self._last_kept = 0

    def take(self) -> pl.DataFrame:
        """The rows so far, typed (`COLUMNS`); the scanner then holds none.

        `cat` and `name` are Categorical (dictionary-encoded: polars maps each distinct string once, never
        a row), the other strings String, ids, times and counts Int64 (null where absent or not an integer),
        `has_args` Boolean, the raw args (`input_dims`, ...) Binary: the value's JSON text, as
        msgspec.Raw keeps it. `order` numbers the rows that are not `M` metadata (-1 on those).
        """
        if self._scanner is None:
            msg = "the C scanner is not built"
            raise RuntimeError(msg)
        self.pieces = 0
        rows, strings = self._scanner.take()
        self.strings = pl.Series(strings)
        return pl.DataFrame(rows)  # Arrow arrays (PyCapsule interface): no copy
