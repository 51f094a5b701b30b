"""What a Perfetto export of a large run keeps (`--ranks`, `--max-events`): without polars, so that the
command line's options are defined without importing the export."""

from __future__ import annotations

import re

DEFAULT_MAX_EVENTS = 2_000_000
"""Timeline events written at most by default: Perfetto's UI loads a few million in a browser tab
(chrome://tracing fewer); beyond it the shortest events are left out, and the file says so."""


def parse_ranks(text: str) -> tuple[int, ...]:
    """``"0,3,5-7"`` as ``(0, 3, 5, 6, 7)``; ValueError naming the part that is not a rank or a range."""
    out: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m or (m[2] is not None and int(m[2]) < int(m[1])):
            msg = f"{part!r} is not a rank or a range of ranks (e.g. 0,3,5-7)"
            raise ValueError(msg)
        lo, hi = int(m[1]), int(m[2] if m[2] is not None else m[1])
        if hi - lo > 1_000_000:
            msg = f"{part!r}: a range of more than a million ranks"
            raise ValueError(msg)
        out.update(range(lo, hi + 1))
    return tuple(sorted(out))
