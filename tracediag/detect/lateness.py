"""Who everyone waits for at the collectives, and why (`derive.lateness`; issue 24).

`assess` reads the per-instance lateness rows of the analysed steps and names the ranks everyone
waits for (one rank, a set such as a slow node's ranks, or no one) with the share of all waiting
they explain. `detect` says why, from the windows before their late arrivals
(`derive.windows`) against their peers' windows of the same instances: more compute
(``compute_straggler``, the ratio of the same ops' time and of their count in evidence), host work
(``host_straggler``: the device idle with the host late — ``reason`` host; or named host work:
gc, sync, checkpoint) or data loading (``input_straggler``).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import polars as pl

from tracediag.analysis import Cause, Finding, Lateness
from tracediag.derive import lateness
from tracediag.derive.ranked import rank_slices
from tracediag.detect import op_overhead, straggler
from tracediag.units import NS_PER_MS, count, rank_list
from tracediag.vocab import ATEN_OP

if TYPE_CHECKING:
    from tracediag.detect.facts import Facts
    from tracediag.detect.thresholds import Thresholds


def assess(facts: Facts, th: Thresholds) -> Lateness | None:
    """The run's `Lateness` over the facts' steps; None when no collective was matched."""
    rows = facts.late
    if rows is None or not rows.height or not facts.steps.height:
        return None
    rows = rows.join(facts.steps.select("step").unique(), on="step", how="semi")
    if not rows.height:
        return None
    per_step = facts.steps.group_by("step").agg(pl.col("dur_ns").median())["dur_ns"]
    found = lateness.assess(
        rows,
        step_time_ns=float(per_step.sum()),
        median_step_ns=float(per_step.median()),
        episode=th.lateness_episode_wait,
        share=th.lateness_share,
        gap=th.lateness_gap,
        chance=th.lateness_chance,
        min_wait=th.lateness_min_wait,
        masked=th.lateness_masked,
        late_share=th.lateness_late_share,
        together=th.lateness_together,
    )
    return _untraced(found, rows, facts.world_size)


def _untraced(found: Lateness, rows: pl.DataFrame, world_size: int | None) -> Lateness:
    """`found` with the ranks of the world that have no trace, and the time the collectives run after
    the last traced arrival. When that is more than all the waiting among the traced ranks, no traced
    rank is named: the collectives wait for someone else, most likely an untraced rank."""
    traced = rows["rank"].unique().sort().to_list()
    seen = set(traced)
    missing = tuple(r for r in range(world_size or 0) if r not in seen)
    after = int(rows.group_by("iid").agg(pl.col("after_ns").median())["after_ns"].sum())
    found = dataclasses.replace(found, untraced=missing, after_last_ns=after)
    if not missing or after <= found.wait_ns:
        return found
    per = after / max(found.instances, 1) / NS_PER_MS
    reason = (
        f"possibly untraced {_ranks(missing)}: {len(traced)} of {world_size} ranks traced, and the collectives "
        f"end {per:,.1f} ms after the last traced arrival on average ({after / NS_PER_MS:,.1f} ms in all, "
        f"more than the {found.wait_ns / NS_PER_MS:,.1f} ms the traced ranks wait for each other)"
    )
    return dataclasses.replace(found, waited_for=(), reason=reason)


def _ranks(ranks: tuple[int, ...]) -> str:
    return rank_list(ranks)


WINDOW_PARTS = ("window_ns", "compute_ns", "op_n", "busy_ns", "input_ns", "gc_ns", "sync_ns", "checkpoint_ns")
"""The window columns compared between a late rank and its peers (`derive.windows.WINDOW_SCHEMA`)."""

NAMED_REASONS = (("checkpoint", "checkpoint_ns"), ("gc", "gc_ns"), ("sync", "sync_ns"))
"""Host work named in the trace, tested before the unnamed idle (`vocab` patterns)."""


def window_excess(facts: Facts, ranks: tuple[int, ...]) -> pl.DataFrame:
    """Per member of `ranks` and instance where one of them arrived last: its window parts minus the median
    of the other ranks' windows of the same instance (``d_<part>``), with ``rank, step, iid, late_ns``."""
    rows = facts.late
    if rows is None or "window_ns" not in rows.columns:
        return pl.DataFrame()
    rows = rows.with_columns(idle_ns=pl.col("window_ns") - pl.col("busy_ns"))
    parts = [*WINDOW_PARTS, "idle_ns"]
    peers = (
        rows.filter(~pl.col("rank").is_in(list(ranks)))
        .group_by("iid")
        .agg(*(pl.col(c).median().alias(f"p_{c}") for c in parts))
    )
    member = pl.col("rank").is_in(list(ranks))
    theirs = rows.filter(member, "is_last").select("iid").unique()  # where one of them is last: all of them
    mine = rows.filter(member).join(theirs, on="iid", how="semi").join(peers, on="iid")
    return mine.select(
        "rank",
        "step",
        "iid",
        "late_ns",
        "caused_ns",
        *(pl.col(c) for c in parts),
        *(pl.col(f"p_{c}") for c in parts),
        *((pl.col(c) - pl.col(f"p_{c}")).alias(f"d_{c}") for c in parts),
    )


