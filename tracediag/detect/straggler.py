"""compute_straggler: one rank computes longer than its peers while they wait for it.

Per (rank, step): ``ratio`` = the rank's compute / its peers' median compute in that step (the
median over all ranks from three ranks on, the other rank's for two). The step has the straggler
*pattern* when the rank arrived last at one of the step's collectives, the others' median wait is
at least `straggler_peer_wait` × the rank's excess compute, the rank itself waits at most that
share of the others' wait, and the excess is at least `straggler_min_excess` of the step.

- Persistent (the pattern on at least `persistent_min_steps` steps: never 1 of 2): the rank's
  median ratio over steps ≥ `straggler_persistent_ratio` with the pattern on
  at least half of the steps, or the pattern on at least `straggler_pattern_share` of the steps with
  a median ratio ≥ `straggler_min_ratio` when being last that often is unlikely by chance
  (`straggler_pattern_chance`, binomial with p = 1/ranks); its steps are those with the pattern, and
  those where it computes at least its least ratio of a pattern step though a noisy peer was later still
  (by at most `straggler_peer_wait` × its excess: a rank later by more, from another cause in the same
  step, is what the peers waited for there).
- Transient: otherwise, single steps with the pattern, ratio ≥ `straggler_transient_ratio` and the
  step ≥ `straggler_slow_step` × the median step (one rank per step: the highest ratio). Extra
  compute after a step's last collective (logging, a checkpoint) makes the peers wait only in the
  *next* step: a step where the rank arrives last and the peers wait for the previous step's excess
  (`pattern_next`) names that previous step.

time_lost_ns = Σ over its steps of min(peers' median wait, excess compute).
"""

from __future__ import annotations

from math import comb
from typing import TYPE_CHECKING

import polars as pl

from tracediag.analysis import Finding
from tracediag.units import NS_PER_MS, rank_list

if TYPE_CHECKING:
    from tracediag.detect.facts import Facts
    from tracediag.detect.thresholds import Thresholds


def rank_step_ratios(steps: pl.DataFrame, th: Thresholds) -> pl.DataFrame:
    """Per (rank, step): ``peer_compute_ns``, ``ratio``, ``excess_ns``, ``peer_wait_ns``, ``pattern``."""
    n = pl.len().over("step")
    c = pl.col("compute_ns")
    peer_c = pl.when(n == 2).then(c.sum().over("step") - c).otherwise(c.median().over("step"))
    w = pl.col("wait_ns")
    peer_w = pl.when(n == 2).then(w.sum().over("step") - w).otherwise(w.median().over("step"))

    def waited_for(excess: pl.Expr) -> pl.Expr:
        """Late at a collective, the peers waiting for `excess` while the rank itself hardly waits."""
        return (
            (pl.col("late_n") > 0)
            & (excess >= th.straggler_min_excess * pl.col("step_ns"))
            & (pl.col("peer_wait_ns") >= th.straggler_peer_wait * excess)
            & (w <= th.straggler_peer_wait * pl.col("peer_wait_ns"))
        )

    previous = pl.col("step").shift(1).over("rank", order_by="step")
    return (
        steps.lazy()
        .with_columns(
            peer_compute_ns=peer_c,
            peer_wait_ns=peer_w,
            step_ns=pl.col("dur_ns").median().over("step"),
        )
        .with_columns(
            ratio=c / pl.col("peer_compute_ns").clip(lower_bound=1),
            excess_ns=c - pl.col("peer_compute_ns"),
        )
        .with_columns(
            prev_step=previous,
            prev_ratio=pl.col("ratio").shift(1).over("rank", order_by="step"),
            prev_excess_ns=pl.col("excess_ns").shift(1).over("rank", order_by="step"),
            prev_compute_ns=c.shift(1).over("rank", order_by="step"),
            prev_peer_compute_ns=pl.col("peer_compute_ns").shift(1).over("rank", order_by="step"),
        )
        .with_columns(
            pattern=waited_for(pl.col("excess_ns")),
            pattern_next=waited_for(pl.col("prev_excess_ns")).fill_null(False)
            & (pl.col("prev_step") == pl.col("step") - 1),
            lost_ns=pl.min_horizontal(pl.col("peer_wait_ns"), pl.col("excess_ns")).clip(lower_bound=0),
            prev_lost_ns=pl.min_horizontal(pl.col("peer_wait_ns"), pl.col("prev_excess_ns")).clip(lower_bound=0),
        )
        .with_columns(pattern_next=pl.col("pattern_next") & ~pl.col("pattern"))
        .collect(engine="in-memory")  # a few rows: the streaming engine costs more to start
    )


