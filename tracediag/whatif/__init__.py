"""What-if: replay each step from the trace with a cause's durations edited, to price each cause.

`derive.sync_segments` derives what one rank gives the replay (timeline pieces, sync ends: small per-rank tables,
written where the rank's file lies on the executor path), `graph.build` joins them across ranks into
local segments and sync operations,
`replay.replay` computes step times from (edited) durations, `causes` holds one edit per cause.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tracediag.derive.p2p import stage_neighbours
from tracediag.whatif.graph import Graph, build

if TYPE_CHECKING:
    import polars as pl

    from tracediag.detect.facts import Facts


@dataclass(frozen=True, eq=False)
class ReplayInputs:
    """What the replay reads beside the facts: every rank's timeline pieces and sync ends (the
    summary's ``replay_segments`` and ``replay_sync``), the clock offsets and the matched collectives."""

    segments: pl.DataFrame
    """`derive.sync_segments.segments` of every rank."""
    sync: pl.DataFrame
    """`derive.sync_segments.sync_ends` of every rank."""
    offsets: pl.DataFrame
    """``rank, offset_ns``: each rank's clock offset (`derive.collectives.align_and_match`)."""
    matched: pl.DataFrame
    """The collective instances matched across ranks (`derive.collectives.plausible_matches`)."""
    pairs: pl.DataFrame | None = None
    """The send/recv pairs (`derive.p2p.p2p_pairs`), when the reduce made them; else the graph makes them."""


def graph_of(facts: Facts, replay: ReplayInputs) -> Graph:
    """The replay graph of the kept steps of `facts` (pipeline neighbours from its stage order) from
    every rank's `sync_segments.segments` and `sync_segments.sync_ends` and the matched collectives (`replay`)."""
    neighbours = stage_neighbours(facts.p2p, facts.pipelines)
    return build(
        replay.segments, replay.sync, replay.offsets, replay.matched, facts.steps, neighbours, pairs=replay.pairs
    )