def reason_of(
    ex: pl.DataFrame, th: Thresholds, framework_ns: float = 0.0, small_ops_ns: float = 0.0
) -> tuple[str, dict[str, float]]:
    """Why the rank(s) of `ex` (`window_excess`) arrive late, and the numbers (ms, ratios).

    The excess window (its window − the peers' median, summed over its late arrivals; per member of a
    set late together) is split into
    what fills it: named host work (checkpoint/logging, GC, synchronisations) first, then data
    loading, then compute, then idle device time (its host late: Python, a sleep, a busy thread,
    CPU contention). The first part reaching `lateness_reason_share` of the excess is the reason;
    else the larger of compute and idle. `framework_ns` (per member, `framework_excess`) is the part of
    the compute excess that is framework code between the operators, not operator work: it counts as
    host time (at most the compute excess); so does `small_ops_ns` (per member, `op_overhead.small_ops_by_step`),
    the compute of extra operators too small to be arithmetic (at most what the framework time leaves)."""
    members = max(ex["rank"].n_unique(), 1) if ex.height else 1
    total = lambda c: float(ex[c].sum()) / members if ex.height else 0.0  # noqa: E731  (per member)
    excess = total("d_window_ns")
    framework = min(max(framework_ns, 0.0), max(total("d_compute_ns"), 0.0))
    small = min(max(small_ops_ns, 0.0), max(total("d_compute_ns"), 0.0) - framework)
    work, host = total("d_compute_ns") - framework - small, total("d_idle_ns") + framework + small
    nums = {
        "late_arrivals": ex["iid"].n_unique() if ex.height else 0,
        "window_excess_ms": round(excess / NS_PER_MS, 3),
        "lateness_ms": round(total("late_ns") / NS_PER_MS, 3),
        "compute_excess_ms": round(total("d_compute_ns") / NS_PER_MS, 3),
        "idle_excess_ms": round(total("d_idle_ns") / NS_PER_MS, 3),
        "framework_excess_ms": round(framework / NS_PER_MS, 3),
        "small_ops_excess_ms": round(small / NS_PER_MS, 3),
        "input_excess_ms": round(total("d_input_ns") / NS_PER_MS, 3),
        "gc_ms": round(total("gc_ns") / NS_PER_MS, 3),
        "sync_ms": round(total("sync_ns") / NS_PER_MS, 3),
        "checkpoint_ms": round(total("checkpoint_ns") / NS_PER_MS, 3),
        "compute_ratio": round(total("compute_ns") / max(total("p_compute_ns"), 1.0), 3),
        "ops_ratio": round(total("op_n") / max(total("p_op_n"), 1.0), 3),
    }
    nums["compute_kind"] = "more_ops" if nums["ops_ratio"] >= th.lateness_more_ops else "same_ops_longer"
    need = th.lateness_reason_share * max(excess, 1.0)
    for reason, col in NAMED_REASONS:
        if total(col) - total(f"p_{col}") >= need:
            return reason, nums
    if total("d_input_ns") >= need:
        return "input", nums
    if work >= need:
        return "compute", nums
    if host >= need:
        return "host", nums
    return ("compute" if work >= host else "host"), nums