def _finding(
    rows: pl.DataFrame, ranks: tuple[int, ...], kind: str, n_steps: int, confidence: float, **more_evidence: float
) -> Finding:
    """The finding of `ranks` (one, or a set late together: a slow node) from their `rank_step_ratios`
    rows; per step the numbers of the set are its median ratio and its worst rank's loss and counts."""
    per_step = (
        rows.group_by("step")
        .agg(
            ratio=pl.col("ratio").median(),
            lost_ns=pl.col("lost_ns").max(),
            late_n=pl.col("late_n").max(),
            coll_n=pl.col("coll_n").max(),
        )
        .sort("step")
    )
    steps = tuple(per_step["step"].to_list())
    ratio = rows["ratio"].median()
    peer_wait = rows["peer_wait_ns"].median()
    own_wait = rows["wait_ns"].median()
    one = len(ranks) == 1
    who = f"rank {ranks[0]} computes" if one else f"{rank_list(ranks)} compute"
    summary = (
        f"{who} {ratio:.1f}x {'its' if one else 'their'} peers' median on {len(steps)} of {n_steps} steps "
        f"({kind}{'' if one else ', late together'}); the other ranks wait {peer_wait / NS_PER_MS:.1f} ms per step "
        f"in collectives for {'it' if one else 'them'}, {'it waits' if one else 'they wait'} "
        f"{own_wait / NS_PER_MS:.1f} ms"
    )
    evidence = {
        "kind": kind,
        "compute_ratio_median": round(float(ratio), 3),
        "compute_ratio_by_step": {str(s): round(float(r), 3) for s, r in per_step.select("step", "ratio").iter_rows()},
        "compute_ms_median": round(float(rows["compute_ns"].median()) / NS_PER_MS, 3),
        "peer_compute_ms_median": round(float(rows["peer_compute_ns"].median()) / NS_PER_MS, 3),
        "peer_wait_ms_median": round(float(peer_wait) / NS_PER_MS, 3),
        "own_wait_ms_median": round(float(own_wait) / NS_PER_MS, 3),
        "last_arrivals": int(per_step["late_n"].sum()),
        "collectives": int(per_step["coll_n"].sum()),
        **more_evidence,
    }
    return Finding(
        cause="compute_straggler",
        ranks=tuple(sorted(ranks)),
        steps=steps,
        time_lost_ns=int(per_step["lost_ns"].sum()),
        confidence=confidence,
        summary=summary,
        evidence=evidence,
    )


def _chance(k: int, n: int, p: float) -> float:
    """P(X ≥ k) for X ~ Binomial(n, p): how often a rank is last on k of n steps by chance alone."""
    return sum(comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))


