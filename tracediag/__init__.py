"""tracediag: where a multi-GPU training run waits, what it should achieve, and how to split it.

Python API (see docs/api.md)::

    run = tracediag.load(["run/rank0.json.gz", "run/rank1.json.gz"])
    analysis = tracediag.analyze(run)            # findings, per-step table, matched collectives
    prediction = tracediag.load_prediction("plan.json")
    result = tracediag.check(analysis, prediction, run=run)
    for window in tracediag.watch("run/"):      # a running job, one profiler window at a time
        print(window.index, window.step_seconds, window.changes)
    report = tracediag.hang("dumps/")            # Flight Recorder dumps: who broke the collective order
"""

from importlib import import_module
from typing import TYPE_CHECKING

import tracediag.ingest.workers  # noqa: F401 - the fork hook, from import on
from tracediag import display as _display


def _render_html(obj: object) -> str:
    """A result type as notebook HTML (`tracediag.report.notebook`), the report imported on first display."""
    from tracediag.report.notebook import render_notebook_html

    return render_notebook_html(obj)


_display.install(_render_html)

if TYPE_CHECKING:
    from tracediag.analysis import Analysis, Cause, Finding
    from tracediag.check_result import Check
    from tracediag.desync import HangReport, hang
    from tracediag.errors import MixedRunError, NoStepsError, RankError, SpecError, TracediagError, TraceError
    from tracediag.model.plan import plan
    from tracediag.model.predict import load_prediction, predict
    from tracediag.observed_vs_predicted import check
    from tracediag.reduce import analyze
    from tracediag.run import Run, RunMeta, load
    from tracediag.watching import Window, watch

_HOME = {
    "Analysis": "analysis",
    "Cause": "analysis",
    "Finding": "analysis",
    "analyze": "reduce",
    "Check": "check_result",
    "check": "observed_vs_predicted",
    "MixedRunError": "errors",
    "NoStepsError": "errors",
    "RankError": "errors",
    "SpecError": "errors",
    "TracediagError": "errors",
    "TraceError": "errors",
    "HangReport": "desync",
    "hang": "desync",
    "plan": "model.plan",
    "load_prediction": "model.predict",
    "predict": "model.predict",
    "Run": "run",
    "RunMeta": "run",
    "load": "run",
    "Window": "watching",
    "watch": "watching",
}
"""Where each public name lives. Imported on first use, so a process that needs only part of the
package (a reading worker, an executor task) does not pay for the rest (the model, pyarrow, numpy)."""


def __getattr__(name: str) -> object:
    if name not in _HOME:
        msg = f"module 'tracediag' has no attribute {name!r}"
        raise AttributeError(msg)
    value = getattr(import_module(f"tracediag.{_HOME[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOME])


__all__ = [
    "Analysis",
    "Cause",
    "Check",
    "Finding",
    "HangReport",
    "MixedRunError",
    "NoStepsError",
    "RankError",
    "Run",
    "RunMeta",
    "SpecError",
    "TraceError",
    "TracediagError",
    "Window",
    "analyze",
    "check",
    "hang",
    "load",
    "load_prediction",
    "plan",
    "predict",
    "watch",
]
