"""Write outputs safely: never over an input, never half-written, never removing what tracediag
did not create.

An output is written to a temporary file beside the target and renamed over it only once complete,
so a failed write leaves the target as it was (and removes only the temporary file).
"""

from __future__ import annotations

import os
import stat
import tempfile
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from tracediag.errors import OutputError, one_line, shown
from tracediag.ingest.remote import is_remote, location_key

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable


def refuse_inputs(output: str | Path, inputs: Iterable[str | Path], option: str) -> None:
    """`OutputError` when `output` is one of `inputs`: the same resolved path or URL (``file://``
    and a plain path, ``gs://`` and ``gcs://`` name one place), or the same file (inode) under
    another name (a hard or symbolic link); or, local, when it could not be written (`check_writable`).
    Every command calls it on its outputs before reading an input."""
    try:
        out_st = None if is_remote(output) else os.stat(output)
    except OSError:
        out_st = None
    out_key = location_key(str(output))
    for src in inputs:
        same = location_key(str(src)) == out_key
        if not same and out_st is not None and not is_remote(src):
            with suppress(OSError):
                src_st = os.stat(src)
                same = (src_st.st_dev, src_st.st_ino) == (out_st.st_dev, out_st.st_ino)
        if same:
            msg = f"{shown(output)}: {option} names an input file; refusing to overwrite it"
            raise OutputError(msg)
    if not is_remote(output):
        check_writable(output)


OUT_PARTS = ("ranks", "events", "done", "attempts", "manifest.parquet")
"""What a summary run writes under its ``--out`` (`execute.task`)."""


def refuse_inputs_under(out: str, inputs: Iterable[str | Path], option: str) -> None:
    """`OutputError` when an input lies where a summary run writes under the folder or prefix `out`."""
    base = location_key(out).rstrip("/")
    places = [f"{base}/{part}" for part in OUT_PARTS]
    for src in inputs:
        key = location_key(str(src))
        if any(key == p or key.startswith(p + "/") for p in places):
            msg = f"{shown(src)}: {option} {shown(out)} would write over this input; refusing"
            raise OutputError(msg)


def check_writable(path: str | Path) -> os.stat_result | None:
    """The stat of the local file `path` will replace (None when it does not exist yet), or `OutputError`
    when `write_atomic` could not write it: not a regular file (a device, a FIFO, a directory), or no such
    folder. Commands call it on their outputs before the work, so a bad output costs no analysis and prints
    nothing partial."""
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as e:
        msg = f"{shown(path)}: cannot write ({e.strerror or e})"
        raise OutputError(msg) from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        msg = f"{shown(path)}: exists and is not a regular file; refusing to replace it"
        raise OutputError(msg)
    if not path.parent.is_dir():
        msg = f"{shown(path)}: cannot write, no such folder {shown(path.parent)}"
        raise OutputError(msg)
    return st


def write_atomic(path: str | Path, write: Callable[[BinaryIO], object] | bytes) -> None:
    """Write `path` through a temporary file in its folder, renamed over it when complete.

    `write` is the bytes, or a function writing to the open file. The target, when it exists,
    must be a regular file (a device, a FIFO or a directory is never replaced); it keeps its mode.
    Raises `OutputError` with one line naming the file.
    """
    path = Path(path)
    st = check_writable(path)
    folder = path.parent
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tracediag-", suffix=".tmp")
    except OSError as e:
        msg = f"{shown(path)}: cannot write ({e.strerror or e})"
        raise OutputError(msg) from None
    try:
        os.fchmod(fd, stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            if isinstance(write, (bytes, bytearray)):
                f.write(write)
            else:
                write(f)
        os.replace(tmp, path)
    except BaseException as e:
        with suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            msg = f"{shown(path)}: cannot write ({one_line(e.strerror or str(e))})"
            raise OutputError(msg) from None
        raise


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
