"""Who everyone waits for: lateness per collective instance, summed per rank over a run.

Per matched instance (`derive.collectives.match_instances`, aligned clocks) every rank's wait is
blamed on the instance's last arrivers (``is_last``: within `collectives.LATE_SHARE` of the skew of
the last one), split equally among them: had they arrived with the others, nobody would have waited.
A rank's wait is counted once where concurrent instances overlap (DDP buckets in flight together):
each instance's wait is scaled by the rank's union of waits in the step over their sum
(`collectives.wait_per_step`). Summed per rank over the instances of the analysed steps, this gives
``caused_ns`` (waiting it made its peers do) and its ``share`` of all waiting, from one step of many
collectives as well as from many steps.

`assess` names the ranks everyone waits for: the smallest set of the ranks that cause the most
whose combined share reaches `lateness_share`, at most half the ranks, each member causing at least
`lateness_gap` × what any other rank causes, the members among the last arrivers more often than
chance allows (`set_chance`: counted over the sets that could have been picked unless they are
late together), and the waiting they cause material
(`lateness_min_wait` of the step). Else no one.
"""

from __future__ import annotations

from math import comb, exp, lgamma, log, log1p

import polars as pl

from tracediag.analysis import LATENESS_SCHEMA, Lateness
from tracediag.derive.intervals import union_intervals

LATE_ROW_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32(),
    "iid": pl.UInt64(),
    "step": pl.Int32(),
    "op": pl.String(),
    "ts": pl.Int64(),
    "arrival": pl.Int64(),
    "late_ns": pl.Int64(),
    "wait_ns": pl.Int64(),
    "caused_ns": pl.Int64(),
    "is_last": pl.Boolean(),
    "after_ns": pl.Int64(),
}
"""Per rank and matched instance (seen on ≥ 2 ranks, in a step): ``ts`` (own clock: joins the
rank's windows), ``arrival`` (aligned), ``late_ns`` = arrival − the median arrival of the instance,
``wait_ns`` (its wait, counted once where concurrent instances overlap), ``caused_ns`` (its part of
the instance's waiting, blamed on the last arrivers), ``is_last``, ``after_ns`` (its own end − the
instance's last traced arrival, aligned: the transfer, and the wait for any rank that is not traced)."""


def late_rows(matched: pl.DataFrame) -> pl.DataFrame:
    """Per rank and instance: `LATE_ROW_SCHEMA` (from `collectives.match_instances` rows)."""
    lf = matched.lazy().filter(pl.col("n_ranks") > 1, pl.col("step").is_not_null())
    # one wait per rank where its instances in flight overlap: scale by union / sum in the step
    union = _union_waits(lf)
    summed = pl.col("wait_ns").sum().over("rank", "step")
    scale = pl.when(summed > 0).then(pl.col("_union") / summed).otherwise(0.0)
    rows = (
        lf.join(union, on=["rank", "step"], how="left")
        .with_columns(_union=pl.col("_union").fill_null(0))
        .with_columns(wait_ns=(pl.col("wait_ns") * scale).round(0).cast(pl.Int64))
        .with_columns(
            late_ns=pl.col("arrival") - pl.col("arrival").median().over("iid").round(0).cast(pl.Int64),
            after_ns=(pl.col("aligned_end") - pl.col("arrival").max().over("iid")).clip(lower_bound=0),
            _w=pl.col("wait_ns").sum().over("iid"),
            _l=pl.col("is_last").sum().over("iid"),
        )
        .with_columns(caused_ns=pl.when("is_last").then(pl.col("_w") / pl.col("_l").clip(lower_bound=1)).otherwise(0.0))
        .select(list(LATE_ROW_SCHEMA))
        .sort("rank", "arrival")
    )
    return rows.collect(engine="in-memory").cast(LATE_ROW_SCHEMA)


def _union_waits(lf: pl.LazyFrame) -> pl.LazyFrame:
    waiting = lf.filter(pl.col("wait_ns") > 0).select(
        "rank", "step", ts="arrival", end=pl.col("arrival") + pl.col("wait_ns")
    )
    return (
        union_intervals(waiting, ["rank", "step"])
        .group_by("rank", "step")
        .agg(_union=(pl.col("end") - pl.col("ts")).sum())
    )


def per_rank(rows: pl.DataFrame) -> pl.DataFrame:
    """`LATENESS_SCHEMA`, one row per rank of `rows` (`late_rows`), most waiting caused first."""
    total = rows["wait_ns"].sum() if rows.height else 0
    out = (
        rows.lazy()
        .group_by("rank")
        .agg(
            coll_n=pl.len().cast(pl.Int32),
            last_n=pl.col("is_last").sum().cast(pl.Int32),
            late_ns=pl.col("late_ns").filter("is_last").sum(),
            caused_ns=pl.col("caused_ns").sum(),
            waited_ns=pl.col("wait_ns").sum(),
        )
        .with_columns(share=pl.col("caused_ns") / total if total > 0 else pl.lit(0.0))
        .sort("caused_ns", "rank", descending=[True, False])
        .select(list(LATENESS_SCHEMA))
        .collect(engine="in-memory")
    )
    return out.cast(LATENESS_SCHEMA)


