"""The result types in a notebook: `render_notebook_html(obj)` is what the ``_repr_html_`` of `Analysis`,
`Finding`, `Check`, `Comparison` and `Prediction` returns (installed through `tracediag.display`).

Static HTML built from the report's own pieces: the finding cards, what-if table and check tables of the
HTML report (`report.html`), its kernel tables (`report.kernels_html`, folded), the compare page's tables
(`report.compare_report`), the `predict` text (`report.model_text`). It is styled by the report's style
sheet scoped to the fragment, so it does not restyle the notebook around it; no script and no chart (a
notebook output has no plotly.js unless fetched), nothing fetched, every string from a trace escaped by
those pieces.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from tracediag.analysis import Analysis, Finding
from tracediag.api_types import checked
from tracediag.check_result import Check
from tracediag.compare import Comparison
from tracediag.model.predict import Prediction
from tracediag.report.compare_report import compare_tables
from tracediag.report.figures import esc
from tracediag.report.html import _CSS, _check, _finding, _findings, _whatif
from tracediag.report.kernels_html import kernels_section
from tracediag.report.model_text import render_prediction
from tracediag.report.text import run_line
from tracediag.units import count

if TYPE_CHECKING:
    from collections.abc import Callable

SCOPE = "tracediag"
"""The class of the fragment's outer element; every rule of its style sheet applies under it only."""
FOLDED_STEPS = 20
"""Past this many steps the what-if table is folded (``<details>``), so a long run's output stays short."""


def scoped_css(css: str, scope: str = SCOPE) -> str:
    """`css` applied under ``.scope`` only: each selector prefixed, ``body`` rules made the scope's own,
    ``@media`` blocks left out."""
    flat = re.sub(r"@media[^{]*\{(?:[^{}]*\{[^{}]*\})*[^{}]*\}", "", css)
    rules = []
    for selectors, body in re.findall(r"([^{}]+)\{([^{}]*)\}", flat):
        names = [s.strip() for s in selectors.split(",")]
        rules.append(",".join(f".{scope}" if s == "body" else f".{scope} {s}" for s in names) + f"{{{body}}}")
    return "".join(rules)


_STYLE = f"<style>{scoped_css(_CSS)}.{SCOPE}{{padding:6px 14px;border-radius:8px}}</style>"


def _analysis(a: Analysis) -> str:
    warned = f" · {count(len(a.warnings), 'warning')} (<code>.warnings</code>)" if a.warnings else ""
    whatif = _whatif(a.whatif)
    steps = len(a.whatif.steps) if a.whatif is not None else 0
    if steps > FOLDED_STEPS:
        whatif = f"<details><summary>What-if per step ({count(steps, 'step')})</summary>{whatif}</details>"
    kernels = kernels_section(a)
    if kernels:
        kernels = f"<details><summary>Top kernels and operators per rank</summary>{kernels}</details>"
    return (
        f'<p class="meta"><b>tracediag analysis</b> · {esc(run_line(a))}{warned}</p>'
        + _findings(a)
        + whatif
        + (_check(a.check, chart=False) if a.check is not None else "")
        + kernels
    )


def _prediction(p: Prediction) -> str:
    return f"<p class='meta'><b>tracediag predict</b></p><pre>{esc(render_prediction(p))}</pre>"


_RENDERERS: dict[type, Callable] = {
    Analysis: _analysis,
    Finding: _finding,
    Check: lambda c: _check(c, chart=False),
    Comparison: lambda c: "<p class='meta'><b>tracediag compare</b></p>" + compare_tables(c),
    Prediction: _prediction,
}
"""Each result type's HTML, the report's pieces for it."""


@checked
def render_notebook_html(obj: Analysis | Finding | Check | Comparison | Prediction) -> str:
    """`obj`, a result type, as one static HTML fragment with its own scoped style."""
    (render,) = [render for kind, render in _RENDERERS.items() if isinstance(obj, kind)]
    return f'<div class="{SCOPE}">{_STYLE}{render(obj)}</div>'
