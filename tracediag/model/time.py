"""Step time by part: compute, exposed communication by kind, bubble, optimizer (perf-model.md §3-§6).

Notes
-----
One micro-batch on one pipeline stage costs `layers · t_layer` (+ logits on the last stage), where
`t_layer` is GEMM time (FLOPs over peak · efficiency, the efficiency shrinking for GEMMs with a small
dimension), memory-bound time (elementwise traffic over HBM bandwidth) and exposed TP / CP / EP
communication (α-β model with nccl-tests bus-bandwidth factors). The slowest stage paces the pipeline:
`T = (m + (p−1)/v)·t_stage + PP p2p + exposed DP + optimizer` (PTD-P Takeaway 3).
Ranks are laid out tp, cp, (ep), dp, pp from innermost to outermost (Megatron's default order), so a group of
`n` ranks with stride `k` has `gpus_per_node / k` members per node; a group spanning nodes gets
`min(intra, members_per_node · inter)` bus bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING

from tracediag.model.memory import activation_bytes_per_layer, stage_params
from tracediag.model.specs import Split, Training, stage_layers

if TYPE_CHECKING:
    from tracediag.model.engine import Engine
    from tracediag.model.specs import DeviceSpec, ModelSpec

FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "p2p": lambda n: 1.0,
}
"""nccl-tests bus-bandwidth factor per collective (doc/PERFORMANCE.md)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class GroupLink:
    """The bandwidth one process group's collectives get."""

    busbw: float
    """Achieved bus bandwidth, bytes/s."""
    latency: float
    """Seconds per collective step."""
    link: str
    """Link name, or `intra+inter` when the group spans nodes."""