def _chance(k: int, n: int, p: float) -> float:
    """P(X ≥ k), X ~ Binomial(n, p), summed in logs (n reaches thousands of instances)."""
    if k <= 0 or p >= 1:
        return 1.0
    log_terms = (
        lgamma(n + 1) - lgamma(i + 1) - lgamma(n - i + 1) + i * log(p) + (n - i) * log1p(-p) for i in range(k, n + 1)
    )
    return min(1.0, sum(exp(t) for t in log_terms))


def episode_waits(rows: pl.DataFrame, ranks: tuple[int, ...], median_step_ns: float) -> pl.DataFrame:
    """Per step: ``share`` of the step's waiting `ranks` cause and ``per_step`` = what they cause
    per waiting rank over the median step."""
    n = rows["rank"].n_unique()
    mine = pl.col("caused_ns").filter(pl.col("rank").is_in(list(ranks))).sum()
    return (
        rows.group_by("step")
        .agg(_all=pl.col("wait_ns").sum(), _mine=mine)
        .select(
            "step",
            share=pl.when(pl.col("_all") > 0).then(pl.col("_mine") / pl.col("_all")).otherwise(0.0),
            per_step=pl.col("_mine") / max(n - len(ranks), 1) / max(median_step_ns, 1.0),
        )
        .sort("step")
    )


def explained(rows: pl.DataFrame, members: tuple[int, ...] | list[int]) -> float:
    """The share of all waiting in `rows` (`late_rows`) that would go had `members` arrived with the others:
    per instance the last arrival among the rest ends each wait instead (a rank's wait scaled as its
    counted ``wait_ns``); the members' own waits go. The counterfactual of the blame in ``caused_ns``, which
    credits only the last arrivers and so misses ranks a later one masks."""
    total = float(rows["wait_ns"].sum()) if rows.height else 0.0
    if total <= 0:
        return 0.0
    mine = pl.col("rank").is_in(list(members))
    raw = pl.col("arrival").max().over("iid") - pl.col("arrival")
    rest_last = pl.col("arrival").filter(~mine).max().over("iid")
    left = pl.when(mine).then(0).otherwise(pl.min_horizontal((rest_last - pl.col("arrival")).clip(lower_bound=0), raw))
    frac = pl.when(raw > 0).then(left / raw).otherwise(0.0)
    remaining = float(rows.select((pl.col("wait_ns") * frac).sum()).item() or 0.0)
    return 1.0 - remaining / total


def late_at(rows: pl.DataFrame, ranks: tuple[int, ...] | list[int], late_share: float) -> dict[int, set[int]]:
    """Per rank of `ranks`, the instances (``iid``) where it is *late*: after the median arrival by at least
    `late_share` of the last arrival's lateness (a slow node's ranks all are, one of them last)."""
    skew = pl.col("late_ns").max().over("iid")
    hit = rows.filter(pl.col("late_ns") > 0, pl.col("late_ns") >= late_share * skew, pl.col("rank").is_in(list(ranks)))
    by_rank = dict(hit.group_by("rank").agg(pl.col("iid").unique()).iter_rows())
    return {r: set(by_rank.get(r, ())) for r in ranks}


def overlaps(a: set[int], b: set[int], together: float) -> bool:
    """Whether two sets of late instances overlap at least `together` (Jaccard): late together."""
    return bool(a | b) and len(a & b) >= together * len(a | b)


def groups(
    rows: pl.DataFrame, ranks: tuple[int, ...] | list[int], *, late_share: float, together: float
) -> list[tuple[int, ...]]:
    """`ranks` in groups late together: a rank joins a group when the instances where it is late (`late_at`)
    overlap the group's by at least `together` (`overlaps`), in the order of `ranks`."""
    late = late_at(rows, ranks, late_share)
    found: list[tuple[list[int], set[int]]] = []
    for r in ranks:
        for members, iids in found:
            if overlaps(late[r], iids, together):
                members.append(r)
                iids |= late[r]
                break
        else:
            found.append(([r], set(late[r])))
    return [tuple(sorted(m)) for m, _ in found]


