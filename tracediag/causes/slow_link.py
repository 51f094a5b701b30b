"""slow_link: one rank's (or one pair's) own transfers are slower than its peers' at the same bytes.

Detector: `detect.slow_link`, over the transfer table (`derive.transfers`): transfer time from the
last participant's arrival, so lateness is not mistaken for a slow link. What-if: its transfers set
to the other links' median of the same class (`whatif.causes.transfers_to`), the send/recvs whose end
the wait for them closed to their faster side (`whatif.causes.closed_by`), and the collectives all its
ranks take part in faster by its ratio (`whatif.causes.collectives_through`: a ring runs at its slowest
link's pace). The ranks everyone
waits for because their transfers end late are its effect: a compute_, host_ or input_straggler
naming only the slow link's ranks and peers, whose named part (extra compute, idle, loading, host
work) is less per step than the link's excess transfer time, is absorbed (a rank whose exchange ends
late arrives late at the next collective; on a shared host its compute stretches meanwhile).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from tracediag.analysis import Cause, Finding
from tracediag.causes.spec import CauseSpec, Context
from tracediag.detect import slow_link
from tracediag.whatif import causes
from tracediag.whatif.price import Pricing

if TYPE_CHECKING:
    from tracediag.detect.facts import Facts
    from tracediag.whatif.graph import Graph


def _detect(ctx: Context) -> list[Finding]:
    return slow_link.detect(ctx.facts, thresholds=ctx.thresholds)


def _target(f: Finding, facts: Facts) -> pl.DataFrame:
    """``op`` (the replay graph's id of each of its transfers) and ``transfer_ns`` (the reference)."""
    rows = slow_link.rows_of(facts, f.ranks, f.evidence["kind"])
    if not rows.height:
        return pl.DataFrame(schema={"op": pl.String, "transfer_ns": pl.Float64})
    prefix = pl.when(pl.col("kind") == "p2p").then(pl.lit("p2p:")).otherwise(pl.lit("c:"))
    return rows.select(op=pl.concat_str(prefix, "key"), transfer_ns=pl.col("ref_ns").cast(pl.Float64))


def _edit(f: Finding, facts: Facts, graph: Graph) -> causes.Edit | None:
    target = _target(f, facts)
    if not graph.ops.join(target, on="op", how="semi").height:
        return None
    # what the slow transfers held up on their ranks goes too: a recv gloo closed when the rank's
    # wait for the slow send returned; and the collectives that cross the link run at its new pace
    own = causes.transfers_to(graph, pl.concat([target, causes.closed_by(graph, target)]))
    through = causes.collectives_through(graph, f.ranks, 1 / max(f.evidence["transfer_ratio_median"], 1.0))
    return causes.combine([own, causes.Edit(causes.Edit.empty().factors, through)])


def _removed(f: Finding, facts: Facts, graph: Graph) -> str:
    who = f"rank {f.ranks[0]}'s" if f.evidence["kind"] == "rank" else f"the pair {f.ranks[0]}-{f.ranks[1]}'s"
    ev = f.evidence
    return (
        f"with {who} transfers at the other links' pace ({ev['peer_transfer_ms_median']:,.1f} ms instead of "
        f"{ev['transfer_ms_median']:,.1f} ms, medians) and the collectives through it "
        f"{ev['transfer_ratio_median']:.1f}x faster"
    )


_PART = {
    "host": "idle_excess_ms",
    "gc": "gc_ms",
    "sync": "sync_ms",
    "checkpoint": "checkpoint_ms",
    "input": "input_excess_ms",
}
"""The window part (ms, over its late arrivals) a host_straggler or input_straggler names (`detect.lateness`)."""


def _named_ms_per_step(f: Finding) -> float | None:
    """What a lateness finding says makes its rank late, per step (ms): the extra compute of a
    compute_straggler, the window part its reason names for host_ and input_straggler; None for others."""
    ev = f.evidence
    if f.cause is Cause.COMPUTE_STRAGGLER:
        return ev.get("compute_ms_median", 0.0) - ev.get("peer_compute_ms_median", 0.0)
    if f.cause in (Cause.HOST_STRAGGLER, Cause.INPUT_STRAGGLER):
        return ev.get(_PART.get(ev.get("reason", ""), ""), 0.0) / max(len(f.steps), 1)
    return None


def _absorbs(own: Finding, other: Finding) -> bool:
    """A rank everyone waits for that is on the slow link (its ranks or their peers on it) is late
    because its transfers end late when what its own finding names (extra compute, idle, loading,
    named host work) is less per step than the link's excess transfer time."""
    if own.cause is not Cause.SLOW_LINK:
        return False
    named = _named_ms_per_step(other)
    near = set(own.ranks) | set(own.evidence.get("peers", ()))
    return named is not None and set(other.ranks) <= near and named < own.evidence["excess_ms_per_step"]


SPEC = CauseSpec(
    cause=Cause.SLOW_LINK,
    detect=_detect,
    pricing=Pricing(edit=_edit, removed=_removed),
    quiet="any one rank's or pair's transfer time against its peers' at the same bytes",
    outliers=lambda f: f.ranks,
    absorbs=_absorbs,
    blames_ranks=True,
)