def framework_by_step(facts: Facts, ranks: tuple[int, ...], steps: tuple[int, ...]) -> pl.DataFrame:
    """Per member of `ranks` (CPU-only ranks) and step of `steps`: ``framework_ns``, the own time of its compute
    operators that are not ATen operators (autograd engine nodes, Python-level ``record_function`` ranges,
    module hooks) minus the median of its peers' in the step, at least 0: framework code between the operators,
    which a busy host (a thread holding the GIL, CPU contention) stretches while the operators' own work is
    unchanged. Empty on GPU ranks (their compute is the kernels) or without the kernel table."""
    out = pl.DataFrame(schema={"rank": pl.Int32, "step": pl.Int32, "framework_ns": pl.Float64})
    k = facts.kernel_steps
    cpu = facts.steps.filter(pl.col("device") < 0)["rank"].unique()
    if k is None or not k.height or not set(ranks) <= set(cpu.to_list()):
        return out
    # the pattern tested on the distinct names, not on a string of every row (7.2 million at 16,384 ranks)
    names = k.select(pl.col("name").unique())
    framework = names.filter(~pl.col("name").cast(pl.String).str.contains(ATEN_OP)).get_column("name")
    own = pl.concat(
        [
            rows.lazy()
            .filter(
                pl.col("category") == "compute",
                pl.col("step").is_in(list(steps)),
                pl.col("rank").is_in(cpu.implode()),
                pl.col("name").is_in(framework.implode()),
            )
            .group_by("rank", "step")
            .agg(pl.col("total_ns").sum())
            .collect()
            for rows in rank_slices(k)
        ]
    )
    mine = pl.col("rank").is_in(list(ranks))
    peers = own.filter(~mine).group_by("step").agg(_p=pl.col("total_ns").median())
    return (
        own.filter(mine)
        .join(peers, on="step")
        .select("rank", "step", framework_ns=(pl.col("total_ns") - pl.col("_p")).clip(lower_bound=0).cast(pl.Float64))
        .cast(out.schema)
    )


def op_counts(facts: Facts, ranks: tuple[int, ...], steps: tuple[int, ...]) -> dict[str, float] | None:
    """Over `steps`, the compute kernels/operators `ranks` run against their peers' (from the per
    (rank, step, name) kernel table): ``ops_ratio`` (count, members' mean over the peers' median) and
    ``op_time_ratio`` (the mean duration of the ops both run, theirs over the peers'). Windows cannot
    compare counts: a peer's window before an instance starts where the late rank let the previous
    one end, later in its program. None without the table."""
    k = facts.kernel_steps
    if k is None or not k.height:
        return None
    mine = pl.col("rank").is_in(list(ranks))
    # per rank, and per side (members or peers) and name, a rank slice at a time: every row is its rank's
    # own, and the sums are of integers, so the slices' sums add up to the whole table's
    sums = [
        pl.collect_all(
            [
                rows.group_by("rank").agg(pl.col("count").cast(pl.Int64).sum()),
                rows.group_by(mine.alias("_m"), "name").agg(
                    pl.col("count").cast(pl.Int64).sum(), pl.col("total_ns").sum()
                ),
            ]
        )
        for rows in (
            part.lazy().filter(pl.col("category") == "compute", pl.col("step").is_in(list(steps)))
            for part in rank_slices(k)
        )
    ]
    per_rank = pl.concat([by_rank for by_rank, _ in sums])
    m = per_rank.filter(mine)["count"].mean()
    p = per_rank.filter(~mine)["count"].median()
    if not m or not p:
        return None
    # the mean duration of the ops both run (a name on both sides), the late rank's over its peers'
    sides = pl.concat([by_name for _, by_name in sums]).group_by("_m", "name").agg(pl.col("count", "total_ns").sum())
    shared = sides.filter(pl.len().over("name") == 2)
    each = shared.group_by("_m").agg(_t=pl.col("total_ns").sum() / pl.col("count").sum())
    t_m, t_p = (each.filter(pl.col("_m") == v)["_t"] for v in (True, False))
    t = float(t_m[0]) / float(t_p[0]) if t_m.len() and t_p.len() and t_p[0] else None
    return {"ops_ratio": round(float(m) / float(p), 3), "op_time_ratio": round(t, 3) if t else None}


