"""Align Flight Recorder entries across ranks and find who broke the collective order.

Per process group (keyed by its name, which every rank shares; the local ``pg_id`` is not), the
collectives are aligned by ``collective_seq_id`` over the window every member's ring buffer still holds.
The first sequence id where members differ names the desync: a different op, sizes or dtypes (the
minority are the culprits), or a member that never enqueued it. Then who waits: each member's oldest
incomplete entry (``state`` not ``completed`` and not ``retired``; gloo leaves ``state`` at
``scheduled`` and only retires), the collective most of them wait in, and the members with a dump that
never enqueued it (late). Point-to-point ops are matched per ordered (sender, receiver) pair: the k-th
send from a to b against the k-th recv on b from a. Members without a dump are named, and what they leave
open is said. The group whose problem started first (entry creation time) is the cause.
"""

from __future__ import annotations

import polars as pl

from tracediag.api_types import checked
from tracediag.desync.result import (
    Disagreement,
    Frame,
    GroupReport,
    HangReport,
    LateFrames,
    RankState,
)
from tracediag.desync.sentence import ranks_text as _ranks
from tracediag.desync.sentence import sentence_for
from tracediag.ingest.flight import FlightDumps

SIZES_MAY_DIFFER = frozenset(
    {"all_to_all", "all_to_all_single", "all_to_all_v_single", "all_gather_v", "reduce_scatter_v", "gather", "scatter"}
)
"""Collectives whose sizes legitimately differ across ranks (uneven splits, the root's side of gather and
scatter), as torch's fr_trace also exempts them."""
DEFAULT_GROUP_DESC = "default_pg"
_DONE = (pl.col("state") == "completed") | pl.col("retired").fill_null(False)
_SIZES_CHECKED = ~pl.col("op").is_in(list(SIZES_MAY_DIFFER))


def _flat(entries: pl.DataFrame) -> pl.DataFrame:
    """The columns the alignment reads, all flat, so that its filters, sorts and group-bys over every entry
    move no nested lists (2M entries: ~1 s less): `done`, and `_h`, a 64-bit hash of what ranks must agree
    on (op, sizes where `SIZES_MAY_DIFFER` does not exempt them, dtypes). Entries whose hashes differ
    differ; the values themselves are compared where they do (`_first_mismatch`). Two different values
    of one hash (~2^-64 a pair) would hide a mismatch."""
    agreed = pl.struct(
        "op",
        pl.when(_SIZES_CHECKED).then("input_sizes"),
        pl.when(_SIZES_CHECKED).then("output_sizes"),
        "input_dtypes",
        "output_dtypes",
    )
    return entries.select(
        "rank",
        "record_id",
        "pg_name",
        "pg_desc",
        "collective_seq_id",
        "p2p_seq_id",
        "backend",
        "op",
        "is_p2p",
        "p2p_src",
        "p2p_dst",
        "time_created_ns",
        "stack_id",
        _DONE.alias("done"),
        agreed.hash().alias("_h"),
    )


