"""host_bound: the device sits idle waiting on its own host.

Per (rank, step): idle share = ``idle_ns`` / step, where idle is device time with no compute, no
communication and no copy — so not waiting for a peer inside a collective (that is communication)
and not a pipeline bubble (that detector runs first). Found when the median over the GPU ranks of
each rank's median idle share ≥ `host_idle_share`, unless input_bound or pipeline_bubble already
explains the idle. On CPU-only (gloo) runs the "device" is the host's operator timeline (compute =
some thread in a non-communication operator), so idle is time no thread runs any traced operator:
Python and framework work between operators, or waits the profiler does not show. The same rule
applies to it there, at half the confidence (the trace cannot say what the host did).

The evidence says why, from the idle split (HTA's categories: waiting on the host = nothing queued
until the host's launch returns; on kernels = ≤ 30 µs launch latency between queued kernels; other =
queued work held by an event, a sync or another device) and from the host rows
(`derive.host.host_feed`): sync calls and the host time they block, ``.item()`` calls, kernel
launches, kernels shorter than their launch, and the launch queue depth. The hint names the likeliest
fix, in this order: fewer syncs (they hold the host ≥ `host_sync_share` of the idle), CUDA graphs or a larger
micro-batch (launch calls take `host_launch_share` of the idle time, or `host_launch_share_small_kernels`
with most kernels shorter than their launch and nothing queued), the streams (most idle "other" with work
queued: held by events between streams or another device), a faster data path (data loading ≥
`host_input_hint_share` of the step), else the CPU work between kernels.

Steps: those whose median idle share over GPU ranks reaches `step_share` × `host_idle_share`.
time_lost_ns = Σ over them of the median over GPU ranks of the idle device time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from tracediag.analysis import Finding
from tracediag.units import NS_PER_MS, NS_PER_US

if TYPE_CHECKING:
    from tracediag.detect.facts import Facts
    from tracediag.detect.thresholds import Thresholds


def _decided_on(steps: pl.DataFrame) -> pl.DataFrame:
    """The GPU ranks' rows, or every row when no rank has a device (CPU-only run)."""
    gpu = steps.filter(pl.col("device") >= 0)
    return gpu if gpu.height else steps


def idle_share(steps: pl.DataFrame) -> float | None:
    """Median over GPU ranks (all ranks on CPU-only runs) of each rank's median idle share (None: no rows)."""
    gpu = _decided_on(steps)
    if not gpu.height:
        return None
    per_rank = gpu.group_by("rank").agg((pl.col("idle_ns") / pl.col("dur_ns").clip(1)).median().alias("s"))
    return float(per_rank["s"].median())


def _hint(ev: dict, th: Thresholds) -> str:
    idle = max(ev["idle_ms_per_step"], 1e-9)
    if ev["sync_ms_per_step"] >= th.host_sync_share * idle:
        return (
            f"fewer synchronizations: {ev['sync_calls_per_step']:g} blocking calls per step hold the host "
            f"{ev['sync_ms_per_step']:.1f} ms ({ev['item_calls_per_step']:g} .item() calls); drop .item()/.cpu()/"
            "cudaStreamSynchronize from the step or copy with non_blocking=True into pinned memory"
        )
    small_kernels = ev["small_kernel_share"] >= th.host_small_kernel_share
    shallow = ev["queue_depth_median"] <= th.host_shallow_queue
    if ev["launch_ms_per_step"] >= th.host_launch_share * idle or (
        small_kernels and shallow and ev["launch_ms_per_step"] >= th.host_launch_share_small_kernels * idle
    ):
        return (
            f"launch overhead: launches take {ev['launch_ms_per_step']:.1f} ms per step, "
            f"{ev['small_kernel_share']:.0%} of kernels run shorter than their launch and the queue is "
            f"{ev['queue_depth_median']:g} deep; capture the step in CUDA graphs (torch.compile "
            "mode='reduce-overhead') or use a larger micro-batch"
        )
    if ev["idle_other"] >= th.host_held_share and ev["queue_depth_median"] > th.host_shallow_queue:
        return (
            f"work is queued ({ev['queue_depth_median']:g} deep) but held: the device waits on events between "
            "streams (cudaStreamWaitEvent on a communication stream) or on another device; overlap or reorder "
            "the streams, or capture the step in CUDA graphs"
        )
    if ev["input_share"] >= th.host_input_hint_share:
        return "a faster data path: more DataLoader workers, pin_memory, prefetching"
    return (
        "the CPU work between kernels sets the pace: move Python work out of the step, capture it in CUDA "
        "graphs, or use a larger micro-batch"
    )


