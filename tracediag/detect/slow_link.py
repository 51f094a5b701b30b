"""slow_link: one rank's (or one pair's) own transfers are slower at the same bytes — a slow link or NIC.

Read from the transfer table (`derive.transfers`): each send/recv pair's and each collective's
transfer time, from its last participant's arrival to its end — so a rank that arrives late (its
peers wait for it: lateness) does not look slow, and one whose data moves slowly does. Transfers are
compared within their class (`transfers.CLASS`: the same operation, participants and bytes; without
bytes, the same place in the step). A *link* is a member set (a pair of ranks, or a collective's
group), with the median of its transfers.

- **A rank** (its NIC): against the reference of each class — the weighted median of the links in the
  class it is not in — every link it has is slower by ≥ `slow_link_ratio` (its *score*: the least of
  its links' ratios), over ≥ 2 links (two peers or groups: with one, a rank and its pair cannot be
  told apart), and ≥ `slow_link_gap` × the score of any other rank once the links through it are set
  aside (its neighbours are slow only on their link with it).
- **A pair** (one link), when no rank is: its transfers against the class's other links ≥
  `slow_link_ratio`, and ≥ `slow_link_gap` × the next pair's (its ranks' other links are not slow).

Then, over its transfers: more of them slower than the reference than chance allows (a sign test,
P(≥ k of n) under Binomial(n, ½) ≤ `slow_link_chance`), and their excess over the reference, per
analysed step, ≥ `slow_link_min_excess` of the median step (the job feels it). Its steps: those where
its transfers' median ratio reaches `slow_link_ratio`. time_lost_ns (the detector's estimate; the
what-if replaces it): the excess of its transfers over the reference, summed over those steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import polars as pl

from tracediag.analysis import Cause, Finding
from tracediag.derive.collectives import MATCH_TOLERANCE_NS
from tracediag.derive.lateness import _chance
from tracediag.derive.transfers import CLASS
from tracediag.units import NS_PER_MS, count

if TYPE_CHECKING:
    from tracediag.detect.facts import Facts
    from tracediag.detect.thresholds import Thresholds

FLOOR_NS = MATCH_TOLERANCE_NS
"""References below this are taken as this (100 µs, the clock alignment error allowed when matching):
a transfer time under it is the clocks' error, not the link's speed."""


@dataclass(frozen=True, eq=False)
class Slow:
    """The slowest rank or pair and the numbers behind it (`assess`)."""

    kind: str
    """``rank`` (its NIC: every link it has is slow) or ``pair`` (one link)."""
    ranks: tuple[int, ...]
    score: float
    """The least ratio over its links (a rank), or its link's ratio (a pair)."""
    gap: float
    """Its score over the next rank's (pair's)."""
    rows: pl.DataFrame = field(repr=False)
    """Its transfers: the transfer table's rows with ``ref_ns`` (the reference of their class) and ``ratio``."""
    links: dict[str, float] = field(default_factory=dict)
    """Its links (``"1-2"``) and their ratios."""


def _classed(transfers: pl.DataFrame) -> pl.DataFrame:
    """The transfer rows with ``_c`` (class id) and ``_s`` (member set id)."""
    return transfers.with_columns(_c=pl.struct(list(CLASS)).hash(), _s=pl.col("members").hash())


def _links(t: pl.DataFrame) -> pl.DataFrame:
    """Per (class, member set): ``members``, ``n_rows`` and ``t_ns`` (median transfer)."""
    return t.group_by("_c", "_s").agg(
        pl.col("members").first(), n_rows=pl.len(), t_ns=pl.col("transfer_ns").median().cast(pl.Float64)
    )


def _weighted_median(df: pl.DataFrame, by: list[str], value: str, out: str) -> pl.DataFrame:
    """Per `by`: `out`, the median of `value` weighted by ``n_rows`` (the upper middle at an exact half)."""
    if not df.height:
        return pl.DataFrame(schema={**{c: df.schema[c] for c in by}, out: pl.Float64})
    w = pl.col("n_rows")
    return (
        df.sort([*by, value])
        .with_columns(_cw=w.cum_sum().over(by), _tw=w.sum().over(by))
        .filter(pl.col("_cw") > pl.col("_tw") / 2)
        .group_by(by)
        .agg(pl.col(value).first().cast(pl.Float64).alias(out))
    )


def _ratio(t: str, ref: str) -> pl.Expr:
    """`t` over `ref`, the reference floored at `FLOOR_NS` (below it a transfer time is clock error)."""
    return pl.col(t) / pl.col(ref).clip(lower_bound=FLOOR_NS)


