"""Step time by part: compute, exposed communication by kind, bubble, optimizer (perf-model.md §3-§6).

Notes
-----
One micro-batch on one pipeline stage costs `layers · t_layer` (+ logits on the last stage), where
`t_layer` is GEMM time (FLOPs over peak · efficiency, the efficiency shrinking for GEMMs with a small
dimension), memory-bound time (elementwise traffic over HBM bandwidth) and exposed TP / CP / EP
communication (α-β model with nccl-tests bus-bandwidth factors). The slowest stage paces the pipeline:
`T = m·t_slowest + Σ_other t_stage / v + PP p2p + exposed DP + optimizer` (PTD-P Takeaway 3 for even
stages).
Ranks are laid out tp, cp, (ep), dp, pp from innermost to outermost (Megatron's default order), so a group of
`n` ranks with stride `k` has `gpus_per_node / k` members per node; a group spanning nodes gets
`min(intra, members_per_node · inter)` bus bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING

from tracediag.model.elementwise import (
    forward_bytes,
    moe_dispatch_bytes,
    te_cp_bytes,
    te_fp8_bytes,
    torch_cp_bytes,
)
from tracediag.model.memory import (
    activation_bytes_per_layer,
    cp_kv_heads,
    layer_params_local,
    stage_params,
)
from tracediag.model.rates import BACKWARD_FLOPS, FP8_GEMM_RATIO, SM_COUNT, attention_rate
from tracediag.model.specs import Split, Training, stage_layers

if TYPE_CHECKING:
    from tracediag.model.specs import DeviceSpec, ModelSpec
    from tracediag.model.stack import Engine

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
    """The bandwidth and latency one process group's collectives get."""

    busbw: float
    """Achieved bus bandwidth, bytes/s."""
    hop_latency: float
    """Seconds per ring hop, averaged over the group's in-node and cross-node hops."""
    link: str
    """Link name, or `intra+inter` when the group spans nodes."""
    overhead: float = 10e-6
    """Fixed seconds per collective (launch and synchronisation)."""
    alltoall_busbw: float = 0.0
    """Bus bandwidth of an all-to-all, bytes/s (0: `busbw`). A ring crosses the network once per node, so its
    members share their node's NICs; an all-to-all sends each rank's off-node share through that rank's own NIC."""


