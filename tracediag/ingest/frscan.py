"""Flight Recorder pickles to typed columns through the optional C scanner (`_frscan.c`).

The scanner runs the plain-data subset of the pickle machine and writes the entries' fields straight
into columns, with no Python object per entry; here they become Arrow arrays (no copy) and a polars
frame of `flight`'s raw entry fields. It answers only for dumps that the restricted unpickler
(`safepickle`) and flight's typing would read to the same rows; for any other dump (another opcode,
truncated, an entry field of another type) `scan` returns None and flight reads it the slow way, which
gives the one-line error or the counted skips. Without a C compiler at install time every dump takes
that way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl
import pyarrow as pa

from tracediag.errors import TraceError

try:
    from tracediag.ingest import _frscan
except ImportError:  # built without a C compiler
    _frscan = None

AVAILABLE = _frscan is not None
"""Whether the C scanner was built with this install."""

_INT, _STR, _BOOL, _LIST = range(4)


@dataclass(frozen=True, slots=True)
class Scanned:
    """A dump the scanner read."""

    top: dict[str, Any]
    """The dump's top-level dict (pg_config, pg_status, version, rank), ``entries`` set to None."""
    raw: pa.Table
    """The kept entries' fields (`flight._RAW` less frames, booleans as int8) and `stack_id` (each
    entry's index into `stacks`), in file order; `to_polars` types a batch of them at once."""
    dropped: int
    """Entries before the newest `max_entries` (not in `raw`)."""
    stacks: list[list[dict[str, Any]] | None]
    """The distinct frame lists, by first appearance."""


def _array(spec: tuple) -> pa.Array:
    kind, rows, bits, data, chars, child = spec
    validity = pa.py_buffer(bits)
    if kind == _INT:
        return pa.Array.from_buffers(pa.int64(), rows, [validity, pa.py_buffer(data)])
    if kind == _BOOL:  # cast once per batch (`to_polars`)
        return pa.Array.from_buffers(pa.int8(), rows, [validity, pa.py_buffer(data)])
    if kind == _STR:
        return pa.Array.from_buffers(pa.large_string(), rows, [validity, pa.py_buffer(data), pa.py_buffer(chars)])
    inner = _array(child)
    return pa.Array.from_buffers(pa.large_list(inner.type), rows, [validity, pa.py_buffer(data)], children=[inner])


def scan(data: bytes, path: str, max_entries: int) -> Scanned | None:
    """The dump's entries as columns, or None where the restricted unpickler must read it.

    Raises
    ------
    TraceError
        The pickle's shared lists and strings would expand past the scanner's cap (a pickle bomb).
    """
    if _frscan is None:
        return None
    try:
        out = _frscan.scan(data, max_entries)
    except ValueError as e:
        raise TraceError(path, str(e)) from None
    if isinstance(out, str):
        return None
    top, kept, dropped, columns, ids, stacks = out
    arrays = {name: _array(spec) for name, spec in zip(_frscan.FIELDS, columns, strict=True)}
    arrays["stack_id"] = pa.Array.from_buffers(pa.int32(), kept, [None, pa.py_buffer(ids)])
    return Scanned(top=top, raw=pa.table(arrays), dropped=dropped, stacks=stacks)


def to_polars(tables: list[pa.Table], schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """Scanned tables (each with its `rank` column added) as one polars frame of `schema`."""
    return pl.from_arrow(pa.concat_tables(tables)).cast(schema)  # large_string -> String, int8 -> Boolean
