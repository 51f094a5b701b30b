"""Renderings of a `hang.HangReport`: text (the sentence, then a table per group) and an HTML section."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracediag.desync.sentence import group_label, ranks_text, seconds, user_frame
from tracediag.report.figures import esc

if TYPE_CHECKING:
    from tracediag.desync.result import Frame, GroupReport, HangReport, HostActivity, RankJoin, RankState

_MAX_FRAMES = 12


def _seq(seq: int | None, op: str | None) -> str:
    return "-" if seq is None else f"#{seq} {op or ''}".rstrip()


def _rows(states: tuple[RankState, ...]) -> list[tuple[str, RankState]]:
    """Ranks in one row where everything but the rank is equal (1,024 ranks stay a short table), in the
    order of each row's lowest rank (`states` come by rank)."""
    rows: dict[tuple, list[RankState]] = {}
    for s in states:
        key = (s.status, s.last_enqueued, s.last_enqueued_op, s.last_completed, s.last_completed_op, s.waiting_in)
        rows.setdefault(key, []).append(s)
    return [(ranks_text([s.rank for s in same]), same[0]) for same in rows.values()]


def _group_head(g: GroupReport) -> str:
    what = f"{g.status}"
    if g.waited_seq is not None:
        what += f", most waiting ranks are in {g.waited_op} #{g.waited_seq}"
    return f"{group_label(g)}: {what} ({len(g.ranks)} members, from {g.membership})"


def _frame_line(f: Frame) -> str:
    line = f":{f.line}" if f.line is not None else ""
    return f"{f.name}  {f.filename}{line}"


def _join_cells(j: RankJoin) -> tuple[str, ...]:
    method = {"seq": "sequence id", "time": "time", "none": "not joined"}[j.method]
    offset = "-" if j.offset_ns is None else ("-" if j.offset_ns < 0 else "+") + seconds(abs(j.offset_ns))
    return (str(j.rank), method, f"{j.matched}/{j.dump_entries}", str(j.trace_calls), offset, j.trace)


def _activity_head(a: HostActivity) -> str:
    until = "its next collective call" if a.until == "next_collective" else "the end of its trace"
    return (
        f"host of rank {a.rank} from the end of #{a.after_seq} (group {a.pg_name}) to {until}: "
        f"{seconds(a.window_ns)}, {seconds(a.busy_ns)} in top-level host ops; longest first:"
    )


def _trace_lines(report: HangReport) -> list[str]:
    if not report.joins:
        return []
    lines = ["profiler traces joined to the dumps:"]
    lines.append(f"  {'rank':<6}{'joined by':<14}{'matched':<10}{'calls':<8}{'offset':<12}trace")
    for j in report.joins:
        rank, method, matched, calls, offset, trace = _join_cells(j)
        lines.append(f"  {rank:<6}{method:<14}{matched:<10}{calls:<8}{offset:<12}{trace}")
    lines.append("")
    for a in report.activity:
        lines.append(_activity_head(a))
        for op in a.ops:
            lines.append(f"  {seconds(op.inside_ns):>10}  {op.name}  ({op.kind})")
        lines.append("")
    return lines


