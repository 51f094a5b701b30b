"""Achieved kernel rates by device generation: GEMMs by shape and dtype, fused attention by sequence length and
head dimension (perf-model.md §5).

Notes
-----
These are measurements, not fits: each table cites the published microbenchmark it was read from. Attention
efficiencies are causal, forward and backward separately, as a fraction of the device's dense bf16 peak; the
FlashAttention papers count causal FLOPs as half the full s² work, as the model does, and count the backward
pass as 2.5 × the forward's FLOPs (it recomputes the scores: five matmuls to the forward's two;
Dao-AILab/flash-attention `benchmarks/benchmark_flash_attention.py`, `flops(..., mode="bwd") = 2.5 * f`, and
`hopper/benchmark_attn.py` for FA2, FA3 and cuDNN alike), so the backward's time is `BACKWARD_FLOPS` × the
forward's FLOPs over the backward rate. Values between the
tabulated sequence lengths are interpolated in log(s); beyond them the end values hold. Figures were read off
plots, so they carry about ±5% reading error.

The attention rates are stored relative to the generation's large-GEMM efficiency, so scaling a device's
`gemm_efficiency` (a calibration profile does) scales attention the same way.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AttentionCurve:
    """Achieved causal attention rate (fraction of dense bf16 peak) at head dimension 128."""

    seq: tuple[int, ...]
    forward: tuple[float, ...]
    backward: tuple[float, ...]
    source: str

    def rate(self, seq_len: float, *, backward: bool) -> float:
        """Fraction of peak at `seq_len`, interpolated in log(seq_len)."""
        ys = self.backward if backward else self.forward
        x = math.log(max(seq_len, 1.0))
        xs = [math.log(s) for s in self.seq]
        if x <= xs[0]:
            return ys[0]
        if x >= xs[-1]:
            return ys[-1]
        i = bisect.bisect_right(xs, x)
        w = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
        return ys[i - 1] + w * (ys[i] - ys[i - 1])


_SEQ = (512, 1024, 2048, 4096, 8192, 16384)

BACKWARD_FLOPS = 2.5
"""Backward FLOPs per forward FLOP in the FlashAttention benchmarks' rate convention (see Notes)."""

ATTENTION: dict[tuple[str, str], AttentionCurve] = {
    # FlashAttention-2 on A100 80GB SXM4, bf16, causal, head dim 128: Dao 2023, "FlashAttention-2", Figures 4-6
    # (forward ~130 → ~225 TFLOP/s, backward ~110 → ~190 TFLOP/s of 312 from 512 to 16k tokens).
    ("ampere", "fa2"): AttentionCurve(
        _SEQ,
        (0.42, 0.53, 0.61, 0.66, 0.70, 0.72),
        (0.35, 0.45, 0.52, 0.57, 0.60, 0.61),
        "Dao 2023 (FlashAttention-2), A100 80GB causal hd128, Fig. 4-6",
    ),
    # FlashAttention-2 on H100 SXM5: Shah et al. 2024, "FlashAttention-3", Figure 5/7 baselines (forward
    # ~200 → ~350 TFLOP/s, backward ~180 → ~300 TFLOP/s of 989).
    ("hopper", "fa2"): AttentionCurve(
        _SEQ,
        (0.20, 0.26, 0.30, 0.33, 0.345, 0.355),
        (0.18, 0.23, 0.27, 0.29, 0.30, 0.31),
        "Shah et al. 2024 (FlashAttention-3), FA2 baseline on H100 SXM5 causal hd128, Fig. 5 and 7",
    ),
    # FlashAttention-3 / cuDNN 9 fused attention on H100 SXM5, bf16, causal, head dim 128: Shah et al. 2024,
    # Figures 5 and 7 (forward ~300 → ~640 TFLOP/s, backward ~250 → ~520 TFLOP/s); cuDNN 9 is within a few
    # percent of FA3 in the same figures. Transformer Engine (Megatron-Core) uses cuDNN's kernel.
    ("hopper", "fa3"): AttentionCurve(
        _SEQ,
        (0.30, 0.42, 0.53, 0.59, 0.63, 0.65),
        (0.25, 0.33, 0.40, 0.45, 0.49, 0.52),
        "Shah et al. 2024 (FlashAttention-3), H100 SXM5 causal hd128, Fig. 5 and 7",
    ),
    # MI300X with the CK / Triton FlashAttention-2 ports: AMD ROCm blog "FlashAttention on MI300X" (2024),
    # forward ~300-450 TFLOP/s of 1307 at long sequences; backward about 0.8 of forward.
    ("cdna3", "fa2"): AttentionCurve(
        _SEQ,
        (0.16, 0.22, 0.27, 0.31, 0.33, 0.34),
        (0.13, 0.18, 0.22, 0.25, 0.27, 0.28),
        "AMD ROCm blog 2024, FlashAttention-2 (CK) on MI300X; backward taken as 0.8 of forward",
    ),
}
"""Attention curves by (generation, kernel). Blackwell uses Hopper's FA3 curve until a published one exists."""