def _per_link(rows: pl.DataFrame, key: list[str]) -> pl.DataFrame:
    """Per `key` (with ``_s``): ``members``, ``ratio`` (the weighted median over its classes of
    ``t_ns`` / ``ref_ns``), ``n_rows``."""
    r = rows.with_columns(_r=_ratio("t_ns", "ref_ns"))
    ratio = _weighted_median(r, key, "_r", "ratio")
    return r.group_by(key).agg(pl.col("members").first(), pl.col("n_rows").sum()).join(ratio, on=key)


def _rank_refs(links: pl.DataFrame) -> pl.DataFrame:
    """Per (rank, class): ``ref_ns``, the weighted median of the class's links the rank is not in."""
    ranks = links.select("_c", rank=pl.col("members")).explode("rank").unique()
    others = ranks.join(links, on="_c").filter(~pl.col("members").list.contains(pl.col("rank")))
    return _weighted_median(others, ["rank", "_c"], "t_ns", "ref_ns")


def _rank_scores(links: pl.DataFrame, refs: pl.DataFrame, without: int | None = None) -> pl.DataFrame:
    """Per rank: ``score`` (the least ratio of its links to its references), ``n_links``; `without`:
    links through that rank set aside."""
    own = links.with_columns(rank=pl.col("members")).explode("rank")
    if without is not None:
        own = own.filter(~pl.col("members").list.contains(without))
    per = _per_link(own.join(refs, on=["rank", "_c"]), ["rank", "_s"])
    return per.group_by("rank").agg(score=pl.col("ratio").min(), n_links=pl.len())


def _pair_refs(links: pl.DataFrame) -> pl.DataFrame:
    """Per two-rank link and class: ``ref_ns``, the weighted median of the class's other links."""
    pairs = links.filter(pl.col("members").list.len() == 2).select("_c", _p="_s")
    others = pairs.join(links, on="_c").filter(pl.col("_s") != pl.col("_p"))
    return _weighted_median(others, ["_c", "_p"], "t_ns", "ref_ns").rename({"_p": "_s"})


def _pair_scores(links: pl.DataFrame) -> pl.DataFrame:
    """Per two-rank link: ``score`` (its ratio to its references, `_pair_refs`) and ``members``."""
    refs = _pair_refs(links)
    if not refs.height:
        return pl.DataFrame(schema={"_s": pl.UInt64, "members": pl.List(pl.Int32), "score": pl.Float64})
    per = _per_link(links.join(refs, on=["_c", "_s"]), ["_s"])
    return per.select("_s", "members", score="ratio")


def _link_name(members: list[int]) -> str:
    return "-".join(map(str, members))