def render_hang_text(report: HangReport) -> str:
    """The sentence, then per group a table of where each rank is, then the stacks, notes and skips."""
    lines = [report.sentence, ""]
    if report.missing_dumps:
        lines += [
            f"no dump from rank{'s' if len(report.missing_dumps) > 1 else ''} {ranks_text(report.missing_dumps)}",
            "",
        ]
    for g in report.groups:
        lines.append(_group_head(g))
        lines.append(f"  {'ranks':<16}{'status':<10}{'last enqueued':<24}{'last completed':<24}waiting in")
        for ranks, s in _rows(g.states):
            lines.append(
                f"  {ranks:<16}{s.status:<10}{_seq(s.last_enqueued, s.last_enqueued_op):<24}"
                f"{_seq(s.last_completed, s.last_completed_op):<24}{_seq(s.waiting_in, s.waiting_op)}"
            )
        d = g.disagreement
        if d is not None:
            detail = "; ".join(f"rank {r}: {v}" for r, v in sorted(d.found.items())[:8])
            lines.append(f"  first disagreement: {d.kind} at #{d.seq_id} (expected {d.expected}; {detail})")
        if g.hint:
            lines.append(f"  hint: {g.hint}")
        if g.undecided:
            lines.append(f"  undecided: {g.undecided}")
        lines.append("")
    for lf in report.frames:
        what = "last recorded collective" if lf.role == "late_last_entry" else "the collective the others wait in"
        lines.append(f"stack of rank {lf.rank}, {what} ({lf.op} #{lf.seq_id} of group {lf.pg_name}), innermost first:")
        mark = user_frame(lf.frames)
        for f in lf.frames[:_MAX_FRAMES]:
            lines.append(f"  {'>' if f == mark else ' '} {_frame_line(f)}")
        if len(lf.frames) > _MAX_FRAMES:
            lines.append(f"    ... {len(lf.frames) - _MAX_FRAMES} more")
        lines.append("")
    lines += _trace_lines(report)
    for note in report.notes:
        lines.append(f"note: {note}")
    if report.skipped:
        lines.append("skipped: " + ", ".join(f"{n} {why}" for why, n in sorted(report.skipped.items())))
    return "\n".join(lines).rstrip()


def render_hang_html(report: HangReport) -> str:
    """The report as an HTML section (no script); every string read from a dump is escaped."""
    parts = [f"<section class='hang'><h2>Hang</h2><p class='sentence'>{esc(report.sentence)}</p>"]
    for g in report.groups:
        parts.append(f"<h3>{esc(_group_head(g))}</h3><table><tr><th>ranks</th><th>status</th>")
        parts.append("<th>last enqueued</th><th>last completed</th><th>waiting in</th></tr>")
        for ranks, s in _rows(g.states):
            cells = (
                ranks,
                s.status,
                _seq(s.last_enqueued, s.last_enqueued_op),
                _seq(s.last_completed, s.last_completed_op),
                _seq(s.waiting_in, s.waiting_op),
            )
            parts.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>")
        parts.append("</table>")
        for label, text in (("hint", g.hint), ("undecided", g.undecided)):
            if text:
                parts.append(f"<p>{label}: {esc(text)}</p>")
    for lf in report.frames:
        frames = "".join(f"<li>{esc(_frame_line(f))}</li>" for f in lf.frames[:_MAX_FRAMES])
        parts.append(f"<p>stack of rank {lf.rank} ({esc(lf.op)} #{lf.seq_id}):</p><ol>{frames}</ol>")
    if report.joins:
        parts.append("<h3>Profiler traces joined to the dumps</h3><table><tr><th>rank</th><th>joined by</th>")
        parts.append("<th>matched</th><th>calls</th><th>offset</th><th>trace</th></tr>")
        for j in report.joins:
            parts.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in _join_cells(j)) + "</tr>")
        parts.append("</table>")
    for a in report.activity:
        ops = "".join(f"<li>{esc(seconds(op.inside_ns))} {esc(op.name)} ({esc(op.kind)})</li>" for op in a.ops)
        parts.append(f"<p>{esc(_activity_head(a))}</p><ol>{ops}</ol>")
    parts.extend(f"<p class='note'>{esc(n)}</p>" for n in report.notes)
    parts.append("</section>")
    return "".join(parts)


def render_hang_page(report: HangReport, *, title: str = "tracediag hang") -> str:
    """A self-contained HTML page around `render_hang_html`."""
    style = "body{font-family:sans-serif;margin:2em}td,th{padding:2px 10px;text-align:left}.sentence{font-weight:bold}"
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)}</title><style>{style}</style></head>"
        f"<body>{render_hang_html(report)}</body></html>"
    )
