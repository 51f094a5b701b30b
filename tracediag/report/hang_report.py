"""Renderings of a `hang.HangReport`: text (the sentence, then a table per group) and an HTML section."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracediag.desync.sentence import group_label, ranks_text, user_frame
from tracediag.report.figures import esc

if TYPE_CHECKING:
    from tracediag.desync.result import Frame, GroupReport, HangReport, RankState

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