@checked
def analyze_dumps(dumps: FlightDumps, *, world_size: int | None = None) -> HangReport:
    """The hang report of a job's Flight Recorder dumps.

    Parameters
    ----------
    dumps
        The tables of `ingest.flight.read_dumps`.
    world_size
        The job's number of ranks, when the dumps cannot tell (gloo's ``pg_config`` lists no members
        once a second group exists, so a highest rank that wrote no dump is otherwise unseen).
    """
    dumped = sorted(dumps.ranks)
    world, notes = _world(dumps, dumped, world_size)
    missing = tuple(sorted(set(world) - set(dumped)))
    entries = _flat(dumps.entries)
    groups = [
        _group(entries, dumps.entries, dumps.groups, name, desc, world, dumped) for name, desc in _group_names(entries)
    ]
    if any(g.membership == "entries" for g in groups):
        notes.append(
            "group members were inferred from the ranks whose entries name the group (the dumps' pg_config lists "
            "none): a member that enqueued nothing in it is not seen"
        )
    if not entries.filter(pl.col("is_p2p")).height and entries.filter(pl.col("backend") == "gloo").height:
        notes.append("gloo's Flight Recorder records no point-to-point ops (torch 2.13): a send or recv is not seen")
    problems = sorted(
        (g for g in groups if g.status != "consistent"),
        key=lambda g: (g.first_ns is None, g.first_ns or 0, g.pg_name),
    )
    cause = problems[0] if problems else None
    frames = _frames(entries, dumps.stacks, cause) if cause else ()
    verdict = (
        "consistent"
        if cause is None
        else "desync"
        if cause.status == "desync"
        else "undecided"
        if cause.status == "undecided"
        else "hang"
    )
    culprits = _culprits(cause)
    report = HangReport(
        verdict=verdict,
        sentence="",
        culprit_ranks=culprits,
        culprit_group=cause.pg_name if cause else None,
        culprit_seq=(
            cause.disagreement.seq_id if cause and cause.disagreement else cause.waited_seq if cause else None
        ),
        culprit_op=(cause.disagreement.op if cause and cause.disagreement else cause.waited_op if cause else None),
        world=tuple(world),
        dumped_ranks=tuple(dumped),
        missing_dumps=missing,
        groups=tuple(sorted(groups, key=lambda g: _name_key(g.pg_name))),
        frames=frames,
        notes=tuple(notes),
        skipped=dict(dumps.skipped),
    )
    return _with_sentence(report, cause)


def _with_sentence(report: HangReport, cause: GroupReport | None) -> HangReport:
    from dataclasses import replace

    return replace(report, sentence=sentence_for(report, cause))


def _name_key(name: str) -> tuple[int, int | str]:
    return (0, int(name)) if name.isdigit() else (1, name)


def _world(dumps: FlightDumps, dumped: list[int], world_size: int | None) -> tuple[list[int], list[str]]:
    """The job's ranks: those that dumped, every rank a pg_config lists, 0..highest, 0..world_size-1."""
    notes: list[str] = []
    listed = set(dumps.groups.select(pl.col("ranks").explode().drop_nulls()).to_series().to_list())
    ranks = set(dumped) | listed
    if world_size is not None:
        ranks |= set(range(world_size))
        beyond = sorted(r for r in ranks if r >= world_size)
        if beyond:
            notes.append(f"ranks {_ranks(beyond)} are at or past world_size={world_size}")
    if ranks:
        ranks |= set(range(max(ranks) + 1))  # global ranks are 0..N-1: a gap is a rank that wrote no dump
    missing = sorted(ranks - set(dumped))
    if missing and world_size is None and not listed:
        notes.append(f"ranks {_ranks(missing)} are inferred from gaps in the dumped ranks")
    return sorted(ranks), notes


def _group_names(entries: pl.DataFrame) -> list[tuple[str, str | None]]:
    """Each group's name and its most frequent description (the first by name on a tie)."""
    counts = entries.group_by("pg_name", "pg_desc").len()
    names = counts.select("pg_name").unique()
    desc = (
        counts.filter(pl.col("pg_desc").is_not_null())
        .sort(["len", "pg_desc"], descending=[True, False])
        .unique("pg_name", keep="first")
    )
    rows = names.join(desc.select("pg_name", "pg_desc"), on="pg_name", how="left").rows()
    return sorted(rows, key=lambda r: _name_key(r[0]))


def _members(
    entries: pl.DataFrame, groups: pl.DataFrame, name: str, desc: str | None, world: list[int]
) -> tuple[list[int], str, Disagreement | None]:
    """A group's members and where they come from, and a membership disagreement between dumps."""
    listed = groups.filter((pl.col("pg_name") == name) & pl.col("ranks").is_not_null())
    if listed.height:
        by_list = listed.group_by("ranks").agg(pl.col("rank").sort()).sort(pl.col("rank").list.len(), descending=True)
        ranks = sorted(by_list["ranks"][0].to_list())
        problem = None
        if by_list.height > 1:
            top = by_list.row(0)
            tie = by_list["rank"].list.len()[0] == by_list["rank"].list.len()[1]
            found = {r: str(sorted(lst)) for lst, rs in by_list.rows()[0 if tie else 1 :] for r in rs}
            problem = Disagreement(
                kind="membership",
                seq_id=None,
                op=None,
                culprit_ranks=() if tie else tuple(sorted(found)),
                agreeing_ranks=() if tie else tuple(top[1]),
                expected=None if tie else str(ranks),
                found=found,
            )
        return ranks, "pg_config", problem
    if desc == DEFAULT_GROUP_DESC:
        return list(world), "world", None
    seen = entries.filter(pl.col("pg_name") == name)["rank"].unique().sort().to_list()
    return seen, "entries", None


