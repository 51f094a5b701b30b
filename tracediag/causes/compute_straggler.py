"""compute_straggler: one rank computes longer than its peers while they wait for it.

Detector: `detect.straggler`, and `detect.lateness` for a rank everyone waits for at the
collectives that computes longer in the windows before its late arrivals (`causes.late`). What-if:
the rank's compute in its steps set to its peers' median (`whatif.causes.stragglers`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from tracediag.analysis import Cause, Finding
from tracediag.causes import late
from tracediag.causes.spec import CauseSpec, Context
from tracediag.detect import straggler
from tracediag.units import NS_PER_MS, rank_list
from tracediag.whatif import causes
from tracediag.whatif.price import Pricing

if TYPE_CHECKING:
    from tracediag.detect.facts import Facts
    from tracediag.whatif.graph import Graph


def _ratios(ctx: Context) -> pl.DataFrame | None:
    """Per (rank, step) compute ratios, derived once per pass (the healthy finding reads them too)."""
    return ctx.memo(straggler.rank_step_ratios) if ctx.facts.steps.height else None


def _detect(ctx: Context) -> list[Finding]:
    """The straggler rules' findings, with the waited-for ranks' (`causes.late`)."""
    return late.of(Cause.COMPUTE_STRAGGLER, ctx)


def _near(ctx: Context) -> tuple[float, str]:
    th = ctx.thresholds
    ratio = _ratios(ctx).group_by("rank").agg(pl.col("ratio").median())["ratio"].max()
    return (
        (ratio - 1) / (th.straggler_persistent_ratio - 1),
        f"the slowest rank computes {ratio:.2f}x its peers (compute_straggler from "
        f"{th.straggler_persistent_ratio}x, or {th.straggler_min_ratio}x when it is last on most steps)",
    )


def _outliers(f: Finding) -> tuple[int, ...]:
    """A persistent straggler sets the pace of the whole run; a transient one only of its steps."""
    return f.ranks if f.evidence["kind"] == "persistent" else ()


def _edit(f: Finding, facts: Facts, graph: Graph) -> causes.Edit:
    return causes.combine([causes.stragglers(graph, facts.steps, f.ranks, f.steps)])


def _ranks(ranks: tuple[int, ...]) -> str:
    return f"{rank_list(ranks)}'s" if len(ranks) == 1 else f"{rank_list(ranks)}'"


def _removed(f: Finding, facts: Facts, graph: Graph) -> str:
    s = facts.steps.filter(pl.col("step").is_in(list(f.steps)))
    peers = (
        s.filter(~pl.col("rank").is_in(list(f.ranks))).group_by("step").agg(pl.col("compute_ns").median().alias("_p"))
    )
    extra = (
        s.filter(pl.col("rank").is_in(list(f.ranks)))
        .join(peers, on="step")
        .select((pl.col("compute_ns") - pl.col("_p")).clip(lower_bound=0).median())
        .item()
    )
    ms = float(extra or 0) / NS_PER_MS
    its = "its" if len(f.ranks) == 1 else "their"
    return f"without {_ranks(f.ranks)} extra compute ({ms:,.1f} ms per step over {its} peers' median)"


SPEC = CauseSpec(
    cause=Cause.COMPUTE_STRAGGLER,
    detect=_detect,
    pricing=Pricing(edit=_edit, removed=_removed),
    quiet="no rank computes persistently longer than its peers",
    near=_near,
    outliers=_outliers,
    blames_ranks=True,
)
