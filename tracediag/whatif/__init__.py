"""What-if: replay each step from the trace with a cause's durations edited, to price each cause.

`derive.sync_segments` derives what one rank gives the replay (timeline pieces, sync ends: small per-rank tables,
written where the rank's file lies on the executor path), `graph.build` joins them across ranks into
local segments and sync operations,
`replay.replay` computes step times from (edited) durations, `causes` holds one edit per cause.
"""

from __future__ import annotations

import polars as pl

from tracediag.derive.p2p import stage_order
from tracediag.detect.facts import Facts
from tracediag.whatif.graph import Graph, build


def graph_of(
    facts: Facts, *, segments: pl.DataFrame, sync: pl.DataFrame, offsets: pl.DataFrame, matched: pl.DataFrame
) -> Graph:
    """The replay graph of the kept steps of `facts` (pipeline neighbours from its stage order) from
    every rank's `sync_segments.segments` and `sync_segments.sync_ends` and the matched collectives."""
    neighbours: dict[int, tuple[int, int]] = {}
    for ranks in facts.pipelines:
        order = stage_order(facts.p2p, ranks)
        for i, r in enumerate(order):
            neighbours[r] = (order[i - 1] if i else -1, order[i + 1] if i + 1 < len(order) else -1)
    return build(segments, sync, offsets, matched, facts.steps, neighbours)