def _group(
    entries: pl.DataFrame,
    values: pl.DataFrame,
    groups: pl.DataFrame,
    name: str,
    desc: str | None,
    world: list[int],
    dumped: list[int],
) -> GroupReport:
    """One group's report; `entries` are `_flat`'s, `values` the dumps' own (read at the mismatch found)."""
    members, source, membership_problem = _members(entries, groups, name, desc, world)
    have = [r for r in members if r in set(dumped)]
    no_dump = tuple(r for r in members if r not in set(dumped))
    mine = entries.filter(pl.col("pg_name") == name)
    coll = mine.filter(~pl.col("is_p2p"))
    per_rank = _per_rank(coll, have)
    window = per_rank["first_seq"].max()
    problem = (
        membership_problem or _first_mismatch(coll, values, name, window) or _p2p_unmatched(mine, members, set(dumped))
    )
    waiting = per_rank.filter(pl.col("waiting_in").is_not_null())
    waited_seq = waited_op = None
    late: tuple[int, ...] = ()
    if waiting.height:
        waited_seq = (
            waiting.group_by("waiting_in")
            .agg(pl.len())
            .sort(["len", "waiting_in"], descending=[True, False])["waiting_in"][0]
        )
        waited_op = waiting.filter(pl.col("waiting_in") == waited_seq)["waiting_op"][0]
        late = tuple(per_rank.filter(pl.col("last_seq").fill_null(-1) < waited_seq)["rank"].sort().to_list())
    if problem is None:
        missing = _first_missing(coll, per_rank, have, window)
        if missing is not None:
            problem = missing
    states = _states(per_rank, late, members, no_dump)
    status = (
        "desync"
        if problem is not None and problem.kind != "missing_rank"
        else "hang"
        if late or (problem is not None and problem.kind == "missing_rank")
        else "undecided"
        if waiting.height and no_dump
        else "stuck"
        if waiting.height
        else "consistent"
    )
    undecided = None
    if no_dump and status != "consistent":
        what = f"{waited_op} #{waited_seq}" if waited_seq is not None else "its collectives"
        undecided = (
            f"without a dump of rank{'s' if len(no_dump) > 1 else ''} {_ranks(no_dump)} it is undecided whether "
            f"{'they' if len(no_dump) > 1 else 'it'} entered {what} and with which op, sizes and dtypes"
        )
    first_ns = _first_ns(coll, mine, problem, waited_seq)
    return GroupReport(
        pg_name=name,
        pg_desc=desc,
        ranks=tuple(members),
        membership=source,
        status=status,
        disagreement=problem,
        waited_seq=waited_seq,
        waited_op=waited_op,
        waiting_ranks=tuple(waiting["rank"].sort().to_list()),
        late_ranks=late,
        no_dump_ranks=no_dump,
        states=states,
        undecided=undecided,
        hint=_count_hint(coll, have, window),
        first_ns=first_ns,
    )


