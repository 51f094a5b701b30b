"""Issue 5: the HTML report in a real browser (headless Chromium), with networking off.

The page must load with no console output at all (no errors, no failed fetches), draw every plot,
keep trace text as text in the live DOM, and produce a screenshot. Set TRACEDIAG_SCREENSHOT=path.png
to keep the screenshot for a look.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from typing import TYPE_CHECKING

import pytest
from _reports import IMG, RUNS, SCRIPT, analysis_with_check, hostile_copy, replicated, traces
from conftest import SAMPLES, needs_shared

import tracediag
from tracediag.model.specs import Split
from tracediag.report.html import render_html

if TYPE_CHECKING:
    from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium binary (Debian: apt-get install chromium; .ci/run installs it)"
)
OFFLINE = ["--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND"]
"""Networking off: every request goes to a closed port, every host name fails to resolve."""
WIDTH, HEIGHT = 1400, 3800


def _chromium(tmp_path: Path, page: Path, *action: str) -> subprocess.CompletedProcess:
    args = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=30000",  # the page unpacks plotly.js and draws after the load event
        *OFFLINE,
        *action,
        page.as_uri(),
    ]
    return subprocess.run(args, capture_output=True, text=True, timeout=90, check=False)


def _console(stderr: str) -> list[str]:
    """The page's console output (Chromium logs it as `CONSOLE` lines on stderr)."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def _write(tmp_path: Path, analysis, name: str) -> Path:
    page = tmp_path / name
    page.write_text(render_html(analysis), encoding="utf-8")
    return page


def test_report_opens_offline_draws_every_plot_and_keeps_trace_text_as_text(tmp_path):
    folder = tmp_path / "run"
    hostile_copy(RUNS / "straggler_persistent", folder)
    page = _write(tmp_path, analysis_with_check(folder, Split(dp=4)), "hostile.html")
    done = _chromium(tmp_path, page, "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    assert _console(done.stderr) == []
    dom = done.stdout
    plots = re.findall(r'<div id="fig-([a-z-]+)" class="plotly-graph-div js-plotly-plot"', dom)
    assert plots == ["step-time", "compute", "lateness", "breakdown", "timeline", "check"]
    assert dom.count('<g class="heatmaplayer') == 3
    assert dom.count("<image ") == 3
    assert dom.count('<g class="trace bars"') >= 6  # breakdown, timeline and check bars drawn
    # the hostile names are text in the page and in the plots' SVG labels, never elements
    scripts = re.findall(r"<script\b.*?</script>", dom, flags=re.DOTALL)
    # packed plotly.js, the loader, plotly.js it unpacked, one per plot: no script from a trace
    assert len(scripts) == 3 + len(plots)
    rest = re.sub(r"<script\b.*?</script>", "", dom, flags=re.DOTALL)
    assert re.search(r"<img\b", rest) is None
    assert SCRIPT not in rest
    assert IMG not in rest
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in rest
    assert "&lt;img src=x onerror=alert(1)&gt;" in rest


def test_report_screenshot_renders_the_pipeline_report(tmp_path):
    page = _write(tmp_path, analysis_with_check(traces(RUNS / "pipeline_gpipe_m8"), Split(pp=4)), "pipeline.html")
    shot = tmp_path / "report.png"
    done = _chromium(tmp_path, page, f"--window-size={WIDTH},{HEIGHT}", "--hide-scrollbars", f"--screenshot={shot}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert _console(done.stderr) == []
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png[16:24]) == (WIDTH, HEIGHT)
    assert len(png) > 100_000  # a blank page of this size compresses to a few kB
    keep = os.environ.get("TRACEDIAG_SCREENSHOT")
    if keep:
        shutil.copy(shot, keep)


DLRM = SAMPLES / "gpu-public" / "dlrm_v100_8rank"


@pytest.mark.parametrize(
    ("source", "width"),
    [
        (RUNS / "slow_node_6", 1400),
        (RUNS / "slow_node_6", 800),
        pytest.param(DLRM, 1400, marks=needs_shared(DLRM)),
    ],
    ids=["slow_node_6-1400", "slow_node_6-800", "dlrm_v100-1400"],
)
def test_the_streams_timelines_render_at_desktop_and_narrow_widths(tmp_path, source, width):
    """A report with its events (a gloo CPU run; GPU streams of the DLRM V100 traces): every plot drawn,
    the per-stream timelines with their bars, no console output; a screenshot per width
    (TRACEDIAG_SCREENSHOT_DIR keeps them)."""
    run = tracediag.load(source)
    page = tmp_path / "streams.html"
    page.write_text(render_html(tracediag.analyze(run), run=run), encoding="utf-8")
    done = _chromium(tmp_path, page, f"--window-size={width},{HEIGHT}", "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    assert _console(done.stderr) == []
    plots = re.findall(r'<div id="fig-([a-z0-9-]+)" class="plotly-graph-div js-plotly-plot"', done.stdout)
    assert plots[-2:] == ["slowest-streams", "finding-1-streams"]
    for name in plots[-2:]:
        drawn = done.stdout.split(f'<div id="fig-{name}"')[1].split("</svg>")[0]
        assert drawn.count('<g class="trace bars"') >= 3  # operators, communication, waits
        assert drawn.count('class="point"') >= 100
    shot = tmp_path / f"streams-{source.name}-{width}.png"
    done = _chromium(tmp_path, page, f"--window-size={width},{HEIGHT}", "--hide-scrollbars", f"--screenshot={shot}")
    assert done.returncode == 0, done.stderr[-2000:]
    png = shot.read_bytes()
    assert struct.unpack(">II", png[16:24]) == (width, HEIGHT)
    keep = os.environ.get("TRACEDIAG_SCREENSHOT_DIR")
    if keep:
        shutil.copy(shot, keep)


def test_the_compare_page_draws_its_delta_charts(tmp_path):
    from tracediag.compare import compare
    from tracediag.report.compare_report import render_compare_html

    paired = RUNS.parent / "paired"
    sides = [tracediag.analyze(tracediag.load(paired / "straggler_r0" / name)) for name in ("healthy", "injected")]
    page = tmp_path / "compare.html"
    page.write_text(render_compare_html(compare(*sides)), encoding="utf-8")
    done = _chromium(tmp_path, page, "--window-size=800,1600", "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    assert _console(done.stderr) == []
    plots = re.findall(r'<div id="fig-([a-z-]+)" class="plotly-graph-div js-plotly-plot"', done.stdout)
    assert plots == ["breakdown-deltas", "kernel-deltas"]
    assert done.stdout.count('<g class="trace bars"') >= 2


def test_a_1024_rank_report_draws_every_plot(tmp_path):
    """1,024 ranks x 100 steps made of the real straggler_persistent rows: the binned heat-maps, the
    breakdown and the timeline all draw, with no console output."""
    big = replicated(analysis_with_check(traces(RUNS / "straggler_persistent"), Split(dp=4)), 1024, 100)
    page = _write(tmp_path, big, "big.html")
    done = _chromium(tmp_path, page, "--window-size=1400,3000", "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    assert _console(done.stderr) == []
    plots = re.findall(r'<div id="fig-([a-z-]+)" class="plotly-graph-div js-plotly-plot"', done.stdout)
    assert plots == ["step-time", "compute", "lateness", "breakdown", "timeline", "check"]
    assert done.stdout.count('<g class="heatmaplayer') == 3
