"""Issue 5: the self-contained HTML report: hostile names stay text, sections, aggregation at 1,024 ranks, CLI."""

from __future__ import annotations

import html
import re
from typing import TYPE_CHECKING

import orjson
import pytest
from _reports import IMG, RUNS, SCRIPT, analysis_with_check, hostile_copy, replicated, traces
from click.testing import CliRunner

from tracediag.cli import cli
from tracediag.model.specs import Split
from tracediag.report import figures
from tracediag.report.bundle import DATA_TYPE, plotly_js, unpack
from tracediag.report.html import render_html

if TYPE_CHECKING:
    from tracediag.analysis import Analysis


def _outside_plotly_js(page: str) -> str:
    """The page without the packed plotly.js bundle, with each figure's packed JSON unpacked in its place."""
    packed, _ = plotly_js()
    assert page.count(packed) == 1
    rest = page.replace(packed, "")
    return re.sub(
        rf'(<script type="{DATA_TYPE}" class="td-figure" data-for="[^"]+">)([^<]*)(</script>)',
        lambda m: m.group(1) + unpack(m.group(2)).decode() + m.group(3),
        rest,
    )


def test_markup_in_trace_names_appears_as_text(tmp_path):
    """Kernel, annotation and process-group names from a real trace cannot inject markup or script."""
    folder = tmp_path / IMG
    hostile_copy(RUNS / "straggler_persistent", folder)
    analysis = analysis_with_check(folder, Split(dp=4))
    assert SCRIPT in analysis.collectives["group"].to_list()  # the names did reach the analysis
    assert any(IMG in g for li in analysis.check.links for g in li.groups)
    page = render_html(analysis)
    rest = _outside_plotly_js(page)
    for raw in (SCRIPT, IMG, "<img", "alert(1)</script>"):
        assert raw not in rest
    for shown in (html.escape(SCRIPT), html.escape(IMG)):
        assert shown in rest
    # every <script> element is ours: the bundle and one per figure
    assert rest.count("<script") == 2 + rest.count('class="td-figure"')  # plotly.js, the loader, the figures


@pytest.fixture(scope="module")
def pipeline_analysis() -> Analysis:
    return analysis_with_check(traces(RUNS / "pipeline_gpipe_m8"), Split(pp=4))


def test_report_has_every_section_in_order_and_states_its_size(pipeline_analysis):
    page = render_html(pipeline_analysis)
    order = ["findings", "heatmaps", "breakdown", "timeline", "pipeline", "check"]
    positions = [page.index(f'<section id="{s}">') for s in order]
    assert positions == sorted(positions)
    for fig in ("step-time", "compute", "breakdown", "timeline", "pipeline", "check"):
        assert f'id="fig-{fig}"' in page
    size = re.search(r"Report size ([\d.]+) MB", page)
    assert size
    assert abs(float(size.group(1)) - len(page.encode()) / 1e6) < 0.051
    rest = _outside_plotly_js(page)
    assert "cdn.plot.ly" not in rest
    assert "http" not in rest


def test_1024_ranks_are_aggregated(pipeline_analysis):
    big = replicated(pipeline_analysis, 1024, 100)
    heat = figures.heatmap(big.steps, "dur_ns", "step time").figure
    assert len(heat.data[0].z) == figures.MAX_ROWS
    assert len(heat.data[0].z[0]) == 100
    bars = figures.breakdown(big.steps).figure
    assert all(len(t.x) == figures.MAX_BARS for t in bars.data)
    timeline = figures.timeline(big)
    rank_rows = {y for t in timeline.figure.data if t.type == "bar" for y in t.y if y.startswith("rank ")}
    assert len(rank_rows) <= figures.MAX_TIMELINE_RANKS
    assert "of 1,024 ranks" in timeline.caption
    page = render_html(big)
    assert len(page.encode()) <= 2e6  # 1.9 MB: plotly.js packed, the figures bounded


def test_report_command_renders_a_saved_analysis(pipeline_analysis, tmp_path):
    saved = tmp_path / "analysis.json"
    saved.write_bytes(orjson.dumps(pipeline_analysis.to_dict()))
    out = tmp_path / "report.html"
    result = CliRunner().invoke(cli, ["report", str(saved), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "MB, self-contained" in result.stderr
    assert 'id="fig-pipeline"' in out.read_text()
    assert 'id="fig-check"' in out.read_text()
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    result = CliRunner().invoke(cli, ["report", str(bad), "-o", str(out)])
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: ")
    assert "Traceback" not in result.output


def test_analyze_with_model_options_adds_the_check_to_every_output(tmp_path):
    paths = [str(p) for p in traces(RUNS / "healthy_ddp")]
    model = ["--model", "tiny", "--gpu", "a100-80gb", "--seq-len", "512", "--global-batch", "16"]
    runner = CliRunner()
    report = tmp_path / "r.html"
    text = runner.invoke(cli, ["analyze", *paths, "-j", "1", *model, "--html", str(report)])
    assert text.exit_code == 0, text.output
    assert "observed vs predicted (tiny on 4 x a100-80gb" in text.stdout
    assert 'id="fig-check"' in report.read_text()
    plan = tmp_path / "plan.json"
    runner.invoke(cli, ["predict", *model, "--gpus", "4", "-o", str(plan)])
    data = runner.invoke(cli, ["analyze", *paths, "-j", "1", "--plan", str(plan), "--format", "json"])
    assert orjson.loads(data.stdout)["check"]["plan"]["gpus"] == 4
    missing = runner.invoke(cli, ["analyze", *paths, "-j", "1", "--model", "tiny"])
    assert missing.exit_code == 2
    assert "needs --gpu --seq-len --global-batch" in missing.stderr


def test_plotly_js_is_packed_once_and_a_report_with_its_timelines_stays_under_2_mb():
    """Issue 30: 4.9 MB a report, 4.8 of it plotly.js. Packed (gzip, base 85) it is the same bytes at
    under 40% of the size, with no `<` to end its script element; the slow-node report with both
    per-stream timelines stays under 2 MB."""
    from plotly.offline import get_plotlyjs

    import tracediag

    packed, size = plotly_js()
    assert "<" not in packed
    assert unpack(packed) == get_plotlyjs().encode()
    assert len(packed) < 0.4 * size
    run = tracediag.load(RUNS / "slow_node_6")
    page = render_html(tracediag.analyze(run), run=run)
    assert page.count(packed) == 1
    assert 'id="fig-finding-1-streams"' in page
    assert len(page.encode()) <= 2_000_000