def _per_rank(coll: pl.DataFrame, have: list[int]) -> pl.DataFrame:
    """Per member with a dump: first/last sequence id held, last completed, oldest incomplete.

    Collectives of a group complete in order, so everything up to the last completed entry is complete
    (gloo leaves some completed entries unretired while a later one is retired)."""
    seq = pl.col("collective_seq_id")
    ordered = coll.select("rank", "collective_seq_id", "op", "done").sort("rank", "collective_seq_id")
    stats = ordered.group_by("rank").agg(
        seq.min().alias("first_seq"),
        seq.max().alias("last_seq"),
        pl.col("op").last().alias("last_op"),
        seq.filter(pl.col("done")).max().alias("last_done"),
    )
    marked = ordered.join(stats.select("rank", "last_done"), on="rank")
    done_op = marked.filter(seq == pl.col("last_done")).group_by("rank").agg(pl.col("op").first().alias("last_done_op"))
    pending = (
        marked.filter(~pl.col("done") & (seq > pl.col("last_done").fill_null(-1)))
        .group_by("rank")
        .agg(seq.first().alias("waiting_in"), pl.col("op").first().alias("waiting_op"))
    )
    base = pl.DataFrame({"rank": have}, schema={"rank": pl.Int32})
    return (
        base.join(stats, on="rank", how="left")
        .join(done_op, on="rank", how="left")
        .join(pending, on="rank", how="left")
        .select("rank", "first_seq", "last_seq", "last_op", "last_done", "last_done_op", "waiting_in", "waiting_op")
        .sort("rank")
    )


def _values(frame: pl.DataFrame, column: str) -> pl.DataFrame:
    """Per value of `column` in `frame` (one sequence id): its ranks, most ranks first."""
    return (
        frame.group_by(column)
        .agg(pl.col("rank").sort())
        .with_columns(pl.col("rank").list.len().alias("n"), pl.col("rank").list.min().alias("low"))
        .sort(["n", "low"], descending=[True, False])
    )


def _text(value: object) -> str:
    return str(value.to_list() if isinstance(value, pl.Series) else value)


def _first_mismatch(coll: pl.DataFrame, values: pl.DataFrame, name: str, window: int | None) -> Disagreement | None:
    """The first sequence id (in the shared window) where members enqueued different collectives; `coll`
    the group's `_flat` collectives, `values` every entry as the dumps hold them."""
    if window is None or not coll.height:
        return None
    h = pl.col("_h")
    candidates = (
        coll.filter(pl.col("collective_seq_id") >= window)
        .group_by("collective_seq_id")
        .agg((h.min() != h.max()).alias("differs"))
        .filter("differs")
        .sort("collective_seq_id")["collective_seq_id"]
    )
    for seq in candidates:
        at = values.filter((pl.col("pg_name") == name) & ~pl.col("is_p2p") & (pl.col("collective_seq_id") == seq))
        checked = at.filter(_SIZES_CHECKED)
        op_differs = at["op"].n_unique() > 1
        sizes_differ = checked["input_sizes"].n_unique() > 1 or checked["output_sizes"].n_unique() > 1
        if op_differs or sizes_differ or at["input_dtypes"].n_unique() > 1 or at["output_dtypes"].n_unique() > 1:
            return _mismatch(at, seq, op_differs, sizes_differ)
    return None


def _mismatch(at: pl.DataFrame, seq: int, op_differs: bool, sizes_differ: bool) -> Disagreement:
    """The disagreement of the entries `at` one sequence id (op first, then sizes, then dtypes)."""
    if op_differs:
        kind, columns = "op", ["op"]
    elif sizes_differ:
        kind, columns = "sizes", ["input_sizes", "output_sizes"]
    else:
        kind, columns = "dtypes", ["input_dtypes", "output_dtypes"]
    key = at.select("rank", "op", pl.struct(columns).alias("_v"))
    groups = _values(key, "_v")
    majority_op = _values(at, "op")["op"][0]
    tie = groups.height > 1 and groups["n"][0] == groups["n"][1]

    def shown(v: dict) -> str:
        parts = [_text(v[c]) for c in columns]
        return parts[0] if len(parts) == 1 or parts[0] == parts[1] else f"{parts[0]} -> {parts[1]}"

    rows = groups.rows(named=True)
    found = {r: shown(row["_v"]) for row in (rows if tie else rows[1:]) for r in row["rank"]}
    return Disagreement(
        kind=kind,
        seq_id=seq,
        op=majority_op,
        culprit_ranks=() if tie else tuple(sorted(found)),
        agreeing_ranks=() if tie else tuple(rows[0]["rank"]),
        expected=None if tie else shown(rows[0]["_v"]),
        found=found,
    )