def detect(facts: Facts, *, thresholds: Thresholds, ratios: pl.DataFrame | None = None) -> list[Finding]:
    """Findings for persistent and transient compute stragglers (one per rank); `ratios`:
    `rank_step_ratios` of the facts' steps, when the caller has them."""
    th = thresholds
    steps = facts.steps
    if steps.select(pl.col("rank").n_unique()).item() < 2 or not steps.height:
        return []
    r = rank_step_ratios(steps, th) if ratios is None else ratios
    n_steps = r["step"].n_unique()
    n_ranks = r["rank"].n_unique()
    per_rank = r.group_by("rank").agg(
        med_ratio=pl.col("ratio").median(),
        pattern_share=pl.col("pattern").mean(),
        n=pl.len(),
        k=pl.col("pattern").sum(),
    )
    per_rank = per_rank.with_columns(
        chance=pl.Series([_chance(k, n, 1 / n_ranks) for k, n in per_rank.select("k", "n").iter_rows()])
    )
    persistent = (
        per_rank.filter(pl.col("k") >= th.persistent_min_steps)
        .filter(
            (
                (pl.col("med_ratio") >= th.straggler_persistent_ratio)
                & (pl.col("pattern_share") >= th.straggler_ratio_pattern_share)
            )
            | (
                (pl.col("med_ratio") >= th.straggler_min_ratio)
                & (pl.col("pattern_share") >= th.straggler_pattern_share)
                & (pl.col("chance") <= th.straggler_pattern_chance)
            )
        )
        .sort("rank")
    )
    findings = []
    for rank, med_ratio, share, *_ in persistent.iter_rows():
        rows = r.filter(pl.col("rank") == rank, pl.col("pattern"))
        # a step where it computes at least as much more as on a step the peers waited for it, though
        # another rank was later still by noise: the same cause (its time lost there is what the peers waited).
        # By noise: it waits for that rank at most half its own excess; a rank later by more (another cause in
        # the same step) is what the peers waited for, and this rank's excess there cost nothing
        shared = r.filter(
            pl.col("rank") == rank,
            ~pl.col("pattern"),
            pl.col("ratio") >= rows["ratio"].min(),
            pl.col("excess_ns") >= th.straggler_min_excess * pl.col("step_ns"),
            pl.col("wait_ns") <= th.straggler_peer_wait * pl.col("excess_ns"),
        )
        rows = pl.concat([rows, shared]).sort("step")
        strength = min(1.0, (med_ratio - 1) / (2 * (th.straggler_persistent_ratio - 1)))
        confidence = max(strength, share) * share
        all_steps = round(float(med_ratio), 3)
        findings.append(
            _finding(rows, (rank,), "persistent", n_steps, confidence, compute_ratio_median_all_steps=all_steps)
        )
    median_step = r.group_by("step").agg(pl.col("step_ns").first())["step_ns"].median()
    slow = pl.col("step_ns") >= th.straggler_slow_step * median_step
    candidates = r.filter(~pl.col("rank").is_in(persistent["rank"].implode()), slow)
    direct = candidates.filter(pl.col("pattern"), pl.col("ratio") >= th.straggler_episode_ratio)
    # extra compute after the last collective of step N-1: the peers wait for it in step N
    shifted = candidates.filter(pl.col("pattern_next"), pl.col("prev_ratio") >= th.straggler_episode_ratio)
    shifted = shifted.select(
        "rank",
        step=pl.col("prev_step").cast(pl.Int32),
        ratio="prev_ratio",
        excess_ns="prev_excess_ns",
        lost_ns="prev_lost_ns",
        compute_ns="prev_compute_ns",
        peer_compute_ns="prev_peer_compute_ns",
        peer_wait_ns="peer_wait_ns",
        wait_ns="wait_ns",
        late_n="late_n",
        coll_n="coll_n",
    )
    keep = shifted.columns
    steps_seen = (
        pl.concat([direct.select(keep), shifted.cast(direct.select(keep).schema)])
        .sort("ratio", descending=True)
        .unique("step", keep="first")
    )
    strong = steps_seen.filter(pl.col("ratio") >= th.straggler_transient_ratio)
    # an episode: weaker steps right next to a strong one of the same rank belong to it
    neighbours = strong.select("rank", pl.concat_list(pl.col("step") - 1, pl.col("step") + 1).alias("step"))
    neighbours = neighbours.explode("step").with_columns(pl.col("step").cast(pl.Int32))
    episode = steps_seen.filter(pl.col("ratio") < th.straggler_transient_ratio).join(
        neighbours, on=["rank", "step"], how="semi"
    )
    transient = pl.concat([strong, episode]).unique(["rank", "step"])
    for rank in sorted(transient["rank"].unique().to_list()):
        rows = transient.filter(pl.col("rank") == rank).sort("step")
        strength = min(1.0, (rows["ratio"].min() - 1) / (2 * (th.straggler_transient_ratio - 1)))
        findings.append(_finding(rows, (rank,), "transient", n_steps, strength))
    return findings
