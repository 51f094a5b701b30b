"""Who everyone waits for at the collectives, and why (`derive.lateness`; issue 24).

`assess` reads the per-instance lateness rows of the analysed steps and names the ranks everyone
waits for (one rank, a set such as a slow node's ranks, or no one) with the share of all waiting
they explain.
"""

from __future__ import annotations

import polars as pl

from tracediag.analysis import Lateness
from tracediag.derive import lateness
from tracediag.detect.facts import Facts
from tracediag.detect.thresholds import Thresholds


def assess(facts: Facts, th: Thresholds) -> Lateness | None:
    """The run's `Lateness` over the facts' steps; None when no collective was matched."""
    rows = facts.late
    if rows is None or not rows.height or not facts.steps.height:
        return None
    rows = rows.join(facts.steps.select("step").unique(), on="step", how="semi")
    if not rows.height:
        return None
    analysed = float(facts.steps.group_by("step").agg(pl.col("dur_ns").median())["dur_ns"].sum())
    return lateness.assess(
        rows,
        step_time_ns=analysed,
        share=th.lateness_share,
        gap=th.lateness_gap,
        chance=th.lateness_chance,
        min_wait=th.lateness_min_wait,
    )