def _first_missing(
    coll: pl.DataFrame, per_rank: pl.DataFrame, have: list[int], window: int | None
) -> Disagreement | None:
    """The first sequence id some members enqueued and others (with a dump) never did."""
    if window is None:
        return None
    top = per_rank["last_seq"].max()
    behind = per_rank.filter(pl.col("last_seq").fill_null(-1) < top)
    if not behind.height:
        return None
    seq = int(behind["last_seq"].fill_null(window - 1).min()) + 1
    seq = max(seq, window)
    at = coll.filter(pl.col("collective_seq_id") == seq)
    culprits = tuple(per_rank.filter(pl.col("last_seq").fill_null(-1) < seq)["rank"].sort().to_list())
    op = _values(at, "op")["op"][0] if at.height else None
    return Disagreement(
        kind="missing_rank",
        seq_id=seq,
        op=op,
        culprit_ranks=culprits,
        agreeing_ranks=tuple(sorted(at["rank"].to_list())),
        expected=op,
        found={r: "never enqueued" for r in culprits},
    )


def _p2p_unmatched(mine: pl.DataFrame, members: list[int], dumped: set[int]) -> Disagreement | None:
    """The first send (recv) whose peer has a dump but no matching recv (send)."""
    p2p = mine.filter(pl.col("is_p2p") & pl.col("op").is_in(["send", "recv"]) & pl.col("p2p_src").is_not_null())
    if not p2p.height or not members:
        return None
    order = pl.DataFrame(
        {"local": list(range(len(members))), "global": sorted(members)}, schema={"local": pl.Int64, "global": pl.Int64}
    )
    glob = (
        p2p.join(order.rename({"local": "p2p_src", "global": "src"}), on="p2p_src", how="left")
        .join(order.rename({"local": "p2p_dst", "global": "dst"}), on="p2p_dst", how="left")
        .filter(pl.col("src").is_not_null() & pl.col("dst").is_not_null())
        .sort("rank", "record_id")
    )
    sends = glob.filter(pl.col("op") == "send").with_columns(pl.int_range(pl.len()).over("src", "dst").alias("k"))
    recvs = glob.filter(pl.col("op") == "recv").with_columns(pl.int_range(pl.len()).over("src", "dst").alias("k"))
    pairs = sends.select("src", "dst", "k", "p2p_seq_id", "time_created_ns").join(
        recvs.select("src", "dst", "k", pl.col("p2p_seq_id").alias("r_seq"), pl.col("time_created_ns").alias("r_ns")),
        on=["src", "dst", "k"],
        how="full",
        coalesce=True,
    )
    bad = (
        pairs.filter(
            (pl.col("p2p_seq_id").is_null() & pl.col("src").is_in(list(dumped)))
            | (pl.col("r_seq").is_null() & pl.col("dst").is_in(list(dumped)))
        )
        .with_columns(pl.coalesce("time_created_ns", "r_ns").alias("_t"))
        .sort("_t")
    )
    if not bad.height:
        return None
    row = bad.row(0, named=True)
    if row["r_seq"] is None:  # a send with no recv on its receiver
        return Disagreement(
            kind="p2p_unmatched",
            seq_id=row["p2p_seq_id"],
            op="send",
            culprit_ranks=(row["dst"],),
            agreeing_ranks=(row["src"],),
            expected=f"recv from rank {row['src']}",
            found={row["dst"]: "no matching recv"},
            peer=row["dst"],
        )
    return Disagreement(
        kind="p2p_unmatched",
        seq_id=row["r_seq"],
        op="recv",
        culprit_ranks=(row["src"],),
        agreeing_ranks=(row["dst"],),
        expected=f"send to rank {row['dst']}",
        found={row["src"]: "no matching send"},
        peer=row["src"],
    )


def _states(
    per_rank: pl.DataFrame, late: tuple[int, ...], members: list[int], no_dump: tuple[int, ...]
) -> tuple[RankState, ...]:
    out = {r: RankState(rank=r, status="no_dump") for r in no_dump}
    for row in per_rank.iter_rows(named=True):  # one row per member: the group's table
        r = row["rank"]
        status = "waiting" if row["waiting_in"] is not None else "late" if r in late else "done"
        out[r] = RankState(
            rank=r,
            status=status,
            last_enqueued=row["last_seq"],
            last_enqueued_op=row["last_op"],
            last_completed=row["last_done"],
            last_completed_op=row["last_done_op"],
            waiting_in=row["waiting_in"],
            waiting_op=row["waiting_op"],
        )
    return tuple(out[r] for r in sorted(out))


