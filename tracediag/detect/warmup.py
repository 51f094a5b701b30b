"""Warm-up: slow first steps on every rank are the job starting, not a rank straggling.

A leading step is warm-up when every rank is slow *on its own*: every rank's step, less the time it
waits in collectives for its peers (``wait_ns``), takes at least `warmup_ratio` × that rank's median
of the same over the steps after it (first iterations allocate memory, compile, build DDP buckets,
fill caches — on every rank). The wait is left out because one slow rank makes every step of the
job slow: its peers' steps grow by their wait for it, not by work of their own, so a straggler whose
first slow step is the first profiled step is not warm-up. Leading steps are tested in order and
the first one that is not warm-up ends the warm-up; at least one step is always left. The detectors
then read the facts without them, and the analysis says which steps were warm-up (they stay in the
per-step table).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import polars as pl

if TYPE_CHECKING:
    from tracediag.detect.facts import Facts
    from tracediag.detect.thresholds import Thresholds


def warmup_steps(steps: pl.DataFrame, th: Thresholds) -> list[int]:
    """The leading warm-up step numbers of `steps` (per (rank, step) rows with ``dur_ns`` and, when
    known, ``wait_ns``)."""
    numbers = sorted(steps["step"].unique().to_list()) if steps.height else []
    wait = pl.col("wait_ns").fill_null(0) if "wait_ns" in steps.columns else pl.lit(0)
    own = steps.select("rank", "step", own_ns=(pl.col("dur_ns") - pl.min_horizontal(wait, pl.col("dur_ns"))))
    out: list[int] = []
    for i, step in enumerate(numbers[:-1]):
        later = own.filter(pl.col("step").is_in(numbers[i + 1 :])).group_by("rank").agg(pl.col("own_ns").median())
        this = own.filter(pl.col("step") == step).join(later, on="rank", suffix="_later")
        if this.height == 0 or this.height < own["rank"].n_unique():
            break
        ratio = (this["own_ns"] / this["own_ns_later"].clip(lower_bound=1)).min()
        if ratio is None or ratio < th.warmup_ratio:
            break
        out.append(step)
    return out


def without_steps(facts: Facts, steps: list[int]) -> Facts:
    """`facts` with the given steps left out of every per-step table."""
    if not steps:
        return facts
    keep = ~pl.col("step").is_in(steps)
    host = facts.host.filter(keep) if facts.host is not None else None
    kernel_steps = facts.kernel_steps.filter(keep) if facts.kernel_steps is not None else None
    late = facts.late.filter(keep) if facts.late is not None else None
    moved = facts.transfers.filter(keep) if facts.transfers is not None else None
    return dataclasses.replace(
        facts,
        late=late,
        transfers=moved,
        steps=facts.steps.filter(keep),
        collectives=facts.collectives.filter(keep),
        p2p=facts.p2p.filter(keep),
        host=host,
        kernel_steps=kernel_steps,
    )