def group_link(device: DeviceSpec, size: int, stride: int, overhead_us: float = 10.0) -> GroupLink:
    """Bus bandwidth and hop latency of a group of `size` ranks `stride` apart.

    A ring over nodes with k members each crosses the network once per node per channel and NCCL runs one
    channel per NIC, so the group gets min(intra, k·inter) (one NIC per GPU), divided by the network's
    oversubscription. A ring's hops move together, so each of its steps costs the slowest hop's latency.
    """
    intra, inter = device.intra_link, device.inter_link
    overhead = overhead_us * 1e-6
    if size * stride <= device.gpus_per_node:
        return GroupLink(busbw=intra.busbw, hop_latency=intra.latency_us * 1e-6, link=intra.name, overhead=overhead)
    per_node = max(1, min(size, device.gpus_per_node // stride))
    net = inter.busbw / device.network_oversubscription
    # All hops of a ring move at once; each step waits for the slowest, a network hop.
    hop = inter.latency_us * 1e-6
    if per_node == 1:
        return GroupLink(busbw=net, hop_latency=hop, link=inter.name, overhead=overhead)
    busbw = min(intra.busbw, per_node * net)
    # All-to-all: each rank sends (n − k)/n of its bytes to other nodes over its NIC and (k − 1)/n over the
    # in-node link, at once; per nccl-tests' (n − 1)/n bus factor that is (n − 1) / max((n − k)/net, (k − 1)/intra).
    a2a = (size - 1) / max((size - per_node) / net, (per_node - 1) / intra.busbw)
    return GroupLink(
        busbw=busbw, hop_latency=hop, link=f"{intra.name}+{inter.name}", overhead=overhead, alltoall_busbw=a2a
    )


def collective_time(kind: str, nbytes: float, size: int, link: GroupLink) -> float:
    """Seconds for one collective of `nbytes` (the full, unsharded size) over `size` ranks.

    Latency: rings take n−1 hops for all-gather / reduce-scatter / all-to-all; all-reduce runs as a tree
    (NCCL picks it at scale), 2·log2(n) hops; send/recv one hop.
    """
    if size <= 1 or nbytes <= 0:
        return 0.0
    if kind == "all_reduce":
        hops = 2 * math.ceil(math.log2(size))
    elif kind == "p2p":
        hops = 1
    else:
        hops = size - 1
    busbw = link.alltoall_busbw if kind == "all_to_all" and link.alltoall_busbw else link.busbw
    return link.overhead + hops * link.hop_latency + nbytes * FACTOR[kind](size) / busbw


def process_group_links(device: DeviceSpec, split: Split, overhead_us: float = 10.0) -> dict[str, GroupLink]:
    """The link each collective kind (tp, cp, ep, dp, pp) runs over, for rank order tp-cp-ep-dp-pp."""
    return {
        "tp": group_link(device, split.tp, 1, overhead_us),
        "cp": group_link(device, split.cp, split.tp, overhead_us),
        # folded over tp, an EP group's ranks are etp apart (Megatron-Core's expert rank order tp-ep-dp)
        "ep": group_link(
            device, split.ep, split.tp * split.cp if split.expert_tp == split.tp else split.expert_tp, overhead_us
        ),
        "dp": group_link(device, split.dp * split.cp, split.tp, overhead_us),
        "pp": group_link(device, 2, split.tp * split.cp * split.dp, overhead_us),
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


def gemm_time(flops: float, min_dim: float, device: DeviceSpec, engine: Engine, dtype: str = "bf16") -> float:
    """Seconds for a GEMM: peak · large-GEMM efficiency, shrinking for a small dimension (tile quantisation)."""
    eff = device.gemm_efficiency * min_dim / (min_dim + engine.gemm_half_dim)
    if dtype == "fp8" and device.fp8_peak_flops > 0:
        return flops / (device.fp8_peak_flops * eff * FP8_GEMM_RATIO.get(device.arch, 0.9))
    return flops / (device.peak_flops * eff)


def _attention_time(
    flops_fwd: float, seq: float, device: DeviceSpec, engine: Engine, model: ModelSpec
) -> tuple[float, float]:
    """(forward, backward) seconds of fused causal attention whose forward does `flops_fwd` (causal half); the
    backward runs `BACKWARD_FLOPS` times that work at its measured rate (the rates' convention)."""
    arch, kernel, dh = device.arch, engine.attention_kernel, model.head_dim
    fwd = flops_fwd / (
        device.peak_flops * device.gemm_efficiency * attention_rate(arch, kernel, seq, dh, backward=False)
    )
    bwd = (
        BACKWARD_FLOPS
        * flops_fwd
        / (device.peak_flops * device.gemm_efficiency * attention_rate(arch, kernel, seq, dh, backward=True))
    )
    return fwd, bwd


@lru_cache(maxsize=65536)
def layer_cost(model: ModelSpec, device: DeviceSpec, engine: Engine, split: Split, train: Training) -> LayerCost:
    """Cost of one transformer layer for one micro-batch (memoised: independent of pp, dp and zero)."""
    t, c, b, s = split.tp, split.cp, train.micro_batch, train.seq_len
    tokens = b * s / c
    h, dh = model.hidden, model.head_dim
    kv_cols = 2 * dh * max(model.groups // t, 1)
    q_cols = model.heads * dh / t
    ffn_cols = model.ffn / t
    # (flops, smallest dimension) of each forward GEMM of the linear layers.
    gemms = [
        (2 * tokens * h * (q_cols + kv_cols), min(tokens, h, q_cols + kv_cols)),
        (2 * tokens * q_cols * h, min(tokens, q_cols, h)),
    ]
    mlp_mats = 3 if model.swiglu else 2
    if model.experts > 1:
        # Each expert-TP group holds etp/t of the tp group's tokens (all of them without folding) and 1/etp of
        # each of its local experts' columns.
        e_tokens = tokens * split.expert_tp / t
        e_cols = model.ffn / split.expert_tp
        per_expert = max(e_tokens * model.top_k * split.ep / model.experts, 1.0) * engine.moe_imbalance
        local_experts = model.experts / split.ep
        gemms.append((2 * per_expert * h * e_cols * mlp_mats * local_experts, min(per_expert, h, e_cols)))
        gemms.append((2 * tokens * h * model.experts, min(tokens, h, model.experts)))
    else:
        gemms.append((2 * tokens * h * ffn_cols * mlp_mats, min(tokens, h, ffn_cols)))
    fwd_gemm = sum(gemm_time(f, n, device, engine, train.dtype) for f, n in gemms)
    attn_flops = 4 * b * (s / c) * s * model.heads * dh / t
    if engine.flash_attention:
        attn_fwd, attn_bwd = _attention_time(attn_flops / 2, s / c, device, engine, model)
        attn_recompute = attn_fwd if train.recompute == "full" else 0.0
    else:
        # Materialised scores: two batched GEMMs (QKᵀ, PV) of inner dimension d_h or s, no causal skipping. Each
        # writes or reads the s×s score matrix of every head, so with d_h below the device's flops-per-byte
        # ratio they run at HBM speed (roofline), not at a tile-limited GEMM rate.
        heads_local = model.heads / t
        score_bytes = 2 * 2 * b * (s / c) * s * heads_local
        attn_fwd = max(
            attn_flops / (device.peak_flops * device.gemm_efficiency),
            score_bytes / (device.hbm_bandwidth * engine.hbm_efficiency),
        )
        attn_bwd = 2 * attn_fwd
        attn_recompute = attn_fwd if train.recompute != "none" else 0.0
    gemm_recompute = {"full": fwd_gemm, "op": fwd_gemm / 2}.get(train.recompute, 0.0)
    attention_core = attn_fwd + attn_bwd + attn_recompute
    gemm = 3 * fwd_gemm + gemm_recompute + attention_core

    bw = device.hbm_bandwidth * engine.hbm_efficiency
    if engine.elementwise_ops:
        traffic = forward_bytes(model, split, train, engine.elementwise_ops)
    else:
        traffic = engine.elementwise_traffic * activation_bytes_per_layer(model, split, train, engine)
    dispatch = moe_dispatch_bytes(model, split, train)  # counted from the dispatcher's code, whatever the block's
    traffic += dispatch
    if train.dtype == "fp8" and not engine.fp8_te_casts:
        traffic *= 1.25  # casts and amax reductions of every GEMM input (Transformer Engine fp8 recipes)
    elementwise_fwd = traffic / bw
    if train.recompute in ("full", "op"):
        ew_recompute = elementwise_fwd
    elif train.recompute == "selective" and not engine.flash_attention:
        no_core = activation_bytes_per_layer(model, split, train, _with_flash(engine))
        kept = engine.elementwise_traffic * no_core + dispatch
        ew_recompute = elementwise_fwd - kept / bw
    else:
        ew_recompute = 0.0
    elementwise = 3 * elementwise_fwd + ew_recompute
    if train.dtype == "fp8" and engine.fp8_te_casts:
        # Transformer Engine's fp8 casts and transposes, counted from its linear layers (model/elementwise.py)
        fp8_fwd, fp8_bwd = te_fp8_bytes(model, split, train)
        fp8_passes = 2 if train.recompute == "full" else 1
        elementwise += (fp8_passes * fp8_fwd + fp8_bwd) / bw
        ew_recompute += (fp8_passes - 1) * fp8_fwd / bw
    if engine.cp_grad_ring_fp32:
        # torch's CP ring merges, accumulates and packs around its attention steps (model/elementwise.py)
        cp_fwd, cp_bwd = torch_cp_bytes(
            model, split, train, compiled=engine.cp_compiled, all_gather=engine.cp_all_gather
        )
        ring_passes = 2 if train.recompute == "full" else 1
        elementwise += (ring_passes * cp_fwd + cp_bwd) / bw
        ew_recompute += (ring_passes - 1) * cp_fwd / bw
    elif engine.cp_te_p2p and not engine.cp_all_gather:
        # Transformer Engine's CP ring merges and accumulates around its attention steps (model/elementwise.py)
        cp_fwd, cp_bwd = te_cp_bytes(model, split, train)
        ring_passes = 2 if train.recompute == "full" else 1
        elementwise += (ring_passes * cp_fwd + cp_bwd) / bw
        ew_recompute += (ring_passes - 1) * cp_fwd / bw

    links = process_group_links(device, split, engine.collective_overhead_us)
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
    cp_comm = 0.0
    if c > 1:
        kv_heads = cp_kv_heads(model, split, engine)
        kv_bytes = 2 * tokens * kv_heads * dh * 2
        passes = 2 if train.recompute == "full" else 1
        if engine.cp_grad_ring_fp32:
            cp_comm = _torch_cp_comm(kv_bytes, c, passes, attn_fwd / c, attn_bwd / c, links["cp"], engine)
        elif engine.cp_all_gather:
            # All-gather K,V of the whole sequence before attention, reduce-scatter their gradients after
            # (Llama 3 §3.3.2); neither overlaps the attention that needs them.
            cp_comm = passes * collective_time("all_gather", c * kv_bytes, c, links["cp"]) + collective_time(
                "reduce_scatter", c * kv_bytes, c, links["cp"]
            )
        else:
            # Ring attention: c−1 steps each pass K,V (forward) or K,V and their gradients (backward) to the
            # next rank while one block of attention computes; a step costs the slower of the two, so what
            # shows is the transfer beyond the block's compute plus every step's latency.
            step_fwd = collective_time("p2p", kv_bytes, 2, links["cp"])
            step_bwd = collective_time("p2p", 2 * kv_bytes, 2, links["cp"])
            block_fwd, block_bwd = (attn_fwd / c, attn_bwd / c)
            cp_comm = (c - 1) * (
                passes * max(step_fwd - block_fwd, 0.0)
                + max(step_bwd - block_bwd, 0.0)
                + (passes + 1) * links["cp"].overhead
            )
    ep_comm = 0.0
    if split.ep > 1:
        t_sp = t if split.sequence_parallel else 1
        # dispatch and combine, forward and backward; full recompute reruns the forward's two
        ep_comm = (
            (6 if train.recompute == "full" else 4)
            * engine.moe_imbalance
            * collective_time("all_to_all", 2 * tokens * model.top_k * h / t_sp, split.ep, links["ep"])
        )
    return LayerCost(
        gemm=gemm,
        elementwise=elementwise,
        recompute=gemm_recompute + attn_recompute + ew_recompute,
        attention_core=attention_core,
        tp_comm=tp_comm,
        tp_comm_raw=tp_comm_raw,
        cp_comm=cp_comm,
        ep_comm=ep_comm,
    )


def _torch_cp_comm(
    kv_bytes: float, c: int, passes: int, step_fwd: float, step_bwd: float, link: GroupLink, engine: Engine
) -> float:
    """Exposed seconds of torch's CP in one layer and micro-batch (`_templated_ring_attention` and its backward,
    torch/distributed/tensor/experimental/_attention.py): every pass (forward, recompute, backward) gets the other
    ranks' K,V, by one all-gather (rotation "allgather") or c−1 hops (rotation "alltoall"); the backward passes
    the fp32 dK,dV of each of its c steps to the next rank. Eager, each collective hides behind the attention
    step it precedes (`step_fwd` / `step_bwd`: one of the c steps) but the backward's last hop, waited on after
    the loop with nothing left to hide behind; compiled (`Engine.cp_compiled`), none hides."""
    grad_hop = collective_time("p2p", 2 * kv_bytes, 2, link)
    if engine.cp_all_gather:
        kv_fetch, fetches = collective_time("all_gather", c * kv_bytes, c, link), 1
    else:
        kv_fetch, fetches = collective_time("p2p", kv_bytes, 2, link), c - 1
    if engine.cp_compiled:
        return (passes + 1) * fetches * kv_fetch + c * grad_hop
    fetch = fetches * (passes * max(kv_fetch - step_fwd, 0.0) + max(kv_fetch - step_bwd, 0.0))
    return fetch + (c - 1) * max(grad_hop - step_bwd, 0.0) + grad_hop


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
    gemm = gemm_time(flops, min(tokens, model.hidden, cols), device, engine)
    loss = engine.loss_bytes_per_logit * tokens * cols / (device.hbm_bandwidth * engine.hbm_efficiency)
    tp = 0.0
    if split.sequence_parallel:
        link = process_group_links(device, split, engine.collective_overhead_us)["tp"]
        act = 2 * tokens * model.hidden
        tp = collective_time("all_gather", act, split.tp, link) + collective_time("reduce_scatter", act, split.tp, link)
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
    """Pipeline fill and drain: one micro-batch of every stage but the slowest, over v ((p−1)/v micro-batch times
    when the stages are even)."""
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
    model: ModelSpec, device: DeviceSpec, split: Split, train: Training, link: GroupLink, engine: Engine
) -> tuple[float, float, float, float, float, float]:
    """Per-step gradient reduce and parameter gather seconds (ZeRO 0-2), and for ZeRO-3 / FSDP (and ZeRO-2 where
    the engine shards per unit, `Engine.zero2_per_unit`) the seconds of one unit's (one layer's) parameter
    all-gather and gradient reduce-scatter, its size in parameters, and the embedding and output layers' traffic
    per micro-batch (ZeRO-3 gathers them twice, ZeRO-2 once).

    Dense weights are replicated over dp·cp ranks, expert weights over `Split.expert_dp` ranks (dp·cp/ep
    unless folded over tp).
    """
    n = split.dp * split.cp
    dense, expert = max((stage_params(model, split, i) for i in {0, split.pp - 1}), key=sum)
    groups = [(dense, n)] + ([(expert, split.expert_dp)] if expert else [])
    reduce_s = gather_s = unit_gather = unit_reduce = unit_params = edge = 0.0
    if _per_unit(split, engine):
        layer_dense, layer_expert = layer_params_local(model, split)
        layers = max(stage_layers(model.layers, split.pp))
        k = engine.zero3_collectives_per_unit
        for params, size in ((layer_dense, n), (layer_expert, split.expert_dp)):
            unit_gather += k * collective_time("all_gather", 2 * params / k, size, link)
            unit_reduce += k * collective_time("reduce_scatter", train.grad_bytes * params / k, size, link)
        unit_params = layer_dense + layer_expert
        rest = max(dense + expert - layers * unit_params, 0.0)
        edge = _gathers(split) * collective_time("all_gather", 2 * rest, n, link) + collective_time(
            "reduce_scatter", train.grad_bytes * rest, n, link
        )
        return 0.0, 0.0, unit_gather, unit_reduce, unit_params, edge
    for params, size in groups:
        if split.zero == 0:
            reduce_s += collective_time("all_reduce", train.grad_bytes * params, size, link)
        else:
            reduce_s += collective_time("reduce_scatter", train.grad_bytes * params, size, link)
            gather_s += collective_time("all_gather", 2 * params, size, link)
    return reduce_s, gather_s, 0.0, 0.0, 0.0, 0.0


def _per_unit(split: Split, engine: Engine) -> bool:
    """Whether the data-parallel traffic is issued unit by unit in every micro-batch: ZeRO-3 / FSDP FULL_SHARD,
    and ZeRO-2 as FSDP's SHARD_GRAD_OP runs it (`Engine.zero2_per_unit`)."""
    return split.zero == 3 or (split.zero == 2 and engine.zero2_per_unit)


def _gathers(split: Split) -> int:
    """Parameter all-gathers per unit and micro-batch: ZeRO-3 gathers again for the backward, per-unit ZeRO-2
    keeps the forward's gathered parameters through the backward."""
    return 2 if split.zero == 3 else 1


def _zero3_exposed(
    unit_gather: float,
    unit_reduce: float,
    unit_params: float,
    t_fwd: float,
    t_bwd: float,
    engine: Engine,
    *,
    backward_gather: bool = True,
) -> float:
    """Exposed seconds of one unit's per-unit sharded traffic in one micro-batch (forward gather, backward
    gather unless the parameters are kept (`backward_gather` False: ZeRO-2 per unit), reduce-scatter), given
    the unit's forward and backward compute.

    The next unit's gather runs while this one computes; only `zero3_prefetch_params` of it can be issued
    ahead (FSDP: all of it; DeepSpeed: its prefetch bucket), the rest waits in line.
    """
    limit = engine.zero3_prefetch_params
    ahead = 1.0 if limit is None or unit_params <= 0 else min(1.0, limit / unit_params)
    if not engine.dp_overlap:
        ahead = 0.0
    fwd = unit_gather * (1 - ahead) + max(0.0, unit_gather * ahead - t_fwd)
    bwd_comm = (unit_gather if backward_gather else 0.0) + unit_reduce
    bwd = bwd_comm * (1 - ahead) + max(0.0, bwd_comm * ahead - t_bwd)
    return fwd + bwd


def step_time(model: ModelSpec, device: DeviceSpec, split: Split, train: Training, engine: Engine) -> TimeBreakdown:
    """Predicted time of one training step."""
    m = train.global_batch // (train.micro_batch * split.dp)
    p, v = split.pp, split.vpp
    lc = layer_cost(model, device, engine, split, train)
    logit_compute, logit_tp = logits_cost(model, device, engine, split, train)
    layers = stage_layers(model.layers, p)
    bw = device.hbm_bandwidth * engine.hbm_efficiency
    embed_grad = engine.embedding_grad_bytes * model.vocab * model.hidden / split.tp / bw
    stage_totals = [
        n * lc.total + (logit_compute + logit_tp if i == p - 1 else 0.0) + (embed_grad if i == 0 else 0.0)
        for i, n in enumerate(layers)
    ]
    slowest = max(range(p), key=stage_totals.__getitem__)
    n_slow = layers[slowest]
    last = slowest == p - 1
    embed_mb = embed_grad if slowest == 0 else 0.0
    t_mb = stage_totals[slowest]
    compute_mb = n_slow * (lc.gemm + lc.elementwise) + (logit_compute if last else 0.0) + embed_mb

    links = process_group_links(device, split, engine.collective_overhead_us)
    exposed_pp = 0.0
    if p > 1:
        sliced = split.tp if engine.p2p_scatter_gather else 1
        act = 2 * train.micro_batch * train.seq_len / split.cp * model.hidden / sliced
        p2p = collective_time("p2p", act, 2, links["pp"])
        transfers = 2 * (v * m + p - 1)
        # Overlapped send/recv still pays its launch; blocking ones stall the stage for the whole transfer.
        exposed_pp = transfers * (links["pp"].overhead if engine.pp_overlap else p2p)

    reduce_s, gather_s, unit_gather, unit_reduce, unit_params, edge = _dp_time(
        model, device, split, train, links["dp"], engine
    )
    if _per_unit(split, engine):
        layer_fwd = (lc.gemm + lc.elementwise) / 3
        zero3 = split.zero == 3
        regather = unit_gather if zero3 and train.recompute == "full" and engine.zero3_regather_on_recompute else 0.0
        per_mb = n_slow * _zero3_exposed(
            unit_gather,
            unit_reduce + regather,
            unit_params,
            layer_fwd,
            2 * layer_fwd,
            engine,
            backward_gather=zero3,
        )
        dp_total = m * (n_slow * (_gathers(split) * unit_gather + regather + unit_reduce) + edge)
        # The first unit's gather and the last reduce-scatter wait in every micro-batch; the embedding and
        # output layers' traffic too.
        exposed_dp = min(dp_total, m * (per_mb + edge + unit_gather))
    elif engine.dp_overlap:
        tail = (reduce_s + gather_s) / max(n_slow, 1)
        exposed_dp = min(
            reduce_s + gather_s,
            tail + max(0.0, reduce_s - 2 / 3 * compute_mb) + max(0.0, gather_s - compute_mb / 3),
        )
        dp_total = reduce_s + gather_s
    else:
        dp_total = exposed_dp = reduce_s + gather_s
    # NCCL runs one channel (thread block) per link it drives and keeps SMs and HBM busy in proportion to the
    # bandwidth it moves: a collective over the network, at a fraction of NVLink's rate, takes that fraction.
    intra = group_link(device, device.gpus_per_node, 1).busbw
    sm_share = {k: min(1.0, link.busbw / intra) for k, link in links.items()}
    dp_overlapped = (dp_total - exposed_dp) * sm_share["dp"]
    tp_overlapped = m * n_slow * (lc.tp_comm_raw - lc.tp_comm)
    if engine.tp_overlap_sms and split.sequence_parallel:
        # Transformer Engine's userbuffers: the reduce-scatters and the two backward re-gathers hold
        # `tp_overlap_sms` SMs while they run, the ring-exchange all-gathers use copy engines.
        units = 6 if train.recompute == "full" else 4
        sm_based = (units + 2) / (2 * units + 2)
        tp_interference = tp_overlapped * sm_based * engine.tp_overlap_sms / SM_COUNT.get(device.arch, 132)
    else:
        tp_interference = engine.overlap_slowdown * tp_overlapped * sm_share["tp"]
    interference = engine.overlap_slowdown * dp_overlapped + tp_interference

    dense, expert = stage_params(model, split, slowest)
    shard = split.dp * split.cp if split.zero >= 1 else 1
    local = dense / shard + expert / (split.expert_dp if split.zero >= 1 else 1)
    # The gradient buffer holds every parameter the device computes, whatever the optimizer's shard (ZeRO-3 shards it).
    buffer = (dense + expert) / (shard if split.zero == 3 else 1)
    optimizer = (local * engine.optimizer_bytes_per_param + buffer * engine.grad_buffer_passes * train.grad_bytes) / bw
    if train.dtype == "fp8" and engine.fp8_te_casts:
        # each weight cast to fp8 and transposed on a step's first micro-batch (read 2, write 1 + 1)
        optimizer += 4 * (dense + expert) / bw

    # 1F1B fill and drain: each other stage's forward and backward once (the slowest stage's m passes are the
    # steady state), split over v virtual chunks. Uniform stages give (p−1)/v·t (PTD-P Takeaway 3); a heavier
    # last stage (the logits) paces the steady state without lengthening the fill.
    bubble = (sum(stage_totals) - t_mb) / v
    tp_mb = n_slow * lc.tp_comm + (logit_tp if last else 0.0)
    gpus = split.gpus
    slowest_device = 1 + device.speed_variation * math.sqrt(2 * math.log(gpus)) if gpus > 1 else 1.0
    compute = (m * compute_mb + interference) * slowest_device
    step = compute + m * (tp_mb + n_slow * (lc.cp_comm + lc.ep_comm)) + bubble + exposed_pp + exposed_dp + optimizer
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
        elementwise_s=m * (n_slow * lc.elementwise + embed_mb),
        recompute_s=m * n_slow * lc.recompute,
        tp_comm_s=m * (n_slow * lc.tp_comm_raw + (logit_tp if last else 0.0)),
        interference_s=interference,
        dp_comm_s=dp_total,
        micro_batches=m,
    )
