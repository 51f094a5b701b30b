"""The HTML report: one self-contained file (plotly.js packed inline, `bundle`; no network) for a CI artifact.

Order: findings with their evidence (and the observed-vs-predicted sentence), rank × step heat-maps
of step time, compute and lateness (compute over the step's median: a hot spot, a stripe, scatter),
per-rank breakdown bars, the slowest step's timeline with collective waits,
pipeline stage idle shares (when the analysis has a pipeline section), observed against predicted
(when a model was given), warnings, and the report's size. Every string from a trace is escaped.
"""

from __future__ import annotations

from importlib.metadata import version
from typing import TYPE_CHECKING

import orjson

from tracediag.analysis import Cause
from tracediag.report.bundle import loader, pack, packed_block, plotly_js
from tracediag.report.evidence import sentence, with_unit
from tracediag.report.figures import (
    Figure,
    breakdown,
    check_chart,
    esc,
    heatmap,
    lateness,
    pipeline_idle,
    timeline,
)
from tracediag.report.kernels_html import kernels_section
from tracediag.report.step_timeline import finding_anchor, timelines
from tracediag.units import MS_PER_S, NS_PER_MS, count, format_ms, noun, spans

if TYPE_CHECKING:
    from tracediag.analysis import Analysis, Finding, Pipeline, WhatIf
    from tracediag.check_result import Check
    from tracediag.report.step_timeline import View
    from tracediag.run import Run

CONFIG = {"displaylogo": False, "responsive": True, "modeBarButtonsToRemove": ["select2d", "lasso2d"]}
_SIZE_MARK = "@@REPORT_SIZE@@"
_MAX_LIST = 12
"""Ranks or steps listed in a finding before the rest are counted."""

_CSS = """
body{margin:0;background:#f5f6f8;color:#1f2328;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif}
main{max-width:1320px;margin:0 auto;padding:20px 24px 40px}
header h1{font-size:22px;margin:4px 0}
header p{margin:2px 0;color:#57606a}
nav a{margin-right:14px;color:#0969da;text-decoration:none;font-size:13px}
section{background:#fff;border:1px solid #d8dee4;border-radius:8px;padding:14px 20px;margin:16px 0}
section h2{font-size:17px;margin:2px 0 10px}
.grid2{display:grid;grid-template-columns:1fr 1fr;gap:16px}
@media (max-width:1000px){.grid2{grid-template-columns:1fr}}
.caption{color:#57606a;font-size:12px;margin:2px 0 8px}
.finding{border-left:5px solid #8c959f;padding:6px 12px;margin:10px 0;background:#fafbfc}
.finding h3{font-size:15px;margin:2px 0 4px;font-weight:600}
.finding.bad{border-left-color:#cf222e}
.finding.ok{border-left-color:#1a7f37}
.finding.check{border-left-color:#8250df}
.perfetto{margin:-6px 0 12px 17px;color:#57606a;font-size:12px}
.badge{display:inline-block;font-size:12px;padding:1px 8px;border-radius:10px;background:#eaeef2;margin-right:6px}
.meta{color:#57606a;font-size:13px;margin:2px 0 6px}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
th,td{padding:3px 10px;border-bottom:1px solid #eaeef2;text-align:left;vertical-align:top}
th{background:#f6f8fa;font-weight:600}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.key{color:#57606a;white-space:nowrap}
td.val{font-variant-numeric:tabular-nums;max-width:560px}
.note{color:#57606a}
footer{color:#57606a;font-size:12px;margin-top:10px}
"""


def _figure(fig: Figure, name: str) -> str:
    """A figure's div and its packed JSON (`bundle`: drawn once plotly.js is unpacked), with its caption."""
    import plotly.io as pio

    spec = pio.to_json(fig.figure, validate=False, pretty=False)
    payload = spec[:-1] + ',"config":' + orjson.dumps(CONFIG).decode() + "}"
    height = int(fig.figure.layout.height or 450)
    div = f'<div id="fig-{name}" class="plotly-graph-div" style="height:{height}px;width:100%"></div>'
    block = packed_block(pack(payload.encode()), class_="td-figure", data_for=f"fig-{name}")
    return f'<div class="plot">{div}{block}<p class="caption">{esc(fig.caption)}</p></div>'


def _ms(ns: float) -> str:
    return format_ms(ns / NS_PER_MS)


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.0f} kB"