def late_steps(facts: Facts, ranks: tuple[int, ...], th: Thresholds) -> tuple[int, ...]:
    """Steps where `ranks` cause at least `lateness_share` of the step's waiting and, per waiting
    rank, at least `lateness_min_wait` of the median step. When they do so on more steps than chance
    gives (binomial, p = set size / ranks, at most `lateness_chance`: waited for step after step),
    those are their steps; else only those reaching `lateness_step_share` of what they cause in
    their worst step (an episode's steps, not the noise around it). A persistent cause's steps are not
    all alike on a loaded host: a rank causing all of a step's waiting at a fifth of the step is late
    there even when its worst step is four times that."""
    median = float(facts.steps.group_by("step").agg(pl.col("dur_ns").median())["dur_ns"].median())
    per = lateness.episode_waits(facts.late, ranks, median)
    keep = per.filter(pl.col("share") >= th.lateness_share, pl.col("per_step") >= th.lateness_min_wait)
    p = len(ranks) / max(facts.late["rank"].n_unique(), 1)
    if lateness._chance(keep.height, per.height, p) > th.lateness_chance:
        keep = keep.filter(pl.col("per_step") >= th.lateness_step_share * (per["per_step"].max() or 0.0))
    return tuple(sorted(keep["step"].to_list()))


REASON_WORDS = {
    "host": "its device sits idle, or waits in framework code between operators, while its host is busy "
    "elsewhere or absent (Python, a sleep, a busy thread holding the GIL, CPU contention)",
    "gc": "garbage collection holds its host",
    "sync": "device synchronisations hold its host",
    "checkpoint": "a checkpoint or logging write holds its host",
    "input": "it loads data longer",
}


def _who(ranks: tuple[int, ...]) -> str:
    return rank_list(ranks)


def together(facts: Facts, ranks: tuple[int, ...], th: Thresholds) -> list[tuple[int, ...]]:
    """`ranks` (the ranks everyone waits for) in groups that are late together: a rank joins a group
    when the instances where it is late (`lateness_late_share` of the last arrival's lateness) overlap the
    group's by at least `lateness_together` (Jaccard): a slow node's ranks are late at the same collectives
    (one of them last at each); two ranks late at different ones (each its own cause, its own steps) are
    explained apart."""
    return lateness.groups(facts.late, ranks, late_share=th.lateness_late_share, together=th.lateness_together)


def detect(facts: Facts, late: Lateness | None, th: Thresholds, found: list[Finding]) -> list[Finding]:
    """`found` (the other detectors' findings) with the lateness findings: for each group of the ranks
    everyone waits for that is late together (`together`), the reason read from their windows
    (`reason_of`). Compute: a ``compute_straggler`` per rank unless one already names it; host work
    (``host_straggler``, with its ``reason``) or loading (``input_straggler``) replaces a
    compute_straggler finding of the same rank."""
    if late is None or not late.waited_for or facts.late is None or "window_ns" not in facts.late.columns:
        return found
    groups = together(facts, late.waited_for, th)
    for ranks in groups:
        share = late.share
        if len(groups) > 1:
            share = float(late.ranks.filter(pl.col("rank").is_in(list(ranks)))["share"].sum())
        found = _explain(facts, dataclasses.replace(late, waited_for=ranks, share=round(share, 4)), th, found)
    return found


