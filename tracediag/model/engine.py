"""What the training software does: kernels, overlap, and the global efficiency parameters.

The numbers here are the only tuned constants of the model besides each device's `gemm_efficiency`. They are
global (never per run) and each has a physical meaning; docs/model.md says how they were chosen.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tracediag.errors import SpecError


@dataclass(frozen=True, kw_only=True, slots=True)
class Engine:
    """Software features and efficiency parameters of the training stack."""

    name: str = "modern"
    flash_attention: bool = True
    """Fused attention (FlashAttention): no s×s score tensors in memory, causal blocks skipped."""
    tp_overlap: bool = False
    """Tensor-parallel collectives hidden behind GEMMs (Megatron --tp-comm-overlap, torchtitan async TP)."""
    dp_overlap: bool = True
    """Gradient reduce-scatter / parameter all-gather overlapped with backward / forward compute."""
    overlap_slowdown: float = 0.5
    """Compute slowdown while overlapped communication runs, as a share of that communication's time (NCCL
    kernels take SMs and HBM bandwidth; Echo, arXiv 2412.12487; Ultra-Scale Playbook)."""
    gemm_half_dim: float = 80.0
    """GEMM tile efficiency: a GEMM whose smallest dimension is n runs at gemm_efficiency·n/(n + this)."""
    hbm_efficiency: float = 0.8
    """Fraction of HBM bandwidth that memory-bound kernels (norms, activations, softmax, Adam) reach."""
    elementwise_traffic: float = 2.0
    """HBM bytes moved by non-GEMM kernels in the forward pass per byte of stored activation (write + read);
    the backward pass moves twice as much."""
    optimizer_bytes_per_param: float = 38.0
    """HBM traffic of one mixed-precision Adam update per parameter: read grad (4) + master, m, v (12),
    write master, m, v (12) + bf16 weight (2), grad-norm read (4) and zeroing (4)."""
    memory_reserved_bytes: float = 2.0 * 2**30
    """CUDA context, NCCL buffers and workspace not counted by the formulas."""
    fragmentation: float = 0.05
    """Extra share of activation memory lost to allocator fragmentation."""

    def __post_init__(self) -> None:
        for name in ("hbm_efficiency",):
            value = getattr(self, name)
            if not 0 < value <= 1:
                msg = f"{name} must be in (0, 1], got {value}"
                raise SpecError(msg)


ENGINES = {
    # Megatron-LM / NeMo / torchtitan today: FlashAttention, bucketed DP overlap, TP comm exposed.
    "modern": lambda: Engine(),
    # Megatron-LM of 2021-2022 (PTD-P, Korthikanti et al.): materialised softmax, fused but separate
    # elementwise kernels, gradient all-reduce after the backward pass (no --overlap-grad-reduce yet).
    "megatron-2022": lambda: Engine(name="megatron-2022", flash_attention=False, dp_overlap=False),
    # Eager PyTorch FSDP (llm-foundry / Composer 2023): FlashAttention, but unfused elementwise kernels, each
    # reading and writing its tensors.
    "pytorch-fsdp": lambda: Engine(name="pytorch-fsdp", elementwise_traffic=3.0),
    # Modern stack with TP communication overlapped (Megatron --tp-comm-overlap, torchtitan async TP).
    "modern-tp-overlap": lambda: Engine(name="modern-tp-overlap", tp_overlap=True),
}
"""Named engine profiles."""


def resolve_engine(name: str) -> Engine:
    """An engine profile by name."""
    if name not in ENGINES:
        msg = f"unknown engine {name!r}\n\nHint: one of {', '.join(ENGINES)}"
        raise SpecError(msg)
    return ENGINES[name]()


def with_overrides(engine: Engine, **overrides: object) -> Engine:
    """`engine` with some fields replaced (None values are ignored)."""
    return dataclasses.replace(engine, **{k: v for k, v in overrides.items() if v is not None})
