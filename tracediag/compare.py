"""`compare(base, new)`: what changed between two analysed runs (a CI regression gate's numbers).

Three views of the same two `Analysis` objects:

- *breakdown*: per run, the per-step mean over ranks of each breakdown part (step, compute, exposed
  communication, copy, the three kinds of idle, waiting for peers, data loading) in the median step
  (the two middle steps averaged when their number is even): the parts add up to the median step,
  in each run and in new − base;
- *kernels*: per kernel/operator name, its wall time per step and rank (the union of its spans over
  the rank's streams/threads, summed over ranks and divided by the run's steps and ranks: the unit of
  the breakdown, so a kernel's change is part of the step's), from each run's kernel view; added
  (only in new), removed (only in base), slower or faster (by at least `KERNEL_MIN_CHANGE` of its base
  time and `KERNEL_MIN_NS` per step). A name missing from a run
  whose list was cut at `TOP_STORED` per rank (by summed time) counts as added/removed only when its
  summed time passes that run's smallest listed kernel's (else it may just rank lower there);
- *causes*: the findings of each run, with time lost.

``step_time_delta_ns`` is the change of the median step; ``headline`` says in one sentence what
changed most.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from tracediag import display
from tracediag.analysis import Analysis, Cause
from tracediag.api_types import checked
from tracediag.derive.kernels import TOP_STORED
from tracediag.kernel_names import short_names
from tracediag.units import NS_PER_MS, format_ms

PARTS = (
    ("dur_ns", "step"),
    ("compute_ns", "compute"),
    ("exposed_comm_ns", "exposed communication"),
    ("copy_ns", "copies"),
    ("idle_host_ns", "idle waiting on the host"),
    ("idle_kernel_ns", "idle between kernels"),
    ("idle_other_ns", "idle, other"),
    ("wait_ns", "waiting for peers"),
    ("input_ns", "data loading"),
)
"""Breakdown columns compared, with their names in sentences."""
KERNEL_MIN_CHANGE = 0.1
KERNEL_MIN_NS = 10_000
"""A kernel is slower/faster when its time per step moves by ≥ 10% and ≥ 10 µs."""


@dataclass(frozen=True, repr=False)
class Comparison:
    """Two runs side by side; `to_dict` is the `compare --format json` document."""

    base: dict[str, Any]
    new: dict[str, Any]
    step_time_delta_ns: int
    step_time_delta_pct: float
    changes: list[dict[str, Any]] = field(default_factory=list)
    headline: str = ""

    def __repr__(self) -> str:
        return f"<Comparison: {display.cut(self.headline) or 'no headline'}>"

    def _repr_html_(self) -> str | None:
        """The compare page's tables (`tracediag.report.notebook`)."""
        return display.html(self)

    def to_dict(self) -> dict[str, Any]:
        """The comparison's JSON form (`compare --format json`)."""
        return {
            "base": self.base,
            "new": self.new,
            "step_time_delta_ns": self.step_time_delta_ns,
            "step_time_delta_pct": round(self.step_time_delta_pct, 4),
            "headline": self.headline,
            "changes": self.changes,
        }