def group_link(device: DeviceSpec, size: int, stride: int) -> GroupLink:
    """Bus bandwidth of a group of `size` ranks `stride` apart."""
    intra, inter = device.intra_link, device.inter_link
    if size * stride <= device.gpus_per_node:
        return GroupLink(busbw=intra.busbw, latency=intra.latency_us * 1e-6, link=intra.name)
    per_node = max(1, device.gpus_per_node // stride)
    if per_node == 1:
        return GroupLink(busbw=inter.busbw, latency=inter.latency_us * 1e-6, link=inter.name)
    busbw = min(intra.busbw, per_node * inter.busbw)
    return GroupLink(busbw=busbw, latency=inter.latency_us * 1e-6, link=f"{intra.name}+{inter.name}")


def collective_time(kind: str, nbytes: float, size: int, link: GroupLink) -> float:
    """Seconds for one collective of `nbytes` (the full, unsharded size) over `size` ranks."""
    if size <= 1 or nbytes <= 0:
        return 0.0
    return link.latency * (1 + math.log2(size)) + nbytes * FACTOR[kind](size) / link.busbw


def process_group_links(device: DeviceSpec, split: Split) -> dict[str, GroupLink]:
    """The link each collective kind (tp, cp, ep, dp, pp) runs over, for rank order tp-cp-ep-dp-pp."""
    return {
        "tp": group_link(device, split.tp, 1),
        "cp": group_link(device, split.cp, split.tp),
        "ep": group_link(device, split.ep, split.tp * split.cp),
        "dp": group_link(device, split.dp * split.cp, split.tp),
        "pp": group_link(device, 2, split.tp * split.cp * split.dp),
    }


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerCost:
    """Seconds one layer costs for one micro-batch (forward + backward + recompute) on one device."""

    gemm: float
    elementwise: float
    recompute: float
    """Part of `gemm + elementwise` spent recomputing the forward pass."""
    attention_core: float
    tp_comm: float
    """Exposed TP collective time (all of it unless the engine overlaps TP communication)."""
    tp_comm_raw: float
    """TP collective time before overlap."""
    cp_comm: float
    ep_comm: float

    @property
    def total(self) -> float:
        """Compute plus exposed communication."""
        return self.gemm + self.elementwise + self.tp_comm + self.cp_comm + self.ep_comm


def _gemm_time(flops: float, min_dim: float, device: DeviceSpec, engine: Engine) -> float:
    eff = device.gemm_efficiency * min_dim / (min_dim + engine.gemm_half_dim)
    return flops / (device.peak_flops * eff)


@lru_cache(maxsize=65536)
def layer_cost(
    model: ModelSpec, device: DeviceSpec, engine: Engine, split: Split, train: Training
) -> LayerCost:
    """Cost of one transformer layer for one micro-batch (memoised: independent of pp, dp and zero)."""
    t, c, b, s = split.tp, split.cp, train.micro_batch, train.seq_len
    tokens = b * s / c
    h, dh = model.hidden, model.head_dim
    kv_cols = 2 * dh * max(model.groups // t, 1)
    q_cols = model.heads * dh / t
    ffn_cols = model.ffn / t
    # (flops, smallest dimension) of each forward GEMM.
    gemms = [
        (2 * tokens * h * (q_cols + kv_cols), min(tokens, h, q_cols + kv_cols)),
        (2 * tokens * q_cols * h, min(tokens, q_cols, h)),
    ]
    mlp_mats = 3 if model.swiglu else 2
    if model.experts > 1:
        per_expert = max(tokens * model.top_k * split.ep / model.experts, 1.0)
        local_experts = model.experts / split.ep
        gemms.append((2 * per_expert * h * ffn_cols * mlp_mats * local_experts, min(per_expert, h, ffn_cols)))
        gemms.append((2 * tokens * h * model.experts, min(tokens, h, model.experts)))
    else:
        gemms.append((2 * tokens * h * ffn_cols * mlp_mats, min(tokens, h, ffn_cols)))
    fwd_gemm = sum(_gemm_time(f, n, device, engine) for f, n in gemms)
    attn_flops = 4 * b * (s / c) * s * model.heads * dh / t
    if engine.flash_attention:
        attn_flops /= 2  # causal blocks skipped
        attn_fwd = _gemm_time(attn_flops, dh, device, engine)
        attn_mult, attn_recompute = 3.5, (1.0 if train.recompute == "full" else 0.0)
    else:
        attn_fwd = _gemm_time(attn_flops, dh, device, engine)
        attn_mult, attn_recompute = 3.0, (1.0 if train.recompute != "none" else 0.0)
    gemm_recompute = fwd_gemm if train.recompute == "full" else 0.0
    gemm = 3 * fwd_gemm + gemm_recompute + (attn_mult + attn_recompute) * attn_fwd

    bw = device.hbm_bandwidth * engine.hbm_efficiency
    traffic = engine.elementwise_traffic * activation_bytes_per_layer(model, split, train, engine)
    elementwise_fwd = traffic / bw
    if train.recompute == "full":
        ew_recompute = elementwise_fwd
    elif train.recompute == "selective" and not engine.flash_attention:
        no_core = activation_bytes_per_layer(model, split, train, _with_flash(engine))
        ew_recompute = elementwise_fwd - engine.elementwise_traffic * no_core / bw
    else:
        ew_recompute = 0.0
    elementwise = 3 * elementwise_fwd + ew_recompute

    links = process_group_links(device, split)
    act = 2 * tokens * h
    if split.sequence_parallel:
        unit = collective_time("all_gather", act, t, links["tp"]) + collective_time(
            "reduce_scatter", act, t, links["tp"]
        )
    else:
        unit = collective_time("all_reduce", act, t, links["tp"])
    tp_comm_raw = unit * (6 if train.recompute == "full" else 4)
    if split.sequence_parallel:
        # Megatron keeps only the sequence shard of each column-parallel input and all-gathers it again in
        # the backward pass for the weight gradient: two more all-gathers per layer.
        tp_comm_raw += 2 * collective_time("all_gather", act, t, links["tp"])
    tp_comm = max(0.0, tp_comm_raw - gemm) if engine.tp_overlap else tp_comm_raw
    kv_bytes = 2 * tokens * model.groups * dh * 2
    cp_comm = 3 * (c - 1) * collective_time("p2p", kv_bytes, 2, links["cp"]) if c > 1 else 0.0
    attention_core = (attn_mult + attn_recompute) * attn_fwd
    cp_comm = max(0.0, cp_comm - attention_core)
    ep_comm = 0.0
    if split.ep > 1:
        t_sp = t if split.sequence_parallel else 1
        ep_comm = 4 * collective_time(
            "all_to_all", 2 * tokens * model.top_k * h / t_sp, split.ep, links["ep"]
        )
    return LayerCost(
        gemm=gemm,
        elementwise=elementwise,
        recompute=gemm_recompute + attn_recompute * attn_fwd + ew_recompute,
        attention_core=attention_core,
        tp_comm=tp_comm,
        tp_comm_raw=tp_comm_raw,
        cp_comm=cp_comm,
        ep_comm=ep_comm,
    )


def _with_flash(engine: Engine) -> Engine:
    return replace(engine, flash_attention=True)


@lru_cache(maxsize=65536)
def logits_cost(
    model: ModelSpec, device: DeviceSpec, engine: Engine, split: Split, train: Training
) -> tuple[float, float, float]:
    """(compute seconds, exposed TP seconds) of output layer + loss, one micro-batch."""
    tokens = train.micro_batch * train.seq_len / split.cp
    cols = model.vocab / split.tp
    flops = 3 * 2 * tokens * model.hidden * cols
    gemm = _gemm_time(flops, min(tokens, model.hidden, cols), device, engine)
    loss = 3 * 6 * tokens * cols / (device.hbm_bandwidth * engine.hbm_efficiency)
    tp = 0.0
    if split.sequence_parallel:
        link = process_group_links(device, split)["tp"]
        act = 2 * tokens * model.hidden
        tp = collective_time("all_gather", act, split.tp, link) + collective_time(
            "reduce_scatter", act, split.tp, link
        )
    return gemm + loss, tp


@dataclass(frozen=True, kw_only=True, slots=True)
class TimeBreakdown:
    """Seconds per training step; the first eight fields add up to `step_time_s`."""

    compute_s: float
    """GEMMs, attention and memory-bound kernels of the slowest stage, m micro-batches, recompute included."""
    exposed_tp_s: float
    exposed_cp_s: float
    exposed_ep_s: float
    exposed_pp_s: float
    """Pipeline send/recv on the critical path."""
    exposed_dp_s: float
    """Gradient reduce and parameter gather not hidden behind compute."""
    bubble_s: float
    """Pipeline fill and drain: (p−1)/v micro-batch times."""
    optimizer_s: float
    step_time_s: float
    gemm_s: float
    """Part of `compute_s` in GEMMs and attention."""
    elementwise_s: float
    """Part of `compute_s` in memory-bound kernels."""
    recompute_s: float
    """Part of `compute_s` spent recomputing activations."""
    interference_s: float
    """Part of `compute_s` lost to communication running underneath (`Engine.overlap_slowdown`)."""
    tp_comm_s: float
    """TP collective time per step before overlap (the exposed part is in `exposed_tp_s`)."""
    dp_comm_s: float
    """DP collective time per step before overlap."""
    micro_batches: int
    """Micro-batches per step per pipeline (m)."""

    def to_dict(self) -> dict[str, float]:
        """Plain dict."""
        return asdict(self)


def _dp_time(
    model: ModelSpec, device: DeviceSpec, split: Split, train: Training, link: GroupLink
) -> tuple[float, float, float]:
    """(per-step gradient reduce, per-step parameter gather, per-micro-batch ZeRO-3 traffic) seconds.

    Dense weights are replicated over dp·cp ranks, expert weights over dp·cp/ep ranks.
    """
    n = split.dp * split.cp
    dense, expert = max((stage_params(model, split, i) for i in {0, split.pp - 1}), key=sum)
    groups = [(dense, n)] + ([(expert, n // split.ep)] if expert else [])
    reduce_s = gather_s = per_mb = 0.0
    for params, size in groups:
        if split.zero == 3:
            per_mb += 2 * collective_time("all_gather", 2 * params, size, link) + collective_time(
                "reduce_scatter", train.grad_bytes * params, size, link
            )
        elif split.zero == 0:
            reduce_s += collective_time("all_reduce", train.grad_bytes * params, size, link)
        else:
            reduce_s += collective_time("reduce_scatter", train.grad_bytes * params, size, link)
            gather_s += collective_time("all_gather", 2 * params, size, link)
    return reduce_s, gather_s, per_mb


def step_time(
    model: ModelSpec, device: DeviceSpec, split: Split, train: Training, engine: Engine
) -> TimeBreakdown:
    """Predicted time of one training step."""
    m = train.global_batch // (train.micro_batch * split.dp)
    p, v = split.pp, split.vpp
    lc = layer_cost(model, device, engine, split, train)
    logit_compute, logit_tp = logits_cost(model, device, engine, split, train)
    layers = stage_layers(model.layers, p)
    stage_totals = [
        n * lc.total + (logit_compute + logit_tp if i == p - 1 else 0.0) for i, n in enumerate(layers)
    ]
    slowest = max(range(p), key=stage_totals.__getitem__)
    n_slow = layers[slowest]
    last = slowest == p - 1
    t_mb = stage_totals[slowest]
    compute_mb = n_slow * (lc.gemm + lc.elementwise) + (logit_compute if last else 0.0)

    links = process_group_links(device, split)
    p2p = (
        collective_time(
            "p2p", 2 * train.micro_batch * train.seq_len / split.cp * model.hidden / split.tp, 2, links["pp"]
        )
        if p > 1
        else 0.0
    )
    exposed_pp = 2 * p2p * (v * m + p - 1) if p > 1 else 0.0

    reduce_s, gather_s, zero3_mb = _dp_time(model, device, split, train, links["dp"])
    dp_total = reduce_s + gather_s + m * zero3_mb
    if engine.dp_overlap:
        tail = (reduce_s + gather_s + zero3_mb) / max(n_slow, 1)
        exposed_dp = min(
            dp_total,
            tail
            + max(0.0, reduce_s - 2 / 3 * compute_mb)
            + max(0.0, gather_s - compute_mb / 3)
            + m * max(0.0, zero3_mb - compute_mb),
        )
    else:
        exposed_dp = dp_total
    overlapped = dp_total - exposed_dp + m * n_slow * (lc.tp_comm_raw - lc.tp_comm)
    interference = engine.overlap_slowdown * overlapped

    dense, expert = stage_params(model, split, slowest)
    shard = split.dp * split.cp if split.zero >= 1 else 1
    local = dense / shard + expert / (max(shard // split.ep, 1) if split.zero >= 1 else 1)
    optimizer = local * engine.optimizer_bytes_per_param / (device.hbm_bandwidth * engine.hbm_efficiency)

    bubble = (p - 1) / v * t_mb
    tp_mb = n_slow * lc.tp_comm + (logit_tp if last else 0.0)
    compute = m * compute_mb + interference
    step = (
        compute
        + m * (tp_mb + n_slow * (lc.cp_comm + lc.ep_comm))
        + bubble
        + exposed_pp
        + exposed_dp
        + optimizer
    )
    return TimeBreakdown(
        compute_s=compute,
        exposed_tp_s=m * tp_mb,
        exposed_cp_s=m * n_slow * lc.cp_comm,
        exposed_ep_s=m * n_slow * lc.ep_comm,
        exposed_pp_s=exposed_pp,
        exposed_dp_s=exposed_dp,
        bubble_s=bubble,
        optimizer_s=optimizer,
        step_time_s=step,
        gemm_s=m * (n_slow * lc.gemm + (logit_compute if last else 0.0)),
        elementwise_s=m * n_slow * lc.elementwise,
        recompute_s=m * n_slow * lc.recompute,
        tp_comm_s=m * (n_slow * lc.tp_comm_raw + (logit_tp if last else 0.0)),
        interference_s=interference,
        dp_comm_s=dp_total,
        micro_batches=m,
    )
