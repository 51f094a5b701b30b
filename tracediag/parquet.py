"""Parquet files on a local disk or an object store, written whole or not at all.

A location is a local path or an object-store URL (``s3://``, ``gs://``, ``az://``; polars reads and
writes those with `storage_options`). A local file is written to a temporary name and renamed, a
remote one in one PUT, so a reader sees the whole file or none.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import polars as pl
from polars.exceptions import PanicException


def is_url(location: str) -> bool:
    """An object-store URL (anything with a scheme but ``file``), else a local path."""
    return "://" in location and not location.startswith("file://")


def join(base: str, *parts: str) -> str:
    """`parts` under `base`, with ``/`` for a URL and the OS separator for a local path."""
    return "/".join([base.rstrip("/"), *parts]) if is_url(base) else os.path.join(base, *parts)


def write_parquet(frame: pl.DataFrame, dest: str, storage_options: dict[str, Any] | None = None) -> None:
    """Write `frame` so that a reader sees the whole file or none: temp name + rename locally, one PUT remotely."""
    if is_url(dest):
        frame.write_parquet(dest, storage_options=storage_options)
        return
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = f"{dest}.tmp-{uuid.uuid4().hex}"
    try:
        frame.write_parquet(tmp)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def read_parquet(src: str | list[str], storage_options: dict[str, Any] | None = None) -> pl.DataFrame:
    """One file, or several of one schema concatenated in the order given."""
    if isinstance(src, list) and not src:
        msg = "no files to read"
        raise ValueError(msg)
    try:
        return pl.read_parquet(src, storage_options=storage_options) if storage_options else pl.read_parquet(src)
    except PanicException as e:  # a BaseException: damaged bytes can trip polars' decoder asserts
        where = src if isinstance(src, str) else ", ".join(src[:2]) + (" ..." if len(src) > 2 else "")
        msg = f"{where}: damaged Parquet (the decoder failed: {str(e).splitlines()[0][:160]})"
        raise ValueError(msg) from None
