"""What `tracediag analyze` prints: one analysis, or one per file (``--allow-mixed``), as the versioned
JSON document (docs/analysis-json.md) or as text, each with its observed-vs-predicted block when a
plan or a model was given."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, BinaryIO

import orjson
import polars as pl

from tracediag.errors import shown

if TYPE_CHECKING:
    from tracediag.analysis import Analysis


def analyses_json(results: list[tuple[str, Analysis]]) -> str:
    """One analysis as its document; analyses per file as ``{"per_file": [...]}``, each naming its file."""
    return analyses_json_bytes(results, newline=False).decode()


ROWS_AT_ONCE = 8192
"""Rows of a table made Python objects at once when a document is written (`write_analyses_json`)."""


def analyses_json_bytes(results: list[tuple[str, Analysis]], *, newline: bool = True) -> bytes:
    """`analyses_json` as UTF-8 (with a final newline: the file ``analyze -o`` writes)."""
    out = io.BytesIO()
    write_analyses_json(results, out, newline=newline)
    return out.getvalue()


def write_analyses_json(results: list[tuple[str, Analysis]], f: BinaryIO, *, newline: bool = True) -> None:
    """Write `analyses_json`'s bytes to `f`, a table's rows a slice at a time: the document (180 MB at
    16,384 ranks) is never held, nor its per-row dicts, only `ROWS_AT_ONCE` of them."""
    docs = [{**({"file": p} if p else {}), **r.to_dict(tables=False)} for p, r in results]
    _write(docs[0] if len(docs) == 1 and not results[0][0] else {"per_file": docs}, f)
    if newline:
        f.write(b"\n")


def _write(value: object, f: BinaryIO) -> None:
    """`value` as orjson writes it, its DataFrames as lists of row objects written a slice at a time."""
    if isinstance(value, pl.DataFrame):
        f.write(b"[")
        for i in range(0, value.height, ROWS_AT_ONCE):
            f.write((b"," if i else b"") + orjson.dumps(value.slice(i, ROWS_AT_ONCE).to_dicts())[1:-1])
        f.write(b"]")
    elif isinstance(value, dict) and _holds_frame(value):
        f.write(b"{")
        for i, (k, v) in enumerate(value.items()):
            f.write((b"," if i else b"") + orjson.dumps(k) + b":")
            _write(v, f)
        f.write(b"}")
    elif isinstance(value, list) and _holds_frame(value):
        f.write(b"[")
        for i, v in enumerate(value):
            f.write(b"," if i else b"")
            _write(v, f)
        f.write(b"]")
    else:
        f.write(orjson.dumps(value))


def _holds_frame(value: object) -> bool:
    if isinstance(value, pl.DataFrame):
        return True
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return any(_holds_frame(v) for v in items)


def analyses_text(results: list[tuple[str, Analysis]], *, kernels_top: int = 0) -> str:
    """The text report of each analysis, its check's block and (`kernels_top`) each rank's top kernels;
    an analysis of one file of several headed by its name."""
    from tracediag.report.check_text import render_check_text
    from tracediag.report.kernels_text import render_kernels
    from tracediag.report.text import render_text

    parts = []
    for p, r in results:
        body = render_text(r)
        if r.check is not None:
            body += f"\n\n{render_check_text(r.check)}"
        if kernels_top:
            body += "\n\n" + render_kernels(r, kernels_top)
        parts.append(f"== {shown(p)} (analysed alone: --allow-mixed)\n{body}" if p else body)
    return "\n\n".join(parts)
