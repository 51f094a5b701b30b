"""A finding's evidence for people: each value with its unit, and a sentence saying what it is.

The JSON keeps the flat keys with units in their names (docs/analysis-json.md); the report reads the
unit from the name (``_ms`` ms, ``share`` a share shown as %, ``ratio`` ×, ``gbps`` GB/s, ``bytes``)
and says what the number is from `SENTENCES`, or from the key's own words when it has none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SHARE_KEYS = frozenset({"idle_waiting_on_host", "idle_waiting_on_kernels", "idle_other", "input_share"})
"""Shares whose names do not say so."""

SENTENCES = {
    "kind": "persistent: slow on most steps; transient: on a few",
    "compute_ratio_median": "its compute over its peers' median compute, median over the steps",
    "compute_ratio_by_step": "its compute over its peers' median, per step",
    "compute_ratio_median_all_steps": "the same ratio over every analysed step",
    "compute_ratio": "its compute over its peers' in the windows before its late arrivals",
    "compute_ms_median": "compute per step (median)",
    "peer_compute_ms_median": "its peers' compute per step (median)",
    "peer_wait_ms_median": "how long its peers wait for it per step at the collectives (median)",
    "own_wait_ms_median": "how long it waits for others per step (median)",
    "last_arrivals": "collectives it arrives at last",
    "late_arrivals": "collectives it arrives at late",
    "collectives": "collective instances matched across the ranks",
    "reason": "what its late windows hold more of than its peers'",
    "waiting_share": "share of all the waiting at collectives that waits for it",
    "peer_wait_ms_per_step": "its peers' waiting for it, per step",
    "window_excess_ms": "its windows before its late arrivals minus its peers' median windows, summed",
    "lateness_ms": "its arrivals after the median arrival, summed",
    "compute_excess_ms": "its extra compute in those windows",
    "idle_excess_ms": "its extra idle device time in those windows",
    "framework_ms_by_step": "that framework time per step (what its what-if takes out of its compute)",
    "framework_excess_ms": "of its extra compute, the own time of non-ATen operators (autograd engine, Python-level "
    "ranges) over its peers' in its late steps: host time, not operator work",
    "small_ops_excess_ms": "of its extra compute, operators too small to be arithmetic (its extra operators average "
    "at most a tenth of its peers' mean operator: a per-element loop, .item() reads): host time",
    "small_ops_ms_by_step": "that small-operator time per step (what its what-if takes out of its compute)",
    "input_excess_ms": "its extra data loading in those windows",
    "gc_ms": "its garbage collection in those windows",
    "sync_ms": "its host-device synchronisation in those windows",
    "checkpoint_ms": "its checkpointing in those windows",
    "ops_ratio": "how many compute ops it runs over its peers' in its late steps",
    "op_time_ratio": "the mean duration of the ops both run, its over its peers'",
    "slowest_ops_ratio": "how many compute ops the slowest rank of each uneven step runs over its peers' (median)",
    "compute_kind": "more_ops: it runs more work; same_ops_longer: the same work runs slower",
    "exposed_comm_share_median": "share of the step spent communicating with nothing computing (median)",
    "exposed_comm_share_by_rank": "that share per rank",
    "exposed_comm_ms_median": "exposed communication per step (median)",
    "wait_for_peers_ms_median": "the part of it spent waiting for late peers (median)",
    "outlier_wait_ms_median": "waiting for the outlier ranks found first, left out of the exposed share (median)",
    "step_ms_median": "the step time (median)",
    "collectives_per_step_median": "collectives per step (median)",
    "message_bytes_median": "a collective's message size (median)",
    "busbw_gbps_median": "achieved bus bandwidth (median)",
    "link_gbps": "the link's bandwidth given with --link-gbps",
    "busbw_share_of_peak": "achieved bus bandwidth over the link's",
    "idle_share_median": "share of the step the device is idle (median)",
    "idle_share_by_rank": "that share per rank",
    "idle_share_by_stage": "idle share per pipeline stage",
    "idle_ms_per_step": "device idle time per step",
    "idle_waiting_on_host": "of the idle time: nothing queued, the device waits on the host",
    "idle_waiting_on_kernels": "of the idle time: up to 30 µs between queued kernels (launch latency)",
    "idle_other": "of the idle time: any other reason",
    "expected_bubble_share": "the schedule's ideal bubble (p−1)/(m+p−1)/v",
    "excess_over_ideal": "observed idle share over the ideal bubble",
    "input_share_median": "share of the step's own time (less the waiting for late peers) spent loading data (median)",
    "input_share_by_rank": "that share per rank",
    "input_ms_median": "data loading per step (median)",
    "launches_per_step": "kernel launches per step",
    "launch_ms_per_step": "host time in launch calls per step",
    "sync_calls_per_step": "host-device synchronisations per step",
    "sync_ms_per_step": "host time in them per step",
    "small_kernel_share": "share of kernels shorter than their launch",
    "kernel_us_median": "a kernel's duration (median)",
    "transfer_ratio_median": "its transfers' time over the reference of their size (median)",
    "transfer_ms_median": "its transfer time (median)",
    "peer_transfer_ms_median": "the other links' transfer time at the same sizes (median)",
    "excess_ms_per_step": "its extra transfer time per step",
    "chance": "the chance of that many slower transfers by luck",
    "hint": "the likeliest fix",
    "input_share": "share of the step spent loading data",
    "item_calls_per_step": ".item() calls per step (each waits for the device)",
    "balanced_step_ms_schedule_estimate": "the step with balanced stages by the synchronous-schedule formula",
    "bytes": "the message sizes compared",
    "compute_ms_per_microbatch_by_stage": "compute per micro-batch, per stage",
    "compute_ratio_max": "the largest rank's compute over the median rank's",
    "compute_seq_sq_r": "correlation (Pearson r) of each rank-step's compute with its Σ sequence length²",
    "distinct_slowest_ranks": "how many ranks were the slowest of some step",
    "dp_ranks": "the ranks compared",
    "gap": "its score over the next rank's or pair's",
    "heaviest_on_share": "share of the steps on which this stage is the heaviest",
    "imbalanced_steps": "the steps past the threshold",
    "instances": "transfers compared",
    "lead_idle_ms_median": "idle time at the start of the step (median)",
    "link_ratio_min": "the least transfer ratio over its links (the score)",
    "links": "transfer ratio per link",
    "loader_annotated": "whether a rank records its data loading (false: lead-idle shares stand in)",
    "m": "micro-batches per step",
    "mean_stage_compute_ms_per_microbatch": "the compute per micro-batch balanced stages would have",
    "most_steps_one_rank": "the most steps one rank was the slowest on",
    "operations": "the kinds of transfer compared",
    "ops_difference": "operators or kernels that differ most between this stage and the others",
    "others_wait_ms_median": "how long the other stages wait per step (median)",
    "p": "pipeline stages",
    "peers": "the ranks on its links",
    "rank": "the heavy stage's rank",
    "seq_sq_rank_steps": "rank-steps with both compute and sequence lengths",
    "slower_instances": "of them, those slower than the reference",
    "slowest_drew_most": "steps whose slowest rank drew the longest sequences",
    "slowest_rank_by_step": "the slowest rank, per step",
    "stage": "the heavy stage",
    "stage_ranks": "the ranks in stage order",
    "transfer_ratio_by_step": "its transfers over the reference, per step",
    "v": "virtual stages per rank (interleaving)",
    "decided_on": "gpu: read from the device timeline; host: from the host's (a CPU-only run)",
}
"""What each evidence key means, in a few words (keys without one are read from their own words)."""


RATIO_KEYS = frozenset({"links", "gap"})
"""Ratios whose names do not say so."""


def unit(key: str) -> str:
    """The unit the key's name states: ``ms``, ``µs``, ``%`` (a share), ``×`` (a ratio), ``GB/s``,
    ``bytes`` or ``""``."""
    if key in RATIO_KEYS:
        return "×"
    if key in SHARE_KEYS or "share" in key:
        return "%"
    if "ratio" in key:
        return "×"
    if "_ms" in key:
        return "ms"
    if "_us" in key:
        return "µs"
    if "gbps" in key:
        return "GB/s"
    if "bytes" in key:
        return "bytes"
    return ""


def _one(v: Any, u: str) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if u == "%":
        return f"{100 * v:,.1f}%"
    if u == "×":
        return f"{v:,.2f}×"
    if u == "bytes":
        return f"{v / 2**20:,.1f} MiB" if v >= 2**20 else f"{v:,.0f} B"
    text = f"{v:,}" if isinstance(v, int) else f"{v:,.4g}"
    return f"{text} {u}" if u else text


def _label(key: str, k: Any) -> str:
    if "by_rank" in key:
        return f"rank {k}"
    if "by_step" in key:
        return f"step {k}"
    if "by_stage" in key:
        return f"stage {k}"
    return str(k)


def with_unit(key: str, value: Any, *, limit: int = 24) -> str:
    """`value` as text in the unit `key` names; mappings as ``rank 3: 12.0%`` pieces, lists joined,
    the first `limit` pieces and then a count."""
    u = unit(key)
    if isinstance(value, Mapping):
        items = [f"{_label(key, k)}: {_one(v, u)}" for k, v in value.items()]
    elif isinstance(value, (list, tuple)):
        items = [
            _one(v, u) if not isinstance(v, Mapping) else " ".join(f"{a}={b}" for a, b in v.items()) for v in value
        ]
    else:
        return _one(value, u)
    more = f" … ({len(items):,} in all)" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def sentence(key: str) -> str:
    """What the key's number is: `SENTENCES`, else its own words."""
    return SENTENCES.get(key) or key.replace("_", " ").replace(" ms", "").replace(" us", "")
