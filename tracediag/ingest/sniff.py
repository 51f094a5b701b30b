"""Detect a file's format from its content (never from its name) and undo gzip."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from pathlib import Path

from tracediag.errors import TraceError

GZIP_MAGIC = b"\x1f\x8b"
SQLITE_MAGIC = b"SQLite format 3\x00"

_BINARY_MAGICS: dict[bytes, str] = {
    b"\x89PNG": "a PNG image",
    b"\xff\xd8\xff": "a JPEG image",
    b"PK\x03\x04": "a zip archive",
    b"%PDF": "a PDF document",
    b"PAR1": "a Parquet file",
    b"\x7fELF": "an executable",
}


BLOCK_BYTES = 1 << 20


def iter_blocks(path: str | Path, size: int = BLOCK_BYTES) -> Iterator[bytes]:
    """The file's bytes as a stream of blocks, gunzipped on the fly when it starts with the gzip
    magic, so a large trace is never held whole. Read and gzip errors become `TraceError`."""
    try:
        raw = open(path, "rb")  # noqa: SIM115 - closed below; the generator owns it
    except OSError as e:
        raise TraceError(str(path), f"cannot read file ({e.strerror or e})") from None
    with raw:
        stream = gzip.GzipFile(fileobj=raw) if raw.read(2) == GZIP_MAGIC else raw
        raw.seek(0)
        try:
            while block := stream.read(size):
                yield block
        except (OSError, EOFError, zlib.error) as e:
            raise TraceError(str(path), f"corrupt gzip data ({e})") from None


def read_head(path: str | Path, size: int = 64) -> bytes:
    """The first `size` bytes of the file's content (after gunzip)."""
    head = b""
    for block in iter_blocks(path, size):
        head = block
        break
    return head


def sniff(path: str | Path, head: bytes) -> str:
    """The format of a file from its first bytes (after gunzip): "json", "sqlite" or "parquet".

    Raises `TraceError` for an empty file or content that is none of these.
    """
    if head[:16] == SQLITE_MAGIC:
        return "sqlite"
    if head[:4] == b"PAR1":
        return "parquet"
    for magic, what in _BINARY_MAGICS.items():
        if head.startswith(magic):
            raise TraceError(str(path), f"not a trace: the file is {what}")
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not text:
        raise TraceError(str(path), "empty file")
    if text[:1] in (b"{", b"["):
        return "json"
    raise TraceError(str(path), "not a trace: content is not JSON, SQLite or Parquet")