def _listing(values: tuple[int, ...]) -> str:
    """`0–3, 7, 9` style, the first `_MAX_LIST` pieces, then a count."""
    pieces = spans(values)
    more = f" … ({len(values):,} in all)" if len(pieces) > _MAX_LIST else ""
    return ", ".join(pieces[:_MAX_LIST]) + more if pieces else "—"


def _finding(f: Finding, *, timeline: str = "") -> str:
    """A finding's card; `timeline`: the id of its step's timeline, linked."""
    kind = "ok" if f.cause == Cause.HEALTHY else "bad"
    link = f' · <a href="#{timeline}">its kernels and waits, step by stream</a>' if timeline else ""
    evidence = "".join(
        f'<tr><td class="key">{esc(k)}</td><td class="val">{esc(with_unit(k, v, limit=2 * _MAX_LIST))}</td>'
        f'<td class="note">{esc(sentence(k))}</td></tr>'
        for k, v in f.evidence.items()
    )
    return (
        f'<article class="finding {kind}"><h3><span class="badge">{esc(f.cause)}</span>{esc(f.summary)}</h3>'
        f'<p class="meta">{noun(len(f.ranks), "rank")} {esc(_listing(f.ranks))} · '
        f"{noun(len(f.steps), 'step')} {esc(_listing(f.steps))} · time lost "
        f"{_ms(f.time_lost_ns)} · confidence {f.confidence:.2f}"
        + ("" if f.measurable else " · found, costs nothing measurable")
        + link
        + "</p>"
        + (f'<p class="whatif">what-if: {esc(f.whatif)}</p>' if f.whatif else "")
        + (f'<p class="whatif">what-if withheld: {esc(f.whatif_withheld)}</p>' if f.whatif_withheld else "")
        + (f"<table>{evidence}</table>" if evidence else "")
        + "</article>"
    )


def _in_perfetto(f: Finding, i: int) -> str:
    """Where finding `i` (1-based) is in the Perfetto export (`report.perfetto`: one track per finding
    in each of its ranks' processes, its slices named by the cause)."""
    if f.cause == Cause.HEALTHY:
        return ""
    late = " and their tracks <i>collectives: arrived last</i>" if f.ranks else ""
    return (
        f'<p class="perfetto">In Perfetto (<code>analyze --perfetto FILE</code>, docs/perfetto.md): the slices '
        f"<b>{esc(f.cause.value)}</b> on the track <i>finding {i}: {esc(f.cause.value)}</i> of "
        f"{noun(len(f.ranks), 'rank')} {esc(_listing(f.ranks))}{late}; search “{esc(f.cause.value)}”.</p>"
    )


def _findings(analysis: Analysis, linked: frozenset[str] = frozenset()) -> str:
    """The findings' cards; `linked`: the timeline sections on the page, which the cards link to."""
    cards = [
        f'<div id="finding-{i}">{_finding(f, timeline=finding_anchor(i) if finding_anchor(i) in linked else "")}'
        f"{_in_perfetto(f, i)}</div>"
        for i, f in enumerate(analysis.findings, 1)
    ] or ['<p class="note">No findings.</p>']
    check = analysis.check
    if check is not None and check.sentence:
        cards.insert(
            0,
            '<article class="finding check"><h3><span class="badge">vs prediction</span>'
            f'{esc(check.sentence)}</h3><p class="meta"><a href="#check">observed against predicted</a></p>'
            "</article>",
        )
    return '<section id="findings"><h2>Findings</h2>' + "".join(cards) + "</section>"


def _num(v: float | None, unit: str) -> str:
    if v is None:
        return "—"
    return f"{100 * v:.1f}%" if unit == "fraction" else format_ms(MS_PER_S * v, small=True)


def _ratio(r: float | None) -> str:
    return "—" if r is None else f"{r:.2f}×"


