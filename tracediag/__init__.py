"""tracediag: where a multi-GPU training run waits, what it should achieve, and how to split it.

Python API (see docs/api.md)::

    run = tracediag.load(["run/rank0.json.gz", "run/rank1.json.gz"])
    analysis = tracediag.analyze(run)            # findings, per-step table, matched collectives
    prediction = tracediag.load_prediction("plan.json")
    result = tracediag.check(analysis, prediction, run=run)
"""

from tracediag.analysis import Analysis, Cause, Finding
from tracediag.analyzing import analyze
from tracediag.checking import Check, check
from tracediag.errors import MixedRunError, NoStepsError, RankError, SpecError, TracediagError, TraceError
from tracediag.model.plan import plan
from tracediag.model.predict import load_prediction, predict
from tracediag.run import Run, RunMeta, load

__all__ = [
    "Analysis",
    "Cause",
    "Check",
    "Finding",
    "MixedRunError",
    "NoStepsError",
    "RankError",
    "Run",
    "RunMeta",
    "SpecError",
    "TraceError",
    "TracediagError",
    "analyze",
    "check",
    "load",
    "load_prediction",
    "plan",
    "predict",
]