TRITON_FWD_BWD_BARS = {
    "triton": (50, 61, 68, 74, 78, 80),
    "fa2": (99, 133, 155, 173, 182, 189),
}
"""Forward + backward TFLOP/s (3.5 × forward FLOPs over the time) at `_SEQ`, A100 80GB SXM4, causal, head dim 128:
FlashAttention in Triton against FlashAttention-2, Dao 2023 Figure 4(d) = flash-attention
`assets/flash2_a100_fwd_bwd_benchmark.png` (d). The bars are OpenAI's `triton.ops.flash_attention` (the kernel
flash-attention's `benchmarks/benchmark_flash_attention.py`, 60499abc, times on the figure's grid), not Tri Dao's
`flash_attn_triton.py` that llm-foundry's `attn_impl: triton` copies; no rate of that one is published, and its
header says what these bars also show against FlashAttention v1's (`FA1_FWD_BWD_BARS`): on A100 its forward +
backward is "slightly slower" than v1's. They stand in for it."""

TRITON_FORWARD_SLOWDOWN = 1.4
"""FlashAttention-2's forward runs "around 1.3-1.5×" faster than FlashAttention in Triton, its backward about 2×
(Dao 2023 §4.1): the Triton forward keeps most of the speed, its backward loses it."""


def _triton_curve(fa2: AttentionCurve, source: str) -> AttentionCurve:
    """The Triton kernel from `fa2`: forward at fa2's over `TRITON_FORWARD_SLOWDOWN`, backward whatever makes the
    forward + backward rate the measured bars' ratio times fa2's own (so the bars hold whatever the split)."""
    fwd, bwd = [], []
    for f2, b2, t, r in zip(fa2.forward, fa2.backward, *TRITON_FWD_BWD_BARS.values(), strict=True):
        combined = (t / r) * (1 + BACKWARD_FLOPS) / (1 / f2 + BACKWARD_FLOPS / b2)
        f = f2 / TRITON_FORWARD_SLOWDOWN
        fwd.append(f)
        bwd.append(BACKWARD_FLOPS / ((1 + BACKWARD_FLOPS) / combined - 1 / f))
    return AttentionCurve(fa2.seq, tuple(fwd), tuple(bwd), source)


ATTENTION[("ampere", "triton")] = _triton_curve(
    ATTENTION[("ampere", "fa2")], "Dao 2023 Fig. 4(d) FlashAttention Triton bars over FA2's, A100; forward §4.1"
)
# No published H100 rate: the pre-MLIR Triton (llm-foundry's triton-pre-mlir sm90 build) and FlashAttention-2
# both issue Ampere-style mma.sync on Hopper, so the A100 ratio to FA2 is carried over.
ATTENTION[("hopper", "triton")] = _triton_curve(
    ATTENTION[("hopper", "fa2")], "A100 Triton/FA2 bar ratio (Dao 2023 Fig. 4(d)) on the H100 FA2 curve"
)

FA1_FWD_BWD_BARS = {
    "ampere": ((55, 62, 69, 76, 80, 83), (99, 133, 155, 173, 182, 189)),
    "hopper": ((98, 109, 108, 126, 135, 137), (163, 221, 265, 294, 308, 328)),
}
"""Forward + backward TFLOP/s of FlashAttention (v1) and FlashAttention-2 at `_SEQ`, causal, head dim 128:
flash-attention `assets/flash2_a100_fwd_bwd_benchmark.png` (d) (= Dao 2023 Fig. 4 (d)), A100 80GB SXM4, and
`assets/flash2_h100_fwd_bwd_benchmark.png` (d), H100 80GB SXM5 (the bars' printed labels)."""


def _scaled_curve(
    fa2: AttentionCurve, bars: tuple[tuple[float, ...], tuple[float, ...]], source: str
) -> AttentionCurve:
    """A kernel measured only forward + backward: fa2's forward and backward rates times the bars' ratio to fa2's
    bar at each length (the split between the passes is fa2's; the combined rate is the measured bar's)."""
    ratios = [k / f for k, f in zip(*bars, strict=True)]
    fwd = tuple(f * r for f, r in zip(fa2.forward, ratios, strict=True))
    bwd = tuple(b * r for b, r in zip(fa2.backward, ratios, strict=True))
    return AttentionCurve(fa2.seq, fwd, bwd, source)


# FlashAttention v1 (`flash_attn_unpadded_func`, the API Megatron-LM called from 285068c8, January 2023, until
# FlashAttention-2's rename in July 2023).
for _arch, _bars in FA1_FWD_BWD_BARS.items():
    ATTENTION[(_arch, "fa1")] = _scaled_curve(
        ATTENTION[(_arch, "fa2")], _bars, f"FlashAttention v1 bars over FA2's ({_arch}), flash2_*_fwd_bwd (d)"
    )