def _check(check: Check, *, chart: bool = True) -> str:
    """The observed-against-predicted section; `chart=False` leaves out its plotly chart (for a notebook)."""
    plan = check.plan
    split = " ".join(f"{esc(k)}={esc(v)}" for k, v in plan.split)
    head = (
        f'<p class="meta">{esc(plan.model)} on {esc(plan.gpus)} × '
        f"{esc(plan.device)}, {split}, engine {esc(plan.engine)}</p>"
    )
    comp = "".join(
        f"<tr><td>{esc(c.label)}</td><td class='num'>{_num(c.observed, c.unit)}</td>"
        f"<td class='num'>{_num(c.predicted, c.unit)}</td>"
        f"<td class='num'>{_ratio(c.ratio)}</td>"
        f"<td class='note'>{esc(c.note)}</td></tr>"
        for c in check.components
    )
    links = "".join(
        f"<tr><td>{esc(li.kind or '?')}</td><td>{esc(li.op)}</td><td>{esc(', '.join(li.groups) or '—')}</td>"
        f"<td class='num'>{li.collectives:,}</td><td class='num'>{li.busbw_gbps:,.2f}</td>"
        f"<td class='num'>{'—' if li.link_busbw_gbps is None else format(li.link_busbw_gbps, ',.0f')}</td>"
        f"<td>{esc(li.link or '—')}</td>"
        f"<td class='num'>{_ratio(li.ratio)}</td>"
        f"<td class='note'>{esc(li.kind_from)}{'; ' + esc(li.note) if li.note else ''}</td></tr>"
        for li in check.links
    )
    notes = "".join(f"<li>{esc(n)}</li>" for n in check.notes)
    return (
        '<section id="check"><h2>Observed against predicted</h2>'
        + head
        + f"<p><b>{esc(check.sentence)}</b></p>"
        + (f"<ul class='note'>{notes}</ul>" if notes else "")
        + (_figure(check_chart(check), "check") if chart else "")
        + "<table><tr><th>component</th><th>observed</th><th>predicted</th><th>ratio</th><th>note</th></tr>"
        + comp
        + "</table>"
        + (
            "<h3>Bus bandwidth per collective kind</h3><table><tr><th>kind</th><th>op</th><th>groups</th>"
            "<th>collectives</th><th>achieved GB/s</th><th>link GB/s</th><th>link</th><th>ratio</th>"
            f"<th>how the kind was told</th></tr>{links}</table>"
            if links
            else '<p class="note">No collective with a measured bus bandwidth.</p>'
        )
        + "</section>"
    )


def _pipeline(pipelines: tuple[Pipeline, ...]) -> str:
    if not pipelines:
        return ""
    fig = pipeline_idle(pipelines)
    return (
        '<section id="pipeline"><h2>Pipeline stages: idle share against the ideal bubble</h2>'
        + (_figure(fig, "pipeline") if fig else '<p class="note">No stage shares in the analysis.</p>')
        + "</section>"
    )


def _whatif(whatif: WhatIf | None) -> str:
    """Per step: observed, replayed from the observed durations, and replayed without every cause."""
    if whatif is None or not whatif.steps:
        return ""
    rows = "".join(
        f"<tr><td>{r.step}</td><td>{_ms(r.observed_ns)}</td><td>{_ms(r.replayed_ns)}</td>"
        f"<td>{_ms(r.without_all_ns)}</td></tr>"
        for r in whatif.steps
    )
    err = whatif.replay_error_median
    fit = (
        "" if err is None else f" The replay of the observed durations is off by {100 * err:.1f}% (median over steps)."
    )
    if whatif.withheld:
        fit += f" What-if withheld: {whatif.withheld}."
    return (
        '<section id="whatif"><h2>What-if: each step without the causes found</h2>'
        f'<p class="note">Each step replayed from the trace with every cause\'s durations removed.{esc(fit)}</p>'
        "<table><tr><th>step</th><th>observed</th><th>replayed</th><th>what-if</th></tr>"
        f"{rows}</table></section>"
    )


def _timelines(drawn: list[tuple[View, Figure]], analysis: Analysis, has_run: bool) -> str:
    """The per-stream timelines, or why there are none."""
    if not drawn:
        why = (
            "no analysed step"
            if not analysis.steps.height or has_run
            else "drawn from the run's events: write the report with analyze --html (a saved analysis has no events)"
        )
        return f'<section id="streams"><h2>Kernels and waits per stream</h2><p class="note">{esc(why)}.</p></section>'
    blocks = "".join(
        f'<div id="{v.anchor}"><h3>{esc(v.title)}</h3>{_figure(fig, v.anchor.removeprefix("timeline-") + "-streams")}'
        "</div>"
        for v, fig in drawn
    )
    return (
        '<section id="streams"><h2>Kernels and waits per stream</h2><p class="note">Each rank\'s device streams '
        "and host threads in the step, on the analysis' aligned clocks: red, waiting at a collective for the last "
        "rank; ▼, the rank that arrives last.</p>" + blocks + "</section>"
    )