def _count_hint(coll: pl.DataFrame, have: list[int], window: int | None) -> str | None:
    """A member with fewer (or more) of one op than the others over the shared window: it skipped one."""
    if window is None or len(have) < 2:
        return None
    counts = (
        coll.filter(pl.col("collective_seq_id") >= window)
        .group_by("rank", "op")
        .agg(pl.len().alias("n"))
        .pivot("op", index="rank", values="n")
        .fill_null(0)
    )
    for op in sorted(c for c in counts.columns if c != "rank"):
        values = _values(counts.select("rank", op), op)
        if values.height > 1 and values["n"][0] > values["n"][1]:
            odd = values.slice(1)
            parts = [
                f"rank{'s' if len(rs) > 1 else ''} {_ranks(rs)} enqueued {n}"
                for n, rs in zip(odd[op], odd["rank"].to_list(), strict=True)
            ]
            return f"{', '.join(parts)} {op} where the others enqueued {values[op][0]} (from #{window} on)"
    return None


def _first_ns(
    coll: pl.DataFrame, mine: pl.DataFrame, problem: Disagreement | None, waited_seq: int | None
) -> int | None:
    seq = problem.seq_id if problem is not None and problem.kind != "p2p_unmatched" else waited_seq
    if problem is not None and problem.kind == "p2p_unmatched":
        at = mine.filter(pl.col("is_p2p") & (pl.col("p2p_seq_id") == problem.seq_id))
    elif seq is not None:
        at = coll.filter(pl.col("collective_seq_id") == seq)
    else:
        return None
    return at["time_created_ns"].min()


def _culprits(cause: GroupReport | None) -> tuple[int, ...]:
    if cause is None:
        return ()
    if cause.disagreement is not None and cause.disagreement.culprit_ranks:
        return cause.disagreement.culprit_ranks
    if cause.late_ranks:
        return cause.late_ranks
    return cause.no_dump_ranks


def _stack(stacks: pl.DataFrame, rank: int, stack_id: int | None) -> tuple[Frame, ...]:
    if stack_id is None:
        return ()
    hit = stacks.filter((pl.col("rank") == rank) & (pl.col("stack_id") == stack_id))
    frames = hit["frames"][0] if hit.height else None
    return tuple(Frame(**f) for f in frames) if frames is not None else ()


def _frames(entries: pl.DataFrame, stacks: pl.DataFrame, cause: GroupReport) -> tuple[LateFrames, ...]:
    """The late ranks' last recorded stacks, and the stack of the collective the others wait in."""
    out = []
    for r in _culprits(cause):
        last = entries.filter(pl.col("rank") == r).sort("record_id").tail(1)
        if last.height:
            row = last.row(0, named=True)
            frames = _stack(stacks, r, row["stack_id"])
            if frames:
                out.append(
                    LateFrames(
                        rank=r,
                        pg_name=row["pg_name"],
                        seq_id=row["collective_seq_id"],
                        op=row["op"],
                        role="late_last_entry",
                        frames=frames,
                    )
                )
    if cause.waited_seq is not None and cause.waiting_ranks:
        at = entries.filter(
            (pl.col("pg_name") == cause.pg_name)
            & (pl.col("collective_seq_id") == cause.waited_seq)
            & ~pl.col("is_p2p")
            & pl.col("rank").is_in(list(cause.waiting_ranks))
        ).sort("rank")
        if at.height:
            row = at.row(0, named=True)
            frames = _stack(stacks, row["rank"], row["stack_id"])
            if frames:
                out.append(
                    LateFrames(
                        rank=row["rank"],
                        pg_name=cause.pg_name,
                        seq_id=cause.waited_seq,
                        op=row["op"],
                        role="waited_collective",
                        frames=frames,
                    )
                )
    return tuple(out)
