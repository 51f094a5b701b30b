"""The result types in a notebook (issue 30, item 4): a short ``repr`` and ``_repr_html_`` built from the
HTML report's own cards and tables, static (no script, nothing fetched), every trace string escaped; and a
real notebook executed by nbclient on this interpreter shows each of them."""

from __future__ import annotations

import json
import sys

import pytest
from _reports import SCRIPT, analysis_with_check, hostile_copy, prediction
from conftest import KINETO, ROOT, RUNS

import tracediag
from tracediag.compare import compare
from tracediag.model.specs import Split
from tracediag.report.figures import esc
from tracediag.report.html import _finding
from tracediag.report.notebook import scoped_css

STRAGGLER = RUNS / "straggler_persistent"
HEALTHY = RUNS / "healthy_ddp"
A100 = [KINETO / "hta_a100_nccl_rank0.json.gz", KINETO / "hta_a100_nccl_rank1.json.gz"]
KERNEL = (
    "void permute_pooled_embs_kernel<float>(float const*, long const*, long const*, long const*, float*, long, "
    "long, long)"
)
"""A kernel of the real A100 trace whose name is markup-like (``<float>``, ``*``)."""
SHORT = 300
"""Characters a plain ``repr`` keeps below."""


@pytest.fixture(scope="module")
def straggler() -> tracediag.Analysis:
    return tracediag.analyze(tracediag.load(STRAGGLER, jobs=1))


@pytest.fixture(scope="module")
def a100() -> tracediag.Analysis:
    return tracediag.analyze(tracediag.load(A100, jobs=1))


def _static(page: str) -> None:
    """Offline HTML: no script, no chart, nothing fetched."""
    assert "<script" not in page
    assert "plotly" not in page.lower()
    assert "http" not in page
    assert "<link" not in page


def test_reprs_are_one_short_line_with_the_verdict(straggler):
    healthy = tracediag.analyze(tracediag.load(HEALTHY, jobs=1))
    result = tracediag.check(straggler, prediction(Split(dp=4)), run=tracediag.load(STRAGGLER, jobs=1))
    shown = {
        "analysis": repr(straggler),
        "finding": repr(straggler.findings[0]),
        "comparison": repr(compare(healthy, straggler)),
        "prediction": repr(prediction(Split(dp=4))),
        "check": repr(result),
    }
    assert all(len(text) < SHORT and "\n" not in text for text in shown.values()), shown
    assert shown["analysis"] == "<Analysis: 4 ranks, 8 steps, 1 finding: compute_straggler rank 2 (981.3 ms lost)>"
    assert shown["finding"].startswith(
        "<Finding compute_straggler: rank 2, steps 2–9, 981.3 ms lost, confidence 1.00: "
    )
    assert shown["comparison"].startswith("<Comparison: the median step changed +157.8 ms (+163.6%)")
    assert shown["prediction"].startswith("<Prediction: tiny on 4 x a100-80gb, tp=1 pp=1 dp=4: step ")
    assert shown["check"].startswith("<Check: tiny on 4 x a100-80gb: Exposed DP communication is ")
    assert repr(healthy) == "<Analysis: 4 ranks, 8 steps, 1 finding: healthy ranks 0–3 (0.0 ms lost)>"


def test_a_finding_shows_the_reports_own_card(straggler):
    finding = straggler.findings[0]
    page = finding._repr_html_()
    assert _finding(finding) in page
    assert page.startswith('<div class="tracediag"><style>')
    assert 'class="badge">compute_straggler</span>rank 2 computes 2.3x' in page
    _static(page)


def test_an_analysis_shows_its_cards_and_what_if_table(straggler):
    page = straggler._repr_html_()
    assert all(_finding(f) in page for f in straggler.findings)
    assert "4 ranks (world size 4), 8 steps (2..9), 0 partial rank-steps left out" in page
    rows = straggler.whatif.steps
    assert len(rows) == 8
    assert all(f"<tr><td>{r.step}</td>" in page for r in rows)
    _static(page)


def test_trace_names_are_escaped(a100):
    """A real kernel name of the A100 trace, in the analysis' kernel table and a comparison's kernel rows."""
    assert KERNEL in a100.kernels["name"].to_list()
    for page in (a100._repr_html_(), compare(tracediag.analyze(tracediag.load(STRAGGLER, jobs=1)), a100)._repr_html_()):
        assert f'title="{esc(KERNEL)}"' in page
        assert "permute_pooled_embs_kernel&lt;float&gt;" in page
        assert "permute_pooled_embs_kernel<float>" not in page
        _static(page)