def _breakdown(a: Analysis) -> dict[str, float]:
    # an analysis saved by an older tracediag lacks the newer columns (null): leave them out
    cols = [c for c, _ in PARTS if c in a.steps.columns and a.steps[c].null_count() < a.steps.height]
    if not a.steps.height:
        return dict.fromkeys(cols, 0.0)
    # the parts of the median step (the two middle steps averaged when even): its step time is the
    # median, and its parts add up to it, as a median per part would not
    per_step = a.steps.group_by("step").agg(pl.col(cols).mean()).sort("dur_ns", "step")
    middle = per_step.slice((per_step.height - 1) // 2, 2 - per_step.height % 2)
    return {c: float(middle[c].mean()) for c in cols}


def _kernels(a: Analysis) -> tuple[dict[str, dict[str, Any]], bool, float]:
    """Name -> {category, ns_per_step (wall), summed_ns_per_step}, per step and rank; whether some
    rank's list was cut; the smallest listed summed time per step and rank (the lists are cut by it).

    An analysis saved before 1.7 has no ``wall_ns``: its summed time stands in."""
    if a.kernels is None or not a.kernels.height:
        return {}, False, 0.0
    df = a.kernels.with_columns(pl.col("wall_ns").fill_null(pl.col("total_ns")))
    per_rank_step = max(len(a.step_numbers), 1) * max(a.steps["rank"].n_unique(), 1)
    cut = bool((df.group_by("rank").len()["len"] >= TOP_STORED).any())
    per = df.group_by("name").agg(
        pl.col("category").first(), pl.col("wall_ns").sum() / per_rank_step, pl.col("total_ns").sum() / per_rank_step
    )
    table = {n: {"category": c, "ns_per_step": w, "summed_ns_per_step": t} for n, c, w, t in per.iter_rows()}
    floor = float(df["total_ns"].min()) / per_rank_step
    return table, cut, floor


def _summary(a: Analysis, parts: dict[str, float]) -> dict[str, Any]:
    return {
        "ranks": list(a.ranks),
        "world_size": a.world_size,
        "steps": a.step_numbers,
        "breakdown_ns_per_step": {c: round(v) for c, v in parts.items()},
        "causes": [
            {"cause": f.cause, "ranks": list(f.ranks), "time_lost_ns": int(f.time_lost_ns), "summary": f.summary}
            for f in a.findings
        ],
    }


def _kernel_changes(base: Analysis, new: Analysis) -> list[dict[str, Any]]:
    kb, cut_b, floor_b = _kernels(base)
    kn, cut_n, floor_n = _kernels(new)
    if not kb or not kn:  # a side without a kernel view (an older saved analysis): nothing to compare
        return []
    out = []
    for name in sorted(set(kb) | set(kn)):
        b, n = kb.get(name), kn.get(name)
        if b is None:
            if cut_b and n["summed_ns_per_step"] <= floor_b:
                continue
            status, before, after = "added", 0.0, n["ns_per_step"]
        elif n is None:
            if cut_n and b["summed_ns_per_step"] <= floor_n:
                continue
            status, before, after = "removed", b["ns_per_step"], 0.0
        else:
            before, after = b["ns_per_step"], n["ns_per_step"]
            delta = after - before
            if abs(delta) < KERNEL_MIN_NS or abs(delta) < KERNEL_MIN_CHANGE * before:
                continue
            status = "slower" if delta > 0 else "faster"
        out.append(
            {
                "kind": "kernel",
                "status": status,
                "name": name,
                "category": (n or b)["category"],
                "base_ns_per_step": round(before),
                "new_ns_per_step": round(after),
                "delta_ns": round(after - before),
                "summed_delta_ns": round(
                    (n or {}).get("summed_ns_per_step", 0.0) - (b or {}).get("summed_ns_per_step", 0.0)
                ),
            }
        )
    return sorted(out, key=lambda c: -abs(c["delta_ns"]))


@checked
def compare(base: Analysis, new: Analysis) -> Comparison:
    """What changed from `base` to `new` (see the module docstring)."""
    pb, pn = _breakdown(base), _breakdown(new)
    changes: list[dict[str, Any]] = []
    for col, label in PARTS:
        if col not in pb or col not in pn:
            continue
        delta = pn[col] - pb[col]
        changes.append(
            {
                "kind": "breakdown",
                "status": "slower" if delta > 0 else "faster" if delta < 0 else "same",
                "name": label,
                "column": col,
                "base_ns_per_step": round(pb[col]),
                "new_ns_per_step": round(pn[col]),
                "delta_ns": round(delta),
                "delta_pct": round(delta / pb[col], 4) if pb[col] else None,
            }
        )
    kernels = _kernel_changes(base, new)
    changes += kernels
    causes_b = {f.cause for f in base.findings}
    causes_n = {f.cause for f in new.findings}
    for cause in sorted(causes_n - causes_b):
        changes.append({"kind": "cause", "status": "added", "name": cause})
    for cause in sorted(causes_b - causes_n):
        changes.append({"kind": "cause", "status": "removed", "name": cause})
    delta = pn.get("dur_ns", 0.0) - pb.get("dur_ns", 0.0)
    pct = delta / pb["dur_ns"] if pb.get("dur_ns") else 0.0
    parts = [c for c in changes if c["kind"] == "breakdown" and c["column"] not in ("dur_ns", "wait_ns")]
    top_part = max(parts, key=lambda c: abs(c["delta_ns"]), default=None)
    headline = f"the median step changed {format_ms(delta / NS_PER_MS, sign=True)} ({pct:+.1%})"
    if top_part and top_part["delta_ns"]:
        moved = format_ms(top_part["delta_ns"] / NS_PER_MS, sign=True)
        headline += f"; the part that changed most is {top_part['name']} ({moved} per step)"
    if kernels:
        k = kernels[0]
        moved = format_ms(k["delta_ns"] / NS_PER_MS, sign=True)
        name = short_names(c["name"] for c in kernels)[k["name"]]
        headline += f"; the kernel that changed most is {name} ({k['status']}, {moved} per step and rank)"
    new_causes = sorted(causes_n - causes_b - {Cause.HEALTHY})
    if new_causes:
        headline += f"; new cause: {', '.join(new_causes)}"
    return Comparison(
        base=_summary(base, pb),
        new=_summary(new, pn),
        step_time_delta_ns=round(delta),
        step_time_delta_pct=pct,
        changes=changes,
        headline=headline,
    )
