"""Read one trace file of any supported format into a `FileTrace`, the format found from content."""

from __future__ import annotations

from pathlib import Path

from tracediag.errors import NotATraceError, TraceError
from tracediag.ingest import chrome, kineto
from tracediag.ingest.sniff import iter_blocks, peek_head, sniff
from tracediag.ingest.trace import FileTrace


def read_file(path: str | Path, *, rank: int | None = None, default_rank: int | None = None) -> FileTrace:
    """The event table of one trace file (Kineto/Chrome JSON, JAX JSON or Nsight Systems SQLite).

    `rank` overrides the rank the file names; `default_rank` applies only when it names none.
    Raises `TraceError` (one line: file and problem) or `RankError`.
    """
    path = str(path)
    if path.endswith(".nsys-rep"):
        from tracediag.ingest.nsys import export_nsys_rep

        path = str(export_nsys_rep(path))
    head, blocks = peek_head(iter_blocks(path))  # one open: a pipe can be read only once
    try:
        fmt = sniff(path, head)
    except TraceError:
        blocks.close()
        raise
    if fmt != "json":
        blocks.close()
    if fmt == "sqlite":
        from tracediag.ingest.nsys import read_nsys

        return read_nsys(path, rank=rank, default_rank=default_rank)
    if fmt != "json":
        raise NotATraceError(path, f"a {fmt} file is not a trace; pass it on its own to load a saved run")
    decoded = chrome.decode(blocks, path)
    if _is_jax(decoded):
        from tracediag.ingest import jax

        return jax.to_events(decoded, path, rank=rank, default_rank=default_rank)
    return kineto.to_events(decoded, path, rank=rank, default_rank=default_rank)


def _is_jax(decoded: chrome.Decoded) -> bool:
    """JAX writes `metadata.highres-ticks` and names its processes `/host:CPU`, `/device:...`."""
    meta = decoded.top.get("metadata")
    if isinstance(meta, dict) and "highres-ticks" in meta:
        return True
    labels = decoded.metadata.filter(decoded.metadata["name"] == "process_name")["label"]
    return bool(labels.str.starts_with("/host:").any() or labels.str.starts_with("/device:").any())