def test_a_check_escapes_the_process_group_name(tmp_path):
    """The group's name of a real run, replaced by markup, reaches the check's bus-bandwidth rows."""
    hostile_copy(STRAGGLER, tmp_path / "run")
    result = analysis_with_check(tmp_path / "run", Split(dp=4)).check
    page = result._repr_html_()
    assert esc(SCRIPT) in page
    assert SCRIPT not in page
    assert "<th>achieved GB/s</th>" in page
    _static(page)


def test_the_style_applies_to_the_fragment_only():
    css = scoped_css("body{color:red}table,th{margin:0}@media (max-width:9px){.a{b:c}}.f h3{x:y}")
    assert css == ".tracediag{color:red}.tracediag table,.tracediag th{margin:0}.tracediag .f h3{x:y}"


def _cell(source: str) -> dict:
    import nbformat

    return nbformat.v4.new_code_cell(source)


def test_a_notebook_shows_each_result_type(tmp_path, monkeypatch):
    """Executed by nbclient on a kernel of this interpreter: each result type's output carries the report's
    HTML with its verdict and ranks, and a short plain text."""
    nbclient = pytest.importorskip("nbclient", reason="no nbclient: pip install -e '.[notebook]'")
    nbformat = pytest.importorskip("nbformat", reason="no nbformat: pip install -e '.[notebook]'")
    pytest.importorskip("ipykernel", reason="no ipykernel: pip install -e '.[notebook]'")
    spec = tmp_path / "kernels" / "tracediag-test"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "this Python", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    setup = (
        "import dataclasses\nimport tracediag\nfrom tracediag.compare import compare\n"
        "from tracediag.model.specs import Split, Training, resolve_device, resolve_model\n"
        "from tracediag.model.stack import resolve_engine\n"
        f"run = tracediag.load({str(STRAGGLER.relative_to(ROOT))!r}, jobs=1)\n"
        "analysis = tracediag.analyze(run)\n"
        f"healthy = tracediag.analyze(tracediag.load({str(HEALTHY.relative_to(ROOT))!r}, jobs=1))\n"
        "prediction = tracediag.predict(resolve_model('tiny'), resolve_device('a100-80gb'), Split(dp=4),\n"
        "    Training(seq_len=512, global_batch=16), resolve_engine('megatron-core'), gpus=4)\n"
        "result = tracediag.check(analysis, prediction, run=run)"
    )
    shown = {
        "analysis": ["compute_straggler", "rank 2 computes", "4 ranks (world size 4)"],
        "analysis.findings[0]": ["compute_straggler", "rank 2 · steps 2–9"],
        "compare(healthy, analysis)": ["the median step changed +157.8 ms", "<h2>Breakdown, ms per step</h2>"],
        "prediction": ["tiny on 4 x a100-80gb: tp=1 pp=1 dp=4", "memory per device"],
        "result": ["Exposed DP communication is", "<th>component</th><th>observed</th>"],
        "dataclasses.replace(analysis, check=result)": ["compute_straggler", "Observed against predicted"],
    }
    cells = [_cell(setup), *(_cell(name) for name in shown), _cell("import sys\nsys.executable")]
    nb = nbformat.v4.new_notebook(cells=cells)
    nbclient.NotebookClient(
        nb, kernel_name="tracediag-test", timeout=60, resources={"metadata": {"path": str(ROOT)}}
    ).execute()
    assert nb.cells[-1].outputs[0].data["text/plain"] == repr(sys.executable)
    for cell, (name, expected) in zip(nb.cells[1:], shown.items()):
        (out,) = [o for o in cell.outputs if o.output_type == "execute_result"]
        page, text = out.data["text/html"], out.data["text/plain"]
        assert all(e in page for e in expected), (name, [e for e in expected if e not in page])
        _static(page)
        assert text.startswith("<"), (name, text)
        assert len(text) < SHORT, (name, text)
    assert nb.cells[1].outputs[0].data["text/plain"] == (
        "<Analysis: 4 ranks, 8 steps, 1 finding: compute_straggler rank 2 (981.3 ms lost)>"
    )