TE_CUDNN_FWD_BWD_MS = {2048: (0.5415, 0.7496), 8192: (12.0122, 19.0716)}
"""cuDNN attention against flash-attn, forward + backward milliseconds, as Transformer Engine measured them for its
own backends: TE v1.8 `docs/examples/attention/attention.ipynb` (June 2024, "As of Transformer Engine 1.7, cuDNN 9.0
and flash-attn 2.4.2"), `benchmarks/attention/benchmark_attention.py` on an H100 PCIe, bf16, training: test_1 (batch
2, 16 heads, head dim 128, 2K causal) and test_3 (batch 2, 32 heads in 4 KV groups, head dim 128, 8K causal). These
are the cuDNN and TE that Megatron-Core r0.8 and NeMo 24.07 ran (TE 1.7-1.8 picks cuDNN on sm90); the FlashAttention-3
paper's cuDNN bars (the `fa3` curve) are a later cuDNN's, 1.55-1.68x FA2 where this one is 1.38-1.59x."""


def _te_cudnn_ratios() -> tuple[float, ...]:
    """The speed of cuDNN over flash-attn at `_SEQ`: TE's two measured lengths, interpolated in log(s), held beyond."""
    (s0, (c0, f0)), (s1, (c1, f1)) = sorted(TE_CUDNN_FWD_BWD_MS.items())
    r0, r1 = f0 / c0, f1 / c1
    w = [min(1.0, max(0.0, math.log(s / s0) / math.log(s1 / s0))) for s in _SEQ]
    return tuple(r0 + x * (r1 - r0) for x in w)


# Transformer Engine's cuDNN attention (`--attention cudnn`, Megatron-Core's): FA2's H100 curve times TE's measured
# speed-up over flash-attn (the split between the passes is FA2's).
ATTENTION[("hopper", "cudnn")] = _scaled_curve(
    ATTENTION[("hopper", "fa2")],
    (_te_cudnn_ratios(), (1.0,) * len(_SEQ)),
    "TE 1.7 / cuDNN 9.0 over flash-attn 2.4.2 (TE docs attention.ipynb) on the H100 FA2 curve",
)

HEAD_DIM_FACTOR = {64: 0.80, 128: 1.0, 256: 1.05}
"""Rate at head dimension d relative to d = 128 (FA2 and FA3 papers: hd64 runs 15-25% slower)."""

GEMM_EFFICIENCY_BF16 = {
    # cuBLAS bf16 on large square GEMMs: A100 SXM ~250 of 312 TFLOP/s (NVIDIA "Matrix Multiplication Background
    # User's Guide", A100 curves; Megatron-LM PTD-P §5 reports 252 TFLOP/s for its largest GEMMs).
    "ampere": 0.80,
    # H100 SXM at 700 W: ~650-700 of 989 TFLOP/s sustained (Luo et al. 2024, "Benchmarking and Dissecting the
    # Nvidia Hopper GPU Architecture"; clocks drop under sustained tensor-core load).
    "hopper": 0.68,
    # B200: NVIDIA's published GEMM microbenchmarks at launch reach ~1.5 of 2.25 PFLOP/s dense bf16.
    "blackwell": 0.67,
    # MI300X hipBLASLt bf16: ~700 of 1307 TFLOP/s (Chips and Cheese / SemiAnalysis MI300X benchmarks, 2024).
    "cdna3": 0.55,
}
"""Large-GEMM bf16 efficiency by generation (the preset devices' `gemm_efficiency`)."""

SM_COUNT = {"ampere": 108, "hopper": 132, "blackwell": 148, "cdna3": 304}
"""Streaming multiprocessors (CDNA: compute units) of each generation's SXM/OAM part: A100 108, H100 SXM5 132
(NVIDIA A100 and H100 architecture whitepapers), B200 148 (two 74-SM dies), MI300X 304 CUs (AMD CDNA 3 white
paper). Only the share a communication kernel takes of them is read (`Engine.tp_overlap_sms`)."""

FP8_GEMM_RATIO = {"hopper": 0.62 / 0.68, "blackwell": 0.62 / 0.67, "cdna3": 0.45 / 0.55, "ampere": 0.0}
"""fp8 GEMM efficiency (of fp8 dense peak) relative to bf16's (of bf16 peak): H100 cuBLASLt fp8 reaches
~1,200-1,300 of 1,979 TFLOP/s (NVIDIA Transformer Engine docs, Luo et al. 2024). Ampere has no fp8."""


def attention_rate(arch: str, kernel: str, seq_len: float, head_dim: int, *, backward: bool) -> float:
    """Achieved causal attention rate as a fraction of the generation's large-GEMM efficiency."""
    curve = ATTENTION.get((arch, kernel))
    if curve is None:
        curve = ATTENTION.get(
            ("hopper", kernel) if arch == "blackwell" else (arch, "fa2"), ATTENTION[("ampere", "fa2")]
        )
    d = min(HEAD_DIM_FACTOR, key=lambda k: abs(math.log(k / max(head_dim, 1))))
    base = GEMM_EFFICIENCY_BF16.get(arch, 0.7)
    return min(1.0, curve.rate(seq_len, backward=backward) * HEAD_DIM_FACTOR[d] / base)