def traced_scope(late: Lateness) -> tuple[str, str, float, dict[str, float]]:
    """What the waiting share of `late` is a share of, a closing note, its confidence, and the evidence
    of an incomplete rank set. With ranks of the world untraced, the share is of the waiting among the
    traced ranks; the time the collectives run past the last traced arrival (`Lateness.after_last_ns`,
    per traced rank) may hide waits for an untraced rank, so the confidence is the share of that larger
    total."""
    if not late.untraced:
        return "all waiting", "", round(min(1.0, late.share), 4), {}
    traced = late.ranks.height
    hidden = late.after_last_ns * traced
    total = late.wait_ns + hidden
    confidence = late.share * late.wait_ns / total if total > 0 else late.share
    one = len(late.untraced) == 1
    note = (
        f"; {_ranks(late.untraced)} of world size {traced + len(late.untraced)} {'has' if one else 'have'} no "
        f"trace, and the collectives run on {late.after_last_ns / NS_PER_MS:,.1f} ms past the last traced "
        f"arrivals, which may hide waits for {'it' if one else 'them'}"
    )
    evidence = {
        "traced_ranks": traced,
        "untraced_ranks": len(late.untraced),
        "after_last_traced_ms": round(late.after_last_ns / NS_PER_MS, 3),
    }
    return f"the waiting among the {traced} traced ranks", note, round(min(1.0, confidence), 4), evidence