def _body(analysis: Analysis, drawn: list[tuple[View, Figure]], has_run: bool) -> str:
    steps = analysis.steps
    parts = [_findings(analysis, frozenset(v.anchor for v, _ in drawn))]
    if steps.height:
        parts.append(
            '<section id="heatmaps"><h2>Step time and compute per rank and step</h2><div class="grid2">'
            + _figure(heatmap(steps, "dur_ns", "step time (ms)"), "step-time")
            + _figure(heatmap(steps, "compute_ns", "compute (ms)"), "compute")
            + "</div>"
            + _figure(lateness(steps), "lateness")
            + "</section>"
        )
        parts.append(
            '<section id="breakdown"><h2>Where each rank\'s step goes</h2>'
            + _figure(breakdown(steps), "breakdown")
            + "</section>"
        )
        tl = timeline(analysis)
        if tl is not None:
            parts.append(
                '<section id="timeline"><h2>The slowest step across ranks</h2>' + _figure(tl, "timeline") + "</section>"
            )
        parts.append(_timelines(drawn, analysis, has_run))
    parts.append(_whatif(analysis.whatif))
    parts.append(_pipeline(analysis.pipelines))
    parts.append(kernels_section(analysis))
    if analysis.check is not None:
        parts.append(_check(analysis.check))
    if analysis.warnings:
        items = "".join(f"<li>{esc(w)}</li>" for w in analysis.warnings)
        parts.append(f'<section id="warnings"><h2>Warnings</h2><ul>{items}</ul></section>')
    return "".join(parts)


def _header(analysis: Analysis, title: str) -> str:
    steps = analysis.steps
    median = _ms(steps["dur_ns"].median()) if steps.height else "—"
    excluded = f" ({count(analysis.excluded_steps, 'partial rank-step')} left out)" if analysis.excluded_steps else ""
    links = [("findings", "Findings"), ("heatmaps", "Heat-maps"), ("breakdown", "Breakdown")]
    links += [("timeline", "Slowest step"), ("streams", "Kernels and waits")] if steps.height else []
    links += [("pipeline", "Pipeline")] if analysis.pipelines else []
    links += [("kernels", "Kernels")] if analysis.kernels is not None and analysis.kernels.height else []
    links += [("check", "vs prediction")] if analysis.check is not None else []
    nav = "".join(f'<a href="#{a}">{t}</a>' for a, t in links)
    return (
        f"<header><h1>{esc(title)}</h1><p>{count(len(analysis.ranks), 'rank')} traced of world size "
        f"{analysis.world_size:,} · {count(len(analysis.step_numbers), 'step')}{excluded} · median step {median}</p>"
        f"<nav>{nav}</nav></header>"
    )


def render_html(
    analysis: Analysis, *, title: str = "tracediag report", run: Run | None = None, step_regex: str | None = None
) -> str:
    """The report as one self-contained HTML page (plotly.js embedded; opens offline).

    `run`: the events the analysis was made from; with them the page draws each rank's streams and
    threads in the slowest step and each finding's step (`step_timeline`; `step_regex` as analysed).

    The footer states the page's own size: plotly.js packed (1.8 MB, `bundle`) and the figures packed.
    """
    packed, unpacked = plotly_js()
    drawn = timelines(run, analysis, step_regex=step_regex) if run is not None else []
    page = (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{_CSS}</style></head><body><main>"
        '<p id="td-unpack" class="note" hidden>This browser cannot unpack the charts (DecompressionStream: '
        "Chrome/Edge 80, Firefox 113, Safari 16.4 or later); the tables below are complete.</p>"
        + _header(analysis, title)
        + _body(analysis, drawn, run is not None)
        + f"<footer>Report size {_SIZE_MARK} (plotly.js {_size(len(packed))} of it: its {_size(unpacked)} "
        f"gzip-compressed, unpacked by the browser; the page needs no network) · tracediag "
        f"{esc(version('tracediag'))}</footer></main>" + loader() + "</body></html>"
    )
    size = len(page.encode())
    for _ in range(2):  # the size line's own length changes the size by a few bytes at most
        size = len(page.replace(_SIZE_MARK, _size(size)).encode())
    return page.replace(_SIZE_MARK, _size(size))
