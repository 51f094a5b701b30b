"""The one sentence that opens a hang report: who broke the collective order, and who waits for whom."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tracediag.desync.result import Frame, GroupReport, HangReport

_TORCH_FRAME = re.compile(r"(^|[/\\])(torch|multiprocessing|threading|runpy)[/\\]|^<")


def ranks_text(ranks: object) -> str:
    """Ranks as people write them, runs of three or more shortened.

    Examples
    --------
    >>> ranks_text([7, 0, 1, 2, 3, 4, 6])
    '0-4, 6, 7'
    """
    rs = sorted(set(ranks))  # type: ignore[call-overload]
    parts: list[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        parts.append(f"{rs[i]}-{rs[j]}" if j - i >= 2 else ", ".join(map(str, rs[i : j + 1])))
        i = j + 1
    return ", ".join(parts)


def _who(ranks: object) -> str:
    rs = sorted(set(ranks))  # type: ignore[call-overload]
    return f"rank{'s' if len(rs) != 1 else ''} {ranks_text(rs)}"


def group_label(g: GroupReport) -> str:
    """``group 0 (default_pg)``."""
    desc = f" ({g.pg_desc})" if g.pg_desc and g.pg_desc not in ("undefined", g.pg_name) else ""
    return f"group {g.pg_name}{desc}"


def user_frame(frames: tuple[Frame, ...]) -> Frame | None:
    """The innermost frame outside torch and the standard library's process plumbing."""
    return next((f for f in frames if not _TORCH_FRAME.search(f.filename)), frames[0] if frames else None)


def _where(report: HangReport, ranks: tuple[int, ...]) -> str:
    for lf in report.frames:
        if lf.role == "late_last_entry" and lf.rank in ranks:
            f = user_frame(lf.frames)
            if f is not None:
                line = f":{f.line}" if f.line is not None else ""
                call, site = f"{lf.op} #{lf.seq_id}", f"{f.name} ({f.filename}{line})"
                return f"; rank {lf.rank}'s last recorded collective ({call}) was called from {site}"
    return ""


def seconds(ns: int) -> str:
    """A duration as people read it: ``7.00 s``, ``12.3 ms``, ``40 µs``."""
    return f"{ns / 1e9:,.2f} s" if ns >= 1e9 else f"{ns / 1e6:,.1f} ms" if ns >= 1e6 else f"{ns / 1e3:,.0f} µs"


def host_text(report: HangReport, ranks: tuple[int, ...]) -> str:
    """``; rank 2's host is in `save_checkpoint` (7.00 s of the 7.00 s ...)``, from the joined traces."""
    parts = []
    for a in report.activity:
        if a.rank not in ranks:
            continue
        until = "its next collective call" if a.until == "next_collective" else "the end of its trace"
        window = f"the {seconds(a.window_ns)} from the end of #{a.after_seq} to {until}"
        how = f"profiler trace joined by {'sequence id' if a.method == 'seq' else 'time'}"
        if a.ops:
            parts.append(
                f"rank {a.rank}'s host is in `{a.ops[0].name}` ({seconds(a.ops[0].inside_ns)} of {window}; {how})"
            )
        else:
            parts.append(f"rank {a.rank}'s host ran no recorded operator in {window} ({how})")
    return "".join(f"; {p}" for p in parts)


def _waiting(g: GroupReport) -> str:
    parts: dict[tuple[int | None, str | None], list[int]] = {}
    for s in g.states:
        if s.status == "waiting":
            parts.setdefault((s.waiting_in, s.waiting_op), []).append(s.rank)
    return ", ".join(
        f"{_who(rs)} in {op} #{seq}" for (seq, op), rs in sorted(parts.items(), key=lambda kv: kv[0][0] or 0)
    )