def _explain(facts: Facts, late: Lateness, th: Thresholds, found: list[Finding]) -> list[Finding]:
    """`detect` for one group of late ranks (`late.waited_for`, their `late.share`)."""
    ranks = late.waited_for
    steps = late_steps(facts, ranks, th)
    if not steps:
        return found
    ex = window_excess(facts, ranks).filter(pl.col("step").is_in(list(steps)))
    framework = framework_by_step(facts, ranks, steps)
    # extra operators too small to be arithmetic: the windows' extra compute is their dispatch, host time
    tiny = op_overhead.tiny_extra_ops(facts, ranks, steps, th)
    small = ex.group_by("rank", "step").agg(small_ops_ns=pl.col("d_compute_ns").sum().clip(lower_bound=0))
    small = small if tiny else small.clear()
    reason, nums = reason_of(
        ex,
        th,
        float(framework["framework_ns"].sum()) / len(ranks),
        float(ex["d_compute_ns"].sum()) / len(ranks) if tiny else 0.0,
    )
    counted = op_counts(facts, ranks, steps)
    if counted is not None:  # the step's own counts, not the windows'
        nums.update(counted)
        nums["compute_kind"] = "more_ops" if counted["ops_ratio"] >= th.lateness_more_ops else "same_ops_longer"
    n_steps = facts.steps["step"].n_unique()
    scope, note, confidence, partial = traced_scope(late)
    waiting = {
        "waiting_share": late.share,
        "peer_wait_ms_per_step": round(
            float(ex["caused_ns"].sum()) / max(facts.late["rank"].n_unique() - len(ranks), 1) / len(steps) / NS_PER_MS,
            3,
        ),
        "collectives": late.instances,
        **partial,
    }
    if reason == "compute":
        one = len(ranks) == 1
        it, its = ("it", "its") if one else ("they", "their")
        why = (
            f"; {it} arrive{'s' if one else ''} last at {nums['late_arrivals']} of {late.instances} collectives and "
            f"cause{'s' if one else ''} {late.share:.0%} of {scope}; in {its} late steps {it} "
            + (
                f"run{'s' if one else ''} {nums['ops_ratio']:.2f}x {its} peers' ops (more work)"
                if nums["compute_kind"] == "more_ops"
                else f"run{'s' if one else ''} the same ops ({nums['ops_ratio']:.2f}x as many), each longer (a slower "
                "or throttled device, or bigger inputs: an uneven shard or batch)"
            )
            + note
        )
        more = {"reason": "compute", **waiting, **nums}
        ratios = straggler.rank_step_ratios(facts.steps, th)
        kind = (
            "persistent"
            if len(steps) >= max(th.persistent_min_steps, th.lateness_persistent_share * n_steps) or n_steps == 1
            else "transient"
        )
        if not one:  # late together (a slow node): one finding, priced as one, replacing the rules' per rank
            rows = ratios.filter(pl.col("rank").is_in(list(ranks)), pl.col("step").is_in(list(steps)))
            f = straggler._finding(rows, ranks, kind, n_steps, confidence, **more)
            kept = [g for g in found if not (g.cause is Cause.COMPUTE_STRAGGLER and set(g.ranks) & set(ranks))]
            return [*kept, dataclasses.replace(f, summary=f.summary + why)]
        out = []
        for f in found:  # the straggler rules' finding of a waited-for rank stands, with the why
            if f.cause is Cause.COMPUTE_STRAGGLER and set(f.ranks) & set(ranks):
                f = dataclasses.replace(f, summary=f.summary + why, evidence={**more, **f.evidence})
            out.append(f)
        if ranks[0] not in {r for f in found if f.cause is Cause.COMPUTE_STRAGGLER for r in f.ranks}:
            rows = ratios.filter(pl.col("rank") == ranks[0], pl.col("step").is_in(list(steps)))
            f = straggler._finding(rows, ranks, kind, n_steps, confidence, **more)
            out.append(dataclasses.replace(f, summary=f.summary + why))
        return out
    cause = Cause.INPUT_STRAGGLER if reason == "input" else Cause.HOST_STRAGGLER
    rows = ex
    lost = int(rows["caused_ns"].sum() / max(facts.late["rank"].n_unique() - len(ranks), 1))
    part = {
        "host": nums["idle_excess_ms"] + nums["framework_excess_ms"] + nums["small_ops_excess_ms"],
        "gc": nums["gc_ms"],
        "sync": nums["sync_ms"],
        "checkpoint": nums["checkpoint_ms"],
        "input": nums["input_excess_ms"],
    }[reason]
    one = len(ranks) == 1
    it, its = ("it", "its") if one else ("them", "their")
    summary = (
        f"{_who(ranks)} arrive{'s' if one else ''} last at {nums['late_arrivals']} of {late.instances} collectives "
        f"and cause{'s' if one else ''} {late.share:.0%} of {scope} (each other rank waits "
        f"{waiting['peer_wait_ms_per_step']:.1f} ms per step for {it}); before those arrivals {REASON_WORDS[reason]}: "
        f"{part:.1f} ms over {count(len(steps), 'step')} against a window {nums['window_excess_ms']:.1f} ms longer "
        f"than {its} peers', {its} compute {nums['compute_ratio']:.2f}x theirs"
        + (
            f", {nums['small_ops_excess_ms']:.1f} ms of it in operators too small to be arithmetic "
            f"({nums['ops_ratio']:.2f}x {its} peers' operators, {nums.get('op_time_ratio') or 0:.3f}x their "
            "duration: a per-element loop, .item() reads)"
            if nums["small_ops_excess_ms"] > 0
            else ""
        )
        + note
    )
    by_step = _ms_by_step(framework, "framework_ns")
    small_by_step = _ms_by_step(small, "small_ops_ns") if nums["small_ops_excess_ms"] > 0 else {}
    finding = Finding(
        cause=cause,
        ranks=ranks,
        steps=steps,
        time_lost_ns=lost,
        confidence=confidence,
        summary=summary,
        evidence={
            "reason": reason,
            **waiting,
            **nums,
            **({"framework_ms_by_step": by_step} if by_step and reason == "host" else {}),
            **({"small_ops_ms_by_step": small_by_step} if small_by_step and reason == "host" else {}),
        },
    )
    kept = [f for f in found if not (f.cause is Cause.COMPUTE_STRAGGLER and set(f.ranks) & set(ranks))]
    return [*kept, finding]


def _ms_by_step(per: pl.DataFrame, col: str) -> dict[str, float]:
    """Step → the members' mean of `col` (ns) in ms, where positive: what the host what-if takes out of the compute."""
    means = per.group_by("step").agg(pl.col(col).mean()).filter(pl.col(col) > 0)
    return {str(k): round(v / NS_PER_MS, 3) for k, v in means.sort("step").iter_rows()}
