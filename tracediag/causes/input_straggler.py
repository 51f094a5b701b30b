"""input_straggler: the rank everyone waits for is late because it loads data longer than its peers.

Detector: `detect.lateness` (`causes.late`): data loading fills the windows before its late
arrivals. What-if: its data loading removed in its late steps (`whatif.causes.no_input`).
"""

from __future__ import annotations

from tracediag.analysis import Cause, Finding
from tracediag.causes import late
from tracediag.causes.host_straggler import ranks_of
from tracediag.causes.spec import CauseSpec, Context
from tracediag.detect.facts import Facts
from tracediag.whatif import causes
from tracediag.whatif.graph import Graph
from tracediag.whatif.price import Pricing


def _detect(ctx: Context) -> list[Finding]:
    return late.of(Cause.INPUT_STRAGGLER, ctx)


def _edit(f: Finding, facts: Facts, graph: Graph) -> causes.Edit:
    return causes.no_input(graph, f.ranks, f.steps)


def _removed(f: Finding, facts: Facts, graph: Graph) -> str:
    return f"without {ranks_of(f.ranks)} data loading in those steps"


def _outliers(f: Finding) -> tuple[int, ...]:
    return f.ranks


SPEC = CauseSpec(
    cause=Cause.INPUT_STRAGGLER,
    detect=_detect,
    pricing=Pricing(edit=_edit, removed=_removed),
    quiet="",  # host_straggler's phrase covers both
    outliers=_outliers,
    blames_ranks=True,
)
