"""sequence_imbalance: the slowest data-parallel rank changes from step to step, with its batch.

Variable-length batches (packed or bucketed sequences, different on every rank) give each rank a
different amount of work every step; the collective waits for whichever rank drew the most. Over
the ranks outside pipelines, per step (`straggler.rank_step_ratios`): the slowest rank, its compute
against its peers' median (``ratio``) and whether the peers waited for it (the straggler
``pattern``). A step is *imbalanced* when the slowest rank's ratio ≥ `seq_step_ratio` with the
pattern. Found when at least `seq_step_share` of the steps (and at least
`persistent_min_steps` + 1) are imbalanced, no rank is the slowest on more than
`seq_max_rank_share` of them, and at least `seq_min_slowest_ranks` different ranks are (every rank on a
smaller job): one
persistent slow worker is ``compute_straggler``, one slow step is a transient straggler, and
healthy noise does not reach the ratio on half the steps. Where the trace records the batches' shapes,
they must differ and the compute must follow them (`seq_min_corr`): equal batches, or batches the compute
does not follow, leave the changing slowest rank to contention or noise. The slowest rank-steps must
run the same operators as their peers (`slowest_ops_ratio` below `lateness_more_ops`, median over
the imbalanced steps): a longer batch makes the same ops longer; extra work on one rank at a time (a
straggler that moves between ranks) runs more of them and is reported as one transient
compute_straggler per rank on its steps (`moving_stragglers`). Once found, a step belongs to it when
its slowest rank's ratio reaches 1 + `step_share` × (`seq_step_ratio` − 1) (the job-wide causes'
convention: single steps of a persistent cause scatter around the threshold).

Where the trace records input shapes (``record_shapes``: the token ids of the embedding lookup), the
evidence adds how the compute follows the batch: the Pearson r of every rank-step's compute with its
Σ sequence length² (`sequence_evidence`) and on how many imbalanced steps the slowest rank drew the most.

time_lost_ns (the detector's estimate; the what-if replaces it): Σ over its steps of the
slowest rank's compute − the step's mean compute. The what-if balances the batches: every rank's
compute in the step set to the step's mean (the same work, spread evenly).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import polars as pl

from tracediag.analysis import Finding
from tracediag.detect import straggler
from tracediag.units import NS_PER_MS

if TYPE_CHECKING:
    from tracediag.detect.facts import Facts
    from tracediag.detect.thresholds import Thresholds


def candidate_ranks(facts: Facts) -> list[int]:
    """The data-parallel ranks considered: every rank outside a pipeline."""
    in_pipe = {r for ranks in facts.pipelines for r in ranks}
    return sorted(r for r in facts.steps["rank"].unique().to_list() if r not in in_pipe)


def sequence_evidence(steps: pl.DataFrame, top: pl.DataFrame) -> dict[str, float | int]:
    """Where the trace records input shapes (``seq_sq`` per rank-step, `derive.sequences`): ``compute_seq_sq_r``
    (Pearson r of compute with Σ sequence length² over the rank-steps that have both), ``seq_sq_rank_steps``
    and ``slowest_drew_most`` (of the steps of `top`, the slowest rank per step, those where it had the most).
    Empty without shapes, or with fewer than 3 rank-steps or constant values (no r to give)."""
    if "seq_sq" not in steps.columns:
        return {}
    have = steps.filter(pl.col("seq_sq").is_not_null())
    if have.height < 3 or have["seq_sq"].n_unique() < 2 or have["compute_ns"].n_unique() < 2:
        return {}
    r = have.select(pl.corr(pl.col("compute_ns").cast(pl.Float64), pl.col("seq_sq").cast(pl.Float64))).item()
    if r is None or r != r:
        return {}
    most = have.sort("seq_sq", "rank", descending=[True, False]).unique("step", keep="first").select("step", _m="rank")
    drew = top.join(most, on="step").filter(pl.col("rank") == pl.col("_m")).height
    return {"compute_seq_sq_r": round(float(r), 3), "seq_sq_rank_steps": have.height, "slowest_drew_most": drew}


def _batches_may_differ(steps: pl.DataFrame, th: Thresholds) -> bool:
    """False where the recorded shapes rule uneven batches out: every rank-step's Σ sequence length² is
    the same, or the compute does not follow it (Pearson r below `seq_min_corr`). True without shapes."""
    if "seq_sq" not in steps.columns:
        return True
    have = steps.filter(pl.col("seq_sq").is_not_null())
    if have.height < 3:
        return True
    if have["seq_sq"].n_unique() == 1:
        return False
    r = have.select(pl.corr(pl.col("compute_ns").cast(pl.Float64), pl.col("seq_sq").cast(pl.Float64))).item()
    return r is None or r != r or r >= th.seq_min_corr


def slowest_ops_ratio(facts: Facts, hit: pl.DataFrame) -> float | None:
    """Median over the steps of `hit` (step, rank: its slowest rank) of the slowest rank's compute
    operator/kernel count over its peers' median count in the same step (`Facts.kernel_steps`); None
    without the table. An uneven batch runs the same operators on longer inputs (1.0); extra work on
    one rank at a time (a straggler moving between ranks) runs more of them."""
    k = facts.kernel_steps
    if k is None or not k.height:
        return None
    counts = (
        k.filter(pl.col("category") == "compute", pl.col("step").is_in(hit["step"].implode()))
        .group_by("step", "rank")
        .agg(n=pl.col("count").cast(pl.Int64).sum())
    )
    mine = counts.join(hit.select("step", "rank"), on=["step", "rank"])
    peers = (
        counts.join(hit.select("step", "rank"), on=["step", "rank"], how="anti")
        .group_by("step")
        .agg(p=pl.col("n").median())
    )
    both = mine.join(peers, on="step").filter(pl.col("p") > 0)
    if not both.height:
        return None
    return float((both["n"] / both["p"]).median())


def moving_stragglers(ratios: pl.DataFrame, hit: pl.DataFrame, more_ops: float, th: Thresholds) -> list[Finding]:
    """A straggler that moves: per rank slowest on some imbalanced steps of `hit`, a transient
    compute_straggler on those steps (`ratios` rows), with the transient confidence of its least ratio.
    The steps themselves are not slower than the others (every step has one), so the transient rule,
    which compares a step with the median step, does not see them."""
    out = []
    n_steps = ratios["step"].n_unique()
    for (rank,), mine in hit.group_by(["rank"], maintain_order=True):
        rows = ratios.join(mine.select("step", "rank"), on=["step", "rank"])
        confidence = min(1.0, (float(rows["ratio"].min()) - 1) / (2 * (th.straggler_transient_ratio - 1)))
        f = straggler._finding(
            rows, (int(rank),), "transient", n_steps, confidence, slowest_ops_ratio=round(more_ops, 3)
        )
        why = (
            f"; the slowest rank changes from step to step ({hit['rank'].n_unique()} ranks on {hit.height} of "
            f"{n_steps} steps) and runs {more_ops:.2f}x its peers' operators there: extra work moving between "
            "ranks, not longer batches"
        )
        out.append(dataclasses.replace(f, summary=f.summary + why))
    return sorted(out, key=lambda f: f.ranks)


def detect(facts: Facts, *, thresholds: Thresholds, ratios: pl.DataFrame) -> list[Finding]:
    """At most one sequence_imbalance finding for the ranks outside pipelines; `ratios`:
    `straggler.rank_step_ratios` of the facts' steps."""
    th = thresholds
    ranks = candidate_ranks(facts)
    if len(ranks) < 2:
        return []
    # ratios are against all ranks of the step: recompute among the candidates when pipelines exist
    r = ratios.filter(pl.col("rank").is_in(ranks))
    if len(ranks) < facts.steps["rank"].n_unique():
        from tracediag.detect.straggler import rank_step_ratios

        r = rank_step_ratios(facts.steps.filter(pl.col("rank").is_in(ranks)), th)
    n_steps = r["step"].n_unique()
    top = r.sort(["ratio", "rank"], descending=[True, False]).unique("step", keep="first").sort("step")
    hit = top.filter(pl.col("pattern"), pl.col("ratio") >= th.seq_step_ratio)
    need = max(th.persistent_min_steps + 1, th.seq_step_share * n_steps)
    if hit.height < need:
        return []
    by_rank = hit.group_by("rank").agg(n=pl.len())
    distinct = min(th.seq_min_slowest_ranks, len(ranks))
    if by_rank.height < distinct or by_rank["n"].max() > th.seq_max_rank_share * hit.height:
        return []
    if not _batches_may_differ(facts.steps.filter(pl.col("rank").is_in(ranks)), th):
        return []
    more_ops = slowest_ops_ratio(facts, hit)
    if more_ops is not None and more_ops >= th.lateness_more_ops:
        return moving_stragglers(r, hit, more_ops, th)
    # the cause holds for the run: a step belongs to it at `step_share` of the step threshold's excess
    member = top.filter(pl.col("ratio") >= 1 + th.step_share * (th.seq_step_ratio - 1))
    steps = tuple(member["step"].to_list())
    mean = (
        facts.steps.filter(pl.col("rank").is_in(ranks), pl.col("step").is_in(list(steps)))
        .group_by("step")
        .agg(mean=pl.col("compute_ns").mean())
    )
    h = member.join(mean, on="step")
    lost = int((h["compute_ns"] - h["mean"]).clip(lower_bound=0).sum())
    slowest = {str(s): int(k) for s, k in member.select("step", "rank").iter_rows()}
    summary = (
        f"the slowest rank changes from step to step: on {len(steps)} of {n_steps} steps one rank computes "
        f"{hit['ratio'].median():.1f}x its peers' median (median over those steps), {by_rank.height} different "
        f"ranks in turn, none on more than {by_rank['n'].max()}; the others wait "
        f"{hit['peer_wait_ns'].median() / NS_PER_MS:.0f} ms per step in collectives: uneven batches (variable sequence "
        f"lengths per rank)"
    )
    shapes = sequence_evidence(facts.steps.filter(pl.col("rank").is_in(ranks)), member)
    if shapes:
        summary += (
            f"; its compute follows Σ sequence length² (Pearson r {shapes['compute_seq_sq_r']:.2f} over "
            f"{shapes['seq_sq_rank_steps']} rank-steps; the slowest rank drew the most on "
            f"{shapes['slowest_drew_most']} of those {len(steps)} steps)"
        )
    evidence = {
        "slowest_rank_by_step": slowest,
        "compute_ratio_by_step": {str(s): round(float(q), 3) for s, q in member.select("step", "ratio").iter_rows()},
        "imbalanced_steps": hit["step"].to_list(),
        "compute_ratio_median": round(float(hit["ratio"].median()), 3),
        "distinct_slowest_ranks": by_rank.height,
        "most_steps_one_rank": int(by_rank["n"].max()),
        "peer_wait_ms_median": round(float(hit["peer_wait_ns"].median()) / NS_PER_MS, 3),
        "dp_ranks": ranks,
        "slowest_ops_ratio": None if more_ops is None else round(more_ops, 3),
        **shapes,
    }
    confidence = min(1.0, hit.height / n_steps) * min(
        1.0, (float(hit["ratio"].median()) - 1) / (2 * (th.seq_step_ratio - 1))
    )
    return [
        Finding(
            cause="sequence_imbalance",
            ranks=tuple(ranks),
            steps=steps,
            time_lost_ns=lost,
            confidence=confidence,
            summary=summary,
            evidence=evidence,
        )
    ]