def _table(facts: Facts) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The comparable transfer rows (classes with transfers on at least two links: a lone link has
    nothing to be compared with) and their links."""
    t = facts.transfers
    if t is None or not t.height:
        return pl.DataFrame(), pl.DataFrame()
    t = _classed(t)
    t = t.filter(pl.col("_s").n_unique().over("_c") > 1)
    return t, (_links(t) if t.height else pl.DataFrame())


def assess(facts: Facts, th: Thresholds) -> Slow | None:
    """The rank (or else the pair) whose transfers are slowest against their class, when one stands
    out by `slow_link_ratio` and `slow_link_gap`; None otherwise (the chance and cost tests are `detect`'s)."""
    t, links = _table(facts)
    if not t.height:
        return None
    refs = _rank_refs(links)
    scores = _rank_scores(links, refs).filter(pl.col("n_links") >= 2).sort("score", "rank", descending=[True, False])
    if scores.height and scores["score"][0] >= th.slow_link_ratio:
        r = int(scores["rank"][0])
        rest = _rank_scores(links, refs, without=r).filter(pl.col("rank") != r)["score"].max()
        gap = float(scores["score"][0]) / max(float(rest or 0.0), 1e-9)
        if gap >= th.slow_link_gap:
            own = links.filter(pl.col("members").list.contains(r)).join(refs.filter(pl.col("rank") == r), on="_c")
            per = _per_link(own, ["_s"]).sort("members")
            names = {_link_name(m): round(v, 3) for m, v in per.select("members", "ratio").iter_rows()}
            return Slow("rank", (r,), float(scores["score"][0]), gap, rows_of(facts, (r,), "rank"), names)
    pairs = _pair_scores(links).sort("score", descending=True)
    if not pairs.height or pairs["score"][0] < th.slow_link_ratio:
        return None
    best = pairs.row(0, named=True)
    rest = pairs.filter(pl.col("_s") != best["_s"])["score"].max()
    gap = float(best["score"]) / max(float(rest or 0.0), 1e-9)
    if gap < th.slow_link_gap:
        return None
    ranks = tuple(int(x) for x in best["members"])
    names = {_link_name(list(ranks)): round(float(best["score"]), 3)}
    return Slow("pair", ranks, float(best["score"]), gap, rows_of(facts, ranks, "pair"), names)


def rows_of(facts: Facts, ranks: tuple[int, ...], kind: str) -> pl.DataFrame:
    """The transfers of the rank (``kind`` rank: every one it takes part in) or of the pair (``kind``
    pair: its link's) with ``ref_ns``, the reference of their class (`assess`), and ``ratio``: what
    the finding compares and the what-if sets them to."""
    t, links = _table(facts)
    if not t.height:
        return pl.DataFrame()
    if kind == "rank":
        (r,) = ranks
        refs = _rank_refs(links).filter(pl.col("rank") == r).drop("rank")
        rows = t.filter(pl.col("members").list.contains(r)).join(refs, on="_c")
    else:
        pair = pl.lit(list(ranks), dtype=pl.List(pl.Int32))
        mine = links.filter(pl.col("members") == pair).select("_s").unique()
        rows = t.join(mine, on="_s").join(_pair_refs(links), on=["_c", "_s"])
    return rows.with_columns(ratio=_ratio("transfer_ns", "ref_ns"))


def _who(slow: Slow) -> str:
    return f"rank {slow.ranks[0]}'s" if slow.kind == "rank" else f"the pair {slow.ranks[0]}-{slow.ranks[1]}'s"


def detect(facts: Facts, *, thresholds: Thresholds) -> list[Finding]:
    """At most one slow_link finding (see the module docstring)."""
    th = thresholds
    slow = assess(facts, th)
    if slow is None or not facts.steps.height:
        return []
    rows = slow.rows
    n, k = rows.height, int((rows["ratio"] > 1).sum())
    p = _chance(k, n, 0.5)
    if p > th.slow_link_chance:
        return []
    per_step = facts.steps.group_by("step").agg(pl.col("dur_ns").median())
    median_step = float(per_step["dur_ns"].median())
    n_steps = per_step.height
    excess = (pl.col("transfer_ns") - pl.col("ref_ns")).clip(lower_bound=0)
    share = float(rows.select(excess.sum()).item()) / max(n_steps, 1) / max(median_step, 1.0)
    if share < th.slow_link_min_excess:
        return []
    by_step = rows.group_by("step").agg(pl.col("ratio").median(), _x=excess.sum()).sort("step")
    hit = by_step.filter(pl.col("ratio") >= th.slow_link_ratio)
    if not hit.height:
        return []
    steps = tuple(int(s) for s in hit["step"].to_list())
    ratio = float(rows["ratio"].median())
    peers = sorted({int(m) for ms in rows["members"].to_list() for m in ms} - set(slow.ranks))
    sized = sorted({int(b) for b in rows["bytes"].drop_nulls().to_list()})
    kinds = sorted(set(rows["kind"].to_list()))
    own_ms = float(rows["transfer_ns"].median()) / NS_PER_MS
    ref_ms = float(rows["ref_ns"].median()) / NS_PER_MS
    at = (
        f"at the same bytes ({', '.join(_size(b) for b in sized)})"
        if sized
        else "at the same operation and place in the step (the trace gives no bytes)"
    )
    if slow.kind == "rank":
        where = (
            f"with {'ranks' if len(peers) > 1 else 'rank'} {', '.join(map(str, peers))}, in "
            f"{count(len(steps), 'step')}; slow with every peer it exchanges with: its link or NIC, not its arrival"
        )
    else:
        where = (
            f"in {count(len(steps), 'step')}; ranks {slow.ranks[0]} and {slow.ranks[1]}'s other links are not slow: "
            "the link between them"
        )
    summary = (
        f"{_who(slow)} transfers take {ratio:.1f}x those of the other links {at}: {own_ms:,.1f} ms against "
        f"{ref_ms:,.1f} ms (medians), {k} of its {n} {'/'.join(kinds)} transfers slower, {where}"
    )
    evidence = {
        "kind": slow.kind,
        "transfer_ratio_median": round(ratio, 3),
        "link_ratio_min": round(slow.score, 3),
        "gap": round(min(slow.gap, 1e6), 3),
        "transfer_ms_median": round(own_ms, 3),
        "peer_transfer_ms_median": round(ref_ms, 3),
        "bytes": sized,
        "instances": n,
        "slower_instances": k,
        "chance": float(f"{p:.3g}"),
        "peers": peers,
        "links": slow.links,
        "operations": kinds,
        "excess_ms_per_step": round(share * median_step / NS_PER_MS, 3),
        "transfer_ratio_by_step": {str(s): round(float(r), 3) for s, r in by_step.select("step", "ratio").iter_rows()},
    }
    return [
        Finding(
            cause=Cause.SLOW_LINK,
            ranks=slow.ranks,
            steps=steps,
            time_lost_ns=int(hit["_x"].sum()),
            confidence=round(min(1.0, k / n) * min(1.0, (ratio - 1) / (2 * (th.slow_link_ratio - 1))), 3),
            summary=summary,
            evidence=evidence,
        )
    ]


def _size(b: int) -> str:
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= div:
            return f"{b / div:.1f} {unit}"
    return f"{b} B"