def detect(facts: Facts, *, thresholds: Thresholds, explained: bool = False) -> list[Finding]:
    """A host_bound finding when GPU devices idle a large share of every step.

    `explained`: input_bound or pipeline_bubble already accounts for the idle time.
    """
    th = thresholds
    s = _decided_on(facts.steps)
    on_gpu = bool((s["device"] >= 0).any()) if s.height else False
    share = idle_share(facts.steps)
    if share is None or share < th.host_idle_share or explained:
        return []
    s = s.with_columns(share=pl.col("idle_ns") / pl.col("dur_ns").clip(1))
    per_rank = s.group_by("rank").agg(pl.col("share").median()).sort("rank")
    ranks = tuple(per_rank.filter(pl.col("share") >= th.host_idle_share)["rank"].to_list())
    per_step = s.group_by("step").agg(share=pl.col("share").median(), idle=pl.col("idle_ns").median())
    hit = per_step.filter(pl.col("share") >= th.step_share * th.host_idle_share).sort("step")
    idle = s["idle_ns"].sum() or 1
    host = facts.host if facts.host is not None else pl.DataFrame()
    h = host.join(s.select("rank", "step"), on=["rank", "step"], how="semi") if host.height else host

    def med(col: str) -> float:
        return float(h[col].median() or 0) if h.height else 0.0

    kernels = int(h["kernel_n"].sum()) if h.height else 0
    ev = {
        "idle_share_median": round(share, 3),
        "idle_share_by_rank": {str(r): round(float(v), 3) for r, v in per_rank.iter_rows()},
        "idle_ms_per_step": round(float(s["idle_ns"].median()) / NS_PER_MS, 3),
        "step_ms_median": round(float(s["dur_ns"].median()) / NS_PER_MS, 3),
        "compute_ms_median": round(float(s["compute_ns"].median()) / NS_PER_MS, 3),
        "idle_waiting_on_host": round(float(s["idle_host_ns"].sum()) / idle, 3),
        "idle_waiting_on_kernels": round(float(s["idle_kernel_ns"].sum()) / idle, 3),
        "idle_other": round(float(s["idle_other_ns"].sum()) / idle, 3),
        "queue_depth_median": med("queue_depth"),
        "sync_calls_per_step": med("sync_n"),
        "sync_ms_per_step": round(med("sync_ns") / NS_PER_MS, 3),
        "item_calls_per_step": med("item_n"),
        "launches_per_step": med("launch_n"),
        "launch_ms_per_step": round(med("launch_ns") / NS_PER_MS, 3),
        "small_kernel_share": round(int(h["small_kernel_n"].sum()) / kernels, 3) if kernels else 0.0,
        "kernel_us_median": round(med("kernel_ns_median") / NS_PER_US, 1),
        "input_share": round(float((s["input_ns"] / s["dur_ns"].clip(1)).median()), 3),
    }
    n = per_rank.height
    if on_gpu:
        hint = _hint(ev, th)
        on_host = ev["idle_waiting_on_host"] + ev["idle_waiting_on_kernels"]
        where = (
            f"{ev['idle_waiting_on_host']:.0%} of it with nothing queued (waiting on the host)"
            if on_host >= th.host_on_host_share
            else f"{ev['idle_other']:.0%} of it not explained by an empty queue (work held by syncs or events, "
            "or launches the trace does not link)"
        )
        summary = (
            f"the device sits idle {share:.0%} of the step ({ev['idle_ms_per_step']:.1f} of "
            f"{ev['step_ms_median']:.1f} ms, median over {n} GPU rank{'s' if n != 1 else ''}), {where}; "
            f"launch queue {ev['queue_depth_median']:g} deep. Likeliest fix: {hint}"
        )
        confidence = min(1.0, share / (2 * th.host_idle_share))
        if on_host < th.host_on_host_share and ev["sync_ms_per_step"] < th.host_sync_share * ev["idle_ms_per_step"]:
            confidence *= 0.5
    else:
        hint = (
            "find the untraced host work: profile with with_stack=True (Python frames), move Python work "
            "out of the step, annotate long sections with record_function"
        )
        summary = (
            f"the host runs no traced operator on any thread {share:.0%} of the step ({ev['idle_ms_per_step']:.1f} "
            f"of {ev['step_ms_median']:.1f} ms, median over {n} rank{'s' if n != 1 else ''}; CPU-only trace, so "
            f"the host is the device): Python and framework work between operators. Likeliest fix: {hint}"
        )
        confidence = 0.5 * min(1.0, share / (2 * th.host_idle_share))
    ev["hint"] = hint
    ev["decided_on"] = "gpu" if on_gpu else "host"
    return [
        Finding(
            cause="host_bound",
            ranks=ranks,
            steps=tuple(hit["step"].to_list()),
            time_lost_ns=int(hit["idle"].sum()),
            confidence=confidence,
            summary=summary,
            evidence=ev,
        )
    ]
