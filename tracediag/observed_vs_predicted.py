"""Observed against predicted: what a run's trace shows next to what the model expects of its split.

`check(analysis, prediction)` compares, per step, step time, compute, exposed communication by kind
(tp, cp, ep, dp, pp), the pipeline bubble, idle time and MFU, and the achieved bus bandwidth of each
collective kind with the figure the model assumed for its link. Where the trace cannot tell a
component apart, the observed value is None and the note says why (docs/check.md).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import polars as pl

from tracediag.analysis import Analysis
from tracediag.api_types import checked
from tracediag.check_result import LABELS, Check, CheckedPlan, Component, LinkCheck
from tracediag.model.predict import Prediction
from tracediag.run import Run
from tracediag.units import MS_PER_S, NS_PER_S, format_ms

if TYPE_CHECKING:
    from tracediag.ingest.trace import ProcessGroup
    from tracediag.model.specs import Split

KINDS: tuple[str, ...] = ("tp", "cp", "ep", "dp", "pp")
"""Collective kinds, as the model names them (its `link_busbw` keys)."""
NOT_VISIBLE = "not visible in this trace"
MFU_REFUSED = "not shown: above 100%"
CLOSE = 0.10
"""A component off by less than this share of the predicted step time is not called a gap."""

_ADVICE = {
    "compute": "kernels run below the model's efficiency, or the work differs from the plan (model, batch, recompute)",
    "exposed_tp": "TP collectives are slower or less overlapped than the plan assumes",
    "exposed_cp": "the context-parallel exchange is not hidden behind attention",
    "exposed_ep": "the expert all-to-all is slower than the link allows (routing imbalance or a slow link)",
    "exposed_dp": "bucketing or overlap is off",
    "exposed_pp": "pipeline sends and receives wait longer than the transfers need",
    "exposed_comm": "communication is slower or less overlapped than the plan assumes",
    "bubble": "the pipeline idles more than its schedule should (stage imbalance, too few micro-batches)",
    "idle": "the device is left without work (input loading, host overhead, synchronisation)",
}
_P2P = ("send", "recv")
P2P_COLUMN = "exposed_p2p_ns"
"""Optional steps column: exposed time in which only send/recv (pipeline traffic) is active."""
_DESC_KIND = re.compile(r"(?<![a-z])(tp|cp|ep|dp|pp)(?![a-z])")


@checked
def check(analysis: Analysis, prediction: Prediction, *, run: Run | None = None) -> Check:
    """Compare a run's analysis with the prediction for its split.

    Parameters
    ----------
    analysis
        What `tracediag.analyze` found.
    prediction
        What the model expects (`tracediag predict`, or `load_prediction(plan.json)`).
    run
        The loaded run, when at hand: its process groups (names, members) tell collective kinds apart,
        and its events whether the trace saw a device at all (no device: no MFU).

    Notes
    -----
    Observed times are medians over all (rank, step) rows of `analysis.steps`; compute is compared
    with predicted compute + optimizer (a trace does not separate the optimizer step). Observed MFU =
    the prediction's model FLOPs per step / (observed median step time · peak · GPUs).
    """
    split = prediction.split
    groups = run.meta.process_groups if run is not None else {}
    kinds = _collective_kinds(analysis.collectives, split, groups)
    on_device = _on_device(analysis, run)
    steps = analysis.steps
    t = prediction.time
    components = [
        Component(name="step_time", observed=_median_s(steps, "dur_ns"), predicted=t.step_time_s),
        Component(
            name="compute",
            observed=_median_s(steps, "compute_ns"),
            predicted=t.compute_s + t.optimizer_s,
            note="includes the optimizer step" + ("" if on_device else "; CPU operator time (no device in trace)"),
        ),
        *_exposed(steps, kinds, split, prediction),
        _bubble(analysis, prediction),
        Component(name="idle", observed=_median_s(steps, "idle_ns"), predicted=0.0, note="the model expects none"),
        _mfu(steps, prediction, on_device=on_device),
    ]
    notes = []
    if analysis.world_size != prediction.gpus:
        notes.append(f"the trace's world size is {analysis.world_size}, the prediction is for {prediction.gpus} GPUs")
    if not on_device:
        notes.append("no device activity in the trace (CPU-only, e.g. gloo): times are CPU times")
    if steps.height == 0:
        notes.append("no complete steps in the trace: nothing to compare")
    if components[-1].note.startswith(MFU_REFUSED):
        notes.append("observed MFU would exceed 100%: check that the plan describes this run's model and batch")
    return Check(
        components=tuple(components),
        links=_links(kinds, prediction, groups, on_device=on_device),
        sentence=_sentence(components, t.step_time_s)
        + ("" if on_device else " (CPU-only trace: CPU times against the plan's devices)"),
        notes=tuple(notes),
        plan=_plan(prediction),
    )


def _plan(p: Prediction) -> CheckedPlan:
    s = p.split
    return CheckedPlan(
        model=p.model.name,
        device=p.device.name,
        gpus=p.gpus,
        split=(("tp", s.tp), ("pp", s.pp), ("dp", s.dp), ("cp", s.cp), ("ep", s.ep), ("vpp", s.vpp), ("zero", s.zero)),
        engine=p.engine.name,
        micro_batch=p.training.micro_batch,
        seq_len=p.training.seq_len,
        global_batch=p.training.global_batch,
    )


def _median_s(steps: pl.DataFrame, column: str) -> float | None:
    if steps.height == 0 or column not in steps.columns:
        return None
    value = steps[column].median()
    return None if value is None else float(value) / NS_PER_S


def _on_device(analysis: Analysis, run: Run | None) -> bool:
    """Whether the trace recorded device activity (kernels), so that MFU means something."""
    if run is not None:
        return bool((run.events["device"] >= 0).any())
    if "device" in analysis.steps.columns:
        return bool((analysis.steps["device"].fill_null(-1) >= 0).any())
    return True


def _degrees(split: Split) -> dict[str, int]:
    return {"tp": split.tp, "cp": split.cp, "ep": split.ep, "dp": split.dp, "pp": split.pp}


def _kind_by_members(ranks: tuple[int, ...], op: str, split: Split) -> str | None:
    """The one dimension the members differ in, for the model's rank order tp, cp, dp, pp (inner first)."""
    tp, cp, dp = split.tp, split.cp, split.dp

    def coords(r: int) -> dict[str, int]:
        return {"tp": r % tp, "cp": (r // tp) % cp, "dp": (r // (tp * cp)) % dp, "pp": r // (tp * cp * dp)}

    first = coords(ranks[0])
    varying = {k for r in ranks[1:] for k, v in coords(r).items() if v != first[k]}
    if varying in ({"dp"}, {"dp", "cp"}):
        return "ep" if split.ep > 1 and op == "all_to_all" and len(ranks) == split.ep else "dp"
    return next(iter(varying)) if len(varying) == 1 else None


def group_kind(
    group: str | None, op: str, n_ranks: int | None, split: Split, groups: dict[str, ProcessGroup]
) -> tuple[str | None, str]:
    """Which kind (tp, cp, ep, dp, pp) a group's collectives are, and how that was decided."""
    degrees = _degrees(split)
    active = [k for k in KINDS if degrees[k] > 1]
    if len(active) == 1:
        return active[0], f"the plan's only parallel dimension ({active[0]})"
    if not active:
        return None, "the plan has no parallel dimension"
    pg = groups.get(group) if group is not None else None
    if pg is not None and pg.desc:
        named = set(_DESC_KIND.findall(pg.desc.lower()))
        named = {"dp"} if named == {"dp", "cp"} else named
        if len(named) == 1:
            return named.pop(), f"group name {pg.desc!r}"
    if pg is not None and pg.ranks and len(pg.ranks) > 1:
        kind = _kind_by_members(pg.ranks, op, split)
        if kind is not None:
            return kind, "group members"
    if op in _P2P and split.pp > 1:
        return "pp", "send/recv"
    if op == "all_to_all" and split.ep > 1:
        return "ep", "all-to-all"
    sizes = {"tp": {split.tp}, "cp": {split.cp}, "dp": {split.dp, split.dp * split.cp}}
    matches = [k for k in ("tp", "cp", "dp") if degrees[k] > 1 and n_ranks in sizes[k]]
    if len(matches) == 1:
        return matches[0], f"group size {n_ranks}"
    if matches:
        return None, f"group size {n_ranks} fits {' and '.join(matches)}, and the trace names no group members"
    return None, f"group size {n_ranks} fits no dimension of the plan"


def _collective_kinds(collectives: pl.DataFrame, split: Split, groups: dict[str, ProcessGroup]) -> pl.DataFrame:
    """The collectives table with `kind` and `kind_from` columns."""
    keys = collectives.select("group", "op", "n_ranks").unique()
    decided = [group_kind(g, op, n, split, groups) for g, op, n in keys.iter_rows()]
    keys = keys.with_columns(
        kind=pl.Series([k for k, _ in decided], dtype=pl.String()),
        kind_from=pl.Series([h for _, h in decided], dtype=pl.String()),
    )
    return collectives.join(keys, on=["group", "op", "n_ranks"], how="left", nulls_equal=True)


def _exposed(steps: pl.DataFrame, kinds: pl.DataFrame, split: Split, p: Prediction) -> list[Component]:
    """Exposed communication: the total over collectives, and per kind where the trace can attribute it.

    When the steps table separates send/recv waits (`exposed_p2p_ns`), they go to the pipeline row
    (`_bubble`) and are left out here, together with the PP kind.
    """
    t = p.time
    p2p_apart = P2P_COLUMN in steps.columns
    kinds_here = tuple(k for k in KINDS if not (p2p_apart and k == "pp"))
    predicted = {k: getattr(t, f"exposed_{k}_s") for k in kinds_here}
    exposed = pl.col("exposed_comm_ns") - (pl.col(P2P_COLUMN) if p2p_apart else 0)
    total = _median_s(steps.select(exposed), "exposed_comm_ns")
    wait = _median_s(steps, "wait_ns")
    waiting = f"; median {MS_PER_S * wait:.1f} ms of waiting for peers" if wait else ""
    piped = p2p_apart and (split.pp > 1 or bool(_median_s(steps, P2P_COLUMN)))
    note = ("send/recv waits are in the pipeline row" + waiting) if piped else waiting[2:]
    rows = [Component(name="exposed_comm", observed=total, predicted=sum(predicted.values()), note=note)]
    degrees = _degrees(split)
    span = (pl.col("end_ns") - pl.col("first_arrival_ns")).clip(0)
    colls = kinds.filter(~pl.col("op").is_in(_P2P)) if p2p_apart else kinds
    shares = dict(colls.group_by("kind").agg(span.sum()).iter_rows()) if colls.height else {}
    seen = {k for k in shares if k is not None}
    whole = sum(shares.values()) or 1
    unknown = colls.filter(pl.col("kind").is_null())["kind_from"]
    for k in kinds_here:
        if degrees[k] <= 1 and k not in seen:
            continue
        observed = None
        if seen == {k} and unknown.is_empty():
            observed, note = total, f"all matched collectives are {k.upper()}{waiting}"
        elif k in seen:
            note = (
                f"{NOT_VISIBLE}: exposed time is not split by group; "
                f"{k.upper()} collectives are {100 * shares[k] / whole:.0f}% of collective time"
            )
        elif not unknown.is_empty():
            note = (
                f"{NOT_VISIBLE}: {100 * shares[None] / whole:.0f}% of collective time is in collectives whose "
                f"kind the trace does not tell ({unknown[0]})"
            )
        else:
            note = f"{NOT_VISIBLE}: no {k.upper()} collectives matched"
        rows.append(Component(name=f"exposed_{k}", observed=observed, predicted=predicted[k], note=note))
    return rows


def _bubble(analysis: Analysis, p: Prediction) -> Component:
    """The pipeline bubble: measured directly, or as send/recv waits (bubble + PP transfers), or not at all."""
    steps, t = analysis.steps, p.time
    if "bubble_ns" in steps.columns:
        return Component(name="bubble", observed=_median_s(steps, "bubble_ns"), predicted=t.bubble_s)
    p2p = _median_s(steps, P2P_COLUMN)
    if p.split.pp == 1 and not p2p:
        return Component(name="bubble", observed=0.0, predicted=t.bubble_s, note="no pipeline")
    if P2P_COLUMN in steps.columns:
        return Component(
            name="bubble",
            observed=p2p,
            predicted=t.bubble_s + t.exposed_pp_s,
            note="waits in send/recv: the bubble and PP transfers together (the trace does not separate them)",
        )
    return Component(
        name="bubble", observed=None, predicted=t.bubble_s, note=f"{NOT_VISIBLE}: pipeline waits are not separated"
    )


def _mfu(steps: pl.DataFrame, p: Prediction, *, on_device: bool) -> Component:
    """Observed MFU = the plan's model FLOPs per step / (observed step · peak · GPUs); refused above 100%,
    which no run reaches: then the plan's work is not this run's (another model, batch or device)."""
    if not on_device:
        return Component(name="mfu", observed=None, predicted=p.mfu, note=f"{NOT_VISIBLE}: no device activity")
    step = _median_s(steps, "dur_ns")
    if not step:
        return Component(name="mfu", observed=None, predicted=p.mfu, note=f"{NOT_VISIBLE}: no complete steps")
    observed = p.model_flops_per_step / (step * p.device.peak_flops * p.gpus)
    if observed > 1:
        note = (
            f"{MFU_REFUSED}: the plan's {p.model_flops_per_step:.3g} FLOPs per step in the observed step time would "
            f"be {observed:.0%} of the devices' peak; the plan is for other work than this run (model, batch or device)"
        )
        return Component(name="mfu", observed=None, predicted=p.mfu, note=note)
    return Component(name="mfu", observed=observed, predicted=p.mfu, note="the plan's model FLOPs / observed step")


def _group_label(name: str, groups: dict[str, ProcessGroup]) -> str:
    """A group's name, with the trace's description of it when there is one ("3 (dp0)")."""
    desc = groups[name].desc if name in groups else None
    return f"{name} ({desc})" if desc and desc != name else name


def _links(
    kinds: pl.DataFrame, p: Prediction, groups: dict[str, ProcessGroup], *, on_device: bool
) -> tuple[LinkCheck, ...]:
    rows = (
        kinds.filter(pl.col("busbw_gbps").is_not_null() & (pl.col("bytes") > 0))
        .group_by("kind", "kind_from", "op")
        .agg(
            pl.col("group").drop_nulls().unique().sort(),
            pl.len().alias("collectives"),
            pl.col("busbw_gbps").median(),
        )
        .sort("kind", "op", nulls_last=True)
    )
    out = []
    for r in rows.iter_rows(named=True):
        kind = r["kind"]
        figure = p.link_busbw.get(kind) if kind else None
        note = "" if on_device else "CPU (gloo) collectives; the link figure is for the plan's devices"
        out.append(
            LinkCheck(
                kind=kind,
                kind_from=r["kind_from"],
                op=r["op"],
                groups=tuple(_group_label(g, groups) for g in r["group"]),
                collectives=r["collectives"],
                busbw_gbps=float(r["busbw_gbps"]),
                link=p.links.get(kind) if kind else None,
                link_busbw_gbps=None if figure is None else figure / 1e9,
                note=note if kind else f"{NOT_VISIBLE}: {r['kind_from']}",
            )
        )
    return tuple(out)


def _sentence(components: list[Component], step_s: float) -> str:
    """One sentence on the component whose observed time exceeds its prediction the most."""
    by_name = {c.name: c for c in components}
    step = by_name["step_time"]
    if step.observed is None:
        return "The trace has no complete steps to compare with the prediction."
    kinds = {f"exposed_{k}" for k in KINDS}
    per_kind = any(c.name in kinds and c.observed is not None for c in components)
    skip = {"step_time", "mfu"} | ({"exposed_comm"} if per_kind else set())
    timed = [c for c in components if c.name not in skip and c.observed is not None]
    worst = max(timed, key=lambda c: c.observed - c.predicted)
    excess = worst.observed - worst.predicted
    if excess <= CLOSE * step_s:
        if step.ratio is not None and step.ratio < 1 - CLOSE:
            return f"The run is faster than predicted ({step.ratio:.2f}× the step time): check the plan's inputs."
        return f"Step time is {step.ratio:.2f}× the prediction; no component is off by more than {CLOSE:.0%} of a step."
    label = LABELS[worst.name]
    label = label[0].upper() + label[1:]
    advice = _ADVICE[worst.name]
    observed = format_ms(MS_PER_S * worst.observed, small=True)
    if worst.ratio is None:
        return f"{label} takes {observed} per step where the model expects none: {advice}."
    predicted = format_ms(MS_PER_S * worst.predicted, small=True)
    return f"{label} is {worst.ratio:.1f}× the prediction ({observed} vs {predicted} per step): {advice}."