def sentence_for(report: HangReport, cause: GroupReport | None) -> str:
    """The report's first sentence."""
    if cause is None:
        n = len(report.dumped_ranks)
        missing = f"; {_who(report.missing_dumps)} wrote no dump" if report.missing_dumps else ""
        return (
            f"The dumps of {n} rank{'s' if n != 1 else ''} agree: every collective of {len(report.groups)} "
            f"group{'s' if len(report.groups) != 1 else ''} matches across ranks and none is waiting{missing}."
        )
    g, d = cause, cause.disagreement
    label = group_label(g)
    if d is not None and d.kind in ("op", "sizes", "dtypes"):
        if not d.culprit_ranks:
            sides = "; ".join(f"rank {r}: {v}" for r, v in sorted(d.found.items()))
            text = f"The ranks of {label} disagree on collective #{d.seq_id} ({d.kind}: {sides}), with no majority"
        elif d.kind == "op":
            value = " or ".join(sorted(set(d.found.values())))
            text = (
                f"{_who(d.culprit_ranks).capitalize()} called {value} as collective #{d.seq_id} of {label} "
                f"where {_who(d.agreeing_ranks)} called {d.expected}"
            )
        else:
            values = ", ".join(sorted(set(d.found.values())))
            text = (
                f"{_who(d.culprit_ranks).capitalize()}'s {d.op} #{d.seq_id} of {label} has {d.kind} {values} "
                f"where {_who(d.agreeing_ranks)} have {d.expected}"
            )
        waiting = _waiting(g)
        if waiting:
            text += f"; waiting: {waiting}"
        return text + _where(report, d.culprit_ranks) + "."
    if d is not None and d.kind == "membership":
        return (
            f"The dumps disagree on the members of {label}: "
            + "; ".join(f"rank {r} lists {v}" for r, v in sorted(d.found.items()))
            + (f" where {_who(d.agreeing_ranks)} list {d.expected}" if d.expected else "")
            + "."
        )
    if d is not None and d.kind == "p2p_unmatched":
        other = "recv" if d.op == "send" else "send"
        return f"Rank {d.agreeing_ranks[0]}'s {d.op} #{d.seq_id} in {label} has no matching {other} on rank {d.peer}."
    if g.late_ranks or (d is not None and d.kind == "missing_rank"):
        late = g.late_ranks or (d.culprit_ranks if d else ())
        seq = g.waited_seq if g.waited_seq is not None else d.seq_id if d else None
        op = g.waited_op or (d.op if d else None)
        last = {s.rank: s for s in g.states}
        lasts = "; ".join(
            f"rank {r}'s last completed collective there is "
            + (
                f"#{last[r].last_completed} ({last[r].last_completed_op})"
                if last[r].last_completed is not None
                else "none in its dump"
            )
            for r in late
            if r in last
        )
        waiting = g.waiting_ranks
        text = f"{_who(late).capitalize()} never entered {op} #{seq} of {label}"
        if waiting:
            text += f"; {_who(waiting)} {'has' if len(waiting) == 1 else 'have'} been waiting in it"
        if lasts:
            text += f"; {lasts}"
        text += host_text(report, late)
        if g.no_dump_ranks:
            text += f"; {_who(g.no_dump_ranks)} wrote no dump"
        return text + _where(report, late) + "."
    if g.status == "undecided":
        return (
            f"{_who(g.waiting_ranks).capitalize()} {'has' if len(g.waiting_ranks) == 1 else 'have'} been waiting in "
            f"{g.waited_op} #{g.waited_seq} of {label}, which every member with a dump entered; "
            f"{_who(g.no_dump_ranks)} wrote no dump and "
            f"{'is the only member' if len(g.no_dump_ranks) == 1 else 'are the only members'} "
            "that can be holding it (undecided without its dump)."
        )
    return (
        f"Every member of {label} entered {g.waited_op} #{g.waited_seq} and {_who(g.waiting_ranks)} "
        "still wait in it: no rank is late, the collective itself is stuck (network, backend or a peer's GPU)."
    )
