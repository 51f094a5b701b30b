"""The ``healthy`` finding: no registered cause fired. It says which measures stayed below their
thresholds and, when one came near, which (each cause's `CauseSpec.quiet` and `CauseSpec.near`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracediag.analysis import Cause, Finding
from tracediag.detect import host_bound, straggler
from tracediag.units import NS_PER_MS, count

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tracediag.causes.spec import CauseSpec, Context


def _and(parts: Sequence[str]) -> str:
    return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"


def _quiet(specs: Sequence[CauseSpec]) -> str:
    """The clause "no rank computes ..., exposed communication, ... and device idle stay below their thresholds"."""
    phrases = [s.quiet for s in specs if s.quiet]
    if len(phrases) == 1:
        return f"{phrases[0]} stays below its threshold"
    return f"{phrases[0]}, {_and(phrases[1:])} stay below their thresholds"


def _closest(ctx: Context, specs: Sequence[CauseSpec]) -> str:
    """The cause whose run-level measure came nearest its threshold, as a clause (or "")."""
    near = [s.near(ctx) for s in specs if s.near is not None]
    if not near:
        return ""
    score, text = max(near, key=lambda x: x[0] if x[0] == x[0] else -1)
    return f"; closest: {text}" if score >= ctx.thresholds.healthy_near else ""


def healthy(ctx: Context, specs: Sequence[CauseSpec]) -> Finding:
    """The single finding when none of `specs` fired."""
    s = ctx.facts.steps
    ranks = tuple(sorted(s["rank"].unique().to_list())) if s.height else ()
    evidence = {}
    if s.height:
        ratio = ctx.memo(straggler.rank_step_ratios)["ratio"]
        evidence = {
            "step_ms_median": round(float(s["dur_ns"].median()) / NS_PER_MS, 3),
            "exposed_comm_share_median": round(float((s["exposed_comm_ns"] / s["dur_ns"].clip(1)).median()), 3),
            "compute_ratio_max": round(float(ratio.max()), 3),
            "input_share_median": round(float((s["input_ns"] / s["dur_ns"].clip(1)).median()), 3),
            "idle_share_median": round(host_bound.idle_share(s) or 0.0, 3),
        }
    summary = (
        f"no cause found over {count(s['step'].n_unique() if s.height else 0, 'step')} on {count(len(ranks), 'rank')}: "
        + _quiet(specs)
        + (_closest(ctx, specs) if s.height else "")
    )
    return Finding(
        cause=Cause.HEALTHY,
        ranks=ranks,
        steps=(),
        time_lost_ns=0,
        confidence=1.0,
        summary=summary,
        evidence=evidence,
    )
