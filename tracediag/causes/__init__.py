"""The causes: each registered once, with its detector, its what-if and its report text.

One module per cause (``causes/<cause>.py``) defines ``SPEC``, a `CauseSpec`: the detector (a
`tracediag.detect` module's rule), its what-if pricing (an edit from `tracediag.whatif.causes` and the
clause saying what it removes), and the text the reports use. `REGISTRY` lists them in detection
order; everything else addresses a cause by its `analysis.Cause` member through `spec_of`, so no
code tests a cause's name.

Layering (imports run one way, downwards): ``analysis`` (the `Cause` enum, `Finding`) ← ``detect/``
(rules over `Facts`; never imports whatif/ or causes/) and ``whatif/`` (replay and edits; never
imports causes/) ← ``causes/`` (binds them) ← ``reduce`` (the façade) and the reports.

Adding a cause: a `Cause` member in `analysis.py`, a detector in `detect/`, an edit in
`whatif/causes.py` (or reuse one), a module here with its ``SPEC``, one line in `REGISTRY`, and its
section in docs/analyze.md (tests/test_causes_registry.py checks the registry covers every member).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING

from tracediag.analysis import Cause, Finding, WhatIf
from tracediag.causes import (
    comm_bound,
    compute_straggler,
    host_bound,
    host_straggler,
    input_bound,
    input_straggler,
    pipeline_bubble,
    sequence_imbalance,
    slow_link,
    stage_imbalance,
)
from tracediag.causes.healthy import healthy
from tracediag.causes.spec import CauseSpec, Context
from tracediag.detect.thresholds import Thresholds
from tracediag.whatif import price as _price

if TYPE_CHECKING:
    from collections.abc import Mapping

    from tracediag.detect.facts import Facts
    from tracediag.whatif.graph import Graph

__all__ = ["REGISTRY", "CauseSpec", "Context", "detect_all", "price", "spec_of"]

REGISTRY: tuple[CauseSpec, ...] = (
    compute_straggler.SPEC,  # first: comm_bound and sequence_imbalance read its outliers
    host_straggler.SPEC,  # the lateness pass's other findings (`causes.late`)
    input_straggler.SPEC,
    stage_imbalance.SPEC,  # absorbs the heavy stage's straggler finding and its pipeline's bubble
    slow_link.SPEC,  # absorbs the lateness its late transfers cause; before the job-wide causes
    sequence_imbalance.SPEC,  # before comm_bound, which reads its outliers
    comm_bound.SPEC,
    pipeline_bubble.SPEC,
    input_bound.SPEC,
    host_bound.SPEC,  # after every cause that explains idle time
    # a new cause: its SPEC here, after the causes whose findings it reads
)
"""Every cause, in detection order: a detector sees the findings of those before it."""

SPECS: Mapping[Cause, CauseSpec] = MappingProxyType({s.cause: s for s in REGISTRY})


def spec_of(cause: Cause | str) -> CauseSpec:
    """The registered spec of `cause` (KeyError for ``healthy``, which is no cause)."""
    return SPECS[Cause(cause)]


def detect_all(facts: Facts, *, thresholds: Thresholds | None = None) -> tuple[Finding, ...]:
    """All findings, most time lost first; a single ``healthy`` finding when no cause is found."""
    ctx = Context(facts, thresholds or Thresholds())
    for spec in REGISTRY:
        for f in spec.detect(ctx):
            if any(s.absorbs(g, f) for s, g in ctx.found):
                continue  # the effect of a cause already found
            ctx.found[:] = [(s, g) for s, g in ctx.found if not spec.absorbs(f, g)]
            ctx.found.append((spec, f))
    if not ctx.found:
        return (healthy(ctx, REGISTRY),)
    return tuple(sorted((f for _, f in ctx.found), key=lambda f: (-f.time_lost_ns, f.cause)))


def price(
    findings: tuple[Finding, ...], facts: Facts, graph: Graph, *, thresholds: Thresholds | None = None
) -> tuple[tuple[Finding, ...], WhatIf]:
    """`whatif.price.price` with every registered cause's pricing."""
    pricing = {s.cause: s.pricing for s in REGISTRY if s.pricing is not None}
    return _price.price(findings, facts, graph, pricing, thresholds=thresholds)


def blamed_ranks(findings: tuple[Finding, ...]) -> set[int]:
    """Ranks the findings blame (`CauseSpec.blames_ranks`); job-wide causes blame none."""
    return {r for f in findings if f.cause in SPECS and SPECS[f.cause].blames_ranks for r in f.ranks}