def set_chance(rows: pl.DataFrame, members: tuple[int, ...], n: int, *, late_share: float, together: float) -> float:
    """P(`members`, the top ranks of `n`, are among the last arrivers at this many instances by chance): a
    Binomial(instances, set size / `n`). A set late together (one of `groups`: a slow node's ranks, late at the
    same collectives) is one claim. Ranks late at different collectives are separate claims, the set picked as
    the top k of `n` after looking: the chance is counted over the C(n, k) sets that could have been picked
    (Bonferroni). Two load-noise ranks taking turns last pass as a set what neither passes alone (2 of 4 ranks
    at 8 of 8 all-reduces: 0.5^8 = 0.4%, 2.3% over the 6 pairs)."""
    hit = rows.group_by("iid").agg(m=(pl.col("is_last") & pl.col("rank").is_in(members)).any())["m"]
    p = _chance(int(hit.sum()), hit.len(), len(members) / n)
    if len(members) > 1 and len(groups(rows, members, late_share=late_share, together=together)) > 1:
        p = min(1.0, p * comb(n, len(members)))
    return p


def with_masked(
    rows: pl.DataFrame, members: tuple[int, ...], *, share: float, most: int, late_share: float, together: float
) -> tuple[int, ...]:
    """`members` and the ranks they mask: when the members explain less than `share` of the waiting
    (`explained`), the next latest ranks (median lateness over the instances) that are late together with
    them (`late_at`, `overlaps`) join, at most `most`, until the set explains `share`; else `members` as they
    are (the rest of the waiting is spread, or noise late elsewhere)."""
    if explained(rows, members) >= share:
        return members
    order = (
        rows.filter(~pl.col("rank").is_in(list(members)))
        .group_by("rank")
        .agg(pl.col("late_ns").median())
        .filter(pl.col("late_ns") > 0)
        .sort("late_ns", "rank", descending=[True, False])
    )["rank"].to_list()
    late = late_at(rows, [*members, *order], late_share)
    theirs = set().union(*(late[m] for m in members))
    grown = list(members)
    for r in order:
        if len(grown) - len(members) >= most:
            break
        if not overlaps(late[r], theirs, together):
            continue
        grown.append(r)
        if explained(rows, grown) >= share:
            return tuple(sorted(grown))
    return members


def assess(
    rows: pl.DataFrame,
    *,
    step_time_ns: float,
    median_step_ns: float,
    share: float,
    gap: float,
    chance: float,
    min_wait: float,
    episode: float,
    masked: int = 0,
    late_share: float = 0.5,
    together: float = 0.5,
) -> Lateness:
    """Who everyone waits for, from the `late_rows` of the analysed steps; `step_time_ns`: the
    analysed time per rank (Σ over steps of the median step), `median_step_ns` the median step; the
    thresholds as in `detect.thresholds.Thresholds` (``lateness_*``). Being last more often than
    chance allows is not needed for an *episode*: in some step the ranks make their peers wait at
    least `episode` × the median step (a checkpoint every 4th step, a GC pause). The set found is grown
    by the ranks it masks (`with_masked`: at most `masked`, late together by `late_share` and `together`)."""
    table = per_rank(rows)
    n = table.height
    total = int(rows["wait_ns"].sum()) if rows.height else 0
    instances = rows["iid"].n_unique() if rows.height else 0

    def result(ranks: tuple[int, ...], sh: float, g: float, p: float, ws: float, reason: str) -> Lateness:
        return Lateness(ranks, round(sh, 4), total, instances, round(g, 3), p, round(ws, 4), reason, table)

    if n < 2 or int(table["caused_ns"].sum()) <= 0:
        return result((), 0.0, 0.0, 1.0, 0.0, "no rank waits for another")
    shares = table["share"].to_list()
    caused = table["caused_ns"].to_list()
    ranks = table["rank"].to_list()
    for k in range(1, n // 2 + 1):
        mine = sum(shares[:k])
        rest_max = max(shares[k:])
        g = shares[k - 1] / rest_max if rest_max > 0 else float("inf")
        if mine < share or g < gap:
            continue
        members = tuple(sorted(ranks[:k]))
        p = set_chance(rows, members, n, late_share=late_share, together=together)
        ws = sum(caused[:k]) / (n - k) / max(step_time_ns, 1.0)
        big = episode_waits(rows, members, median_step_ns)["per_step"].max() or 0.0
        if p > chance and big < episode:
            return result((), mine, g, p, ws, f"ranks {_list(members)} are last this often by chance")
        if ws < min_wait:
            return result((), mine, g, p, ws, f"the waiting ranks {_list(members)} cause is small")
        grown = members
        if masked:
            grown = with_masked(rows, members, share=share, most=masked, late_share=late_share, together=together)
        if grown != members:
            mine = float(table.filter(pl.col("rank").is_in(list(grown)))["share"].sum())
            ws = float(table.filter(pl.col("rank").is_in(list(grown)))["caused_ns"].sum()) / (n - len(grown))
            ws /= max(step_time_ns, 1.0)
        return result(grown, mine, g, p, ws, "")
    return result((), shares[0], 0.0, 1.0, 0.0, "the waiting is spread over the ranks")


def _list(ranks: tuple[int, ...]) -> str:
    return ", ".join(map(str, ranks))
