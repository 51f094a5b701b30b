"""Detect a file's format from its content (never from its name) and undo gzip."""

from __future__ import annotations

import gzip
import io
import mmap
import os
import select
import stat
import zlib
from typing import TYPE_CHECKING, Any, BinaryIO

from tracediag.errors import TraceError
from tracediag.ingest.remote import is_remote, open_stream, storage_error

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

GZIP_MAGIC = b"\x1f\x8b"
SQLITE_MAGIC = b"SQLite format 3\x00"

_UTF16 = "UTF-16 text (traces are read as UTF-8: convert it with iconv -f UTF-16 -t UTF-8)"
_BINARY_MAGICS: dict[bytes, str] = {
    b"\x89PNG": "a PNG image",
    b"\xff\xd8\xff": "a JPEG image",
    b"PK\x03\x04": "a zip archive",
    b"%PDF": "a PDF document",
    b"PAR1": "a Parquet file",
    b"\x7fELF": "an executable",
    GZIP_MAGIC: "gzipped twice (gunzip it once)",
    b"BZh": "bzip2-compressed (only gzip is undone: recompress it with gzip)",
    b"\xfd7zXZ\x00": "xz-compressed (only gzip is undone: recompress it with gzip)",
    b"\x28\xb5\x2f\xfd": "zstd-compressed (only gzip is undone: recompress it with gzip)",
    b"\xff\xfe": _UTF16,
    b"\xfe\xff": _UTF16,
}
"""Content sniff refuses by name (after gunzip: a gzip magic there is a second gzip)."""


BLOCK_BYTES = 1 << 20
_LEADING = b"\xef\xbb\xbf \t\r\n"
"""What may come before a document's first byte: a UTF-8 byte-order mark and whitespace."""


def open_input(path: str | Path) -> BinaryIO:
    """Open an input file for reading, never blocking and never reading what has no end.

    Regular files open as usual. A pipe or FIFO (a process substitution `<(zcat ...)`) is read as
    a stream: it is opened without waiting for a writer, so a FIFO nobody writes reads as empty
    instead of hanging. Devices, sockets and directories are refused with a `TraceError`.
    """
    try:
        st = os.stat(path)
        if stat.S_ISREG(st.st_mode):
            return open(path, "rb")
        if stat.S_ISFIFO(st.st_mode):
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            return io.BufferedReader(_PollingPipe(fd))
    except OSError as e:
        raise TraceError(str(path), f"cannot read file ({e.strerror or e})") from None
    kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a device or socket"
    raise TraceError(str(path), f"not a regular file ({kind})")


class _PollingPipe(io.RawIOBase):
    """A pipe read in waits of at most a quarter second: a signal (Ctrl-C, SIGTERM) is acted on while
    the writer stalls, however the process's threads receive it (one blocking read on the main thread
    never returns when another thread took the signal)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def readinto(self, buffer: Any) -> int:
        """Read what the pipe holds (0 at its end, or when no writer ever opened it: no wait for one)."""
        while True:
            try:
                return os.readv(self._fd, [buffer])
            except BlockingIOError:  # a writer, no data yet (the descriptor does not block)
                select.select([self._fd], [], [], 0.25)

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()


def map_plain(path: str | Path) -> mmap.mmap | None:
    """A local, regular, uncompressed, non-empty file mapped copy-on-write (the reader then neither
    copies its bytes nor holds them: it drops the pages it is done with), else None (read it as a
    stream of blocks)."""
    if is_remote(str(path)):
        return None
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a pipe is opened once, by `iter_blocks`
            return None
        with open(path, "rb") as fh:
            if os.fstat(fh.fileno()).st_size < 2 or fh.read(2) == GZIP_MAGIC:
                return None
            return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
    except (OSError, ValueError):  # unmappable (a special file system): read as a stream
        return None


def is_stream(path: str | Path) -> bool:
    """Whether `path` is a pipe or FIFO (readable once, in this process only)."""
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        return False


def iter_blocks(
    path: str | Path, size: int = BLOCK_BYTES, *, storage_options: dict[str, Any] | None = None
) -> Iterator[bytes]:
    """The file's bytes as a stream of blocks, gunzipped on the fly when it starts with the gzip
    magic, so a large trace is never held whole (and a pipe is read once, front to back). A URL
    (`ingest.remote`) is read as a stream from its store with `storage_options`. Read and gzip
    errors become `TraceError`; a URL's transient storage errors an `OSError` naming it (retryable)."""
    remote = is_remote(path)
    if remote:
        raw, length = open_stream(str(path), storage_options)
    else:
        raw = open_input(path)
        length = os.fstat(raw.fileno()).st_size
    with raw:
        try:
            gzipped = raw.peek(2)[:2] == GZIP_MAGIC
            stream = gzip.GzipFile(fileobj=raw) if gzipped else raw
            limit = gunzip_limit(length or 0) if gzipped else None
            total = 0
            while block := stream.read(size):
                total += len(block)
                if limit is not None and total > limit:
                    raise TraceError(
                        str(path), f"gzip data expands past {limit / 1e6:,.0f} MB ({GUNZIP_RATIO}x the file): a bomb?"
                    )
                yield block
        except (gzip.BadGzipFile, EOFError, zlib.error) as e:
            raise TraceError(str(path), f"corrupt gzip data ({e})") from None
        except OSError as e:
            if remote:
                raise storage_error(str(path), e) from None
            raise TraceError(str(path), f"corrupt gzip data ({e})") from None


GUNZIP_RATIO = 200
"""A gzipped trace may grow at most this many times its compressed size (real traces: 20-50x)."""
GUNZIP_FLOOR = 256 << 20


def gunzip_limit(compressed: int) -> int | None:
    """The most bytes a gzipped file of `compressed` bytes may expand to (None: a pipe, size unknown)."""
    return max(GUNZIP_RATIO * compressed, GUNZIP_FLOOR) if compressed > 0 else None


def peek_head(blocks: Iterator[bytes], size: int = 64) -> tuple[bytes, Iterator[bytes], int]:
    """The first `size` bytes of content after any byte-order mark and leading whitespace (however
    long), the content's blocks from there on (what was read to find the head is not lost), and how
    many bytes were skipped before it (so that an offset in the content is one in the file)."""
    content = b""
    lead = 0
    for block in blocks:
        if content:
            content += block
        else:
            content = block.lstrip(_LEADING)
            lead += len(block) - len(content)
        if len(content) >= size:
            break
    return content[:size], _chain(content, blocks), lead


def _chain(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    """`first`, then `rest`; closing it closes `rest` (and so the file)."""
    try:
        yield first
        yield from rest
    finally:
        close = getattr(rest, "close", None)
        if close is not None:
            close()


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
    text = head.lstrip(_LEADING)
    if not text:
        raise TraceError(str(path), "empty file")
    if text[:1] in (b"{", b"["):
        return "json"
    if text[:2] in (b"{\x00", b"[\x00", b"\x00{", b"\x00["):  # UTF-16 without a byte-order mark
        raise TraceError(str(path), f"not a trace: the file is {_UTF16}")
    raise TraceError(str(path), "not a trace: content is not JSON, SQLite or Parquet")
