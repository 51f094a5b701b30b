"""What the training software does: kernels, overlap, sharding mechanics, and the global efficiency parameters.

Each profile is a stack as it runs by default or as its published recipes run it; every field has a physical
meaning and a source. `overlap_slowdown` and `gemm_half_dim` are the global parameters chosen on published runs
(benchmarks/validate_model.py, docs/model.md); `ELEMENTWISE_FIT` was, and stays fixed; the rest are read from the
stacks' documentation and code.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tracediag.api_types import checked
from tracediag.errors import SpecError
from tracediag.model.elementwise import OPS as ELEMENTWISE_OPS

ATTENTION_KERNELS = ("fa1", "fa2", "fa3", "cudnn", "triton")
"""Fused attention kernels with measured rates (`Engine.attention_kernel`, model/rates.py)."""

STACKS = ("megatron", "torchtitan", "deepspeed", "fsdp")
"""Software stacks whose supported settings the plan search knows (`emit.unsupported`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Engine:
    """Software features and efficiency parameters of the training stack."""

    name: str = "megatron-core"
    stack: str = "megatron"
    """Software whose rules the plan search obeys (`emit.unsupported`): megatron, torchtitan, deepspeed or fsdp
    (PyTorch FSDP1 as llm-foundry runs it: data parallelism only)."""
    flash_attention: bool = True
    """Fused attention (FlashAttention class): no s×s score tensors in memory, causal blocks skipped."""
    attention_kernel: str = "fa3"
    """Fused attention generation: fa1 (FlashAttention v1), fa2 (FlashAttention-2, PyTorch SDPA), fa3
    (FlashAttention-3, and cuDNN's as the FlashAttention-3 paper measured it), cudnn (cuDNN fused attention as
    Transformer Engine 1.7 measured its own backend: Megatron-Core's), triton (Tri Dao's FlashAttention-in-Triton,
    llm-foundry's `attn_impl: triton`); Ampere runs fa2 for fa3 and cudnn (model/rates.py)."""
    tp_overlap: bool = False
    """Tensor-parallel collectives hidden behind GEMMs (Megatron --tp-comm-overlap, torchtitan async TP)."""
    tp_overlap_sms: int = 0
    """SMs that TP-overlap communication kernels hold while the GEMMs beside them run; 0: NCCL-style overlap,
    charged `overlap_slowdown`. Transformer Engine's userbuffers as Megatron-Core calls them (`initialize_ub` with
    an empty `ub_cfgs` at core_v0.8.0 `training/initialize.py`; TE v1.8 `module/base.py` defaults: `num_sm` 16,
    `use_ce` True) run the reduce-scatters (pipelined forward, bulk wgrad) and the backward re-gathers (bulk
    dgrad) on 16 SMs and the ring-exchange all-gathers on copy engines: the GEMMs lose 16/SMs of the device for
    the SM-based collectives' duration."""
    dp_overlap: bool = True
    """Gradient reduce-scatter / parameter all-gather overlapped with backward / forward compute (Megatron
    --overlap-grad-reduce --overlap-param-gather, FSDP prefetch)."""
    pp_overlap: bool = False
    """Pipeline send/recv overlapped with compute (Megatron --overlap-p2p-comm with interleaving; MegaScale)."""
    p2p_scatter_gather: bool = True
    """Each TP rank sends only its 1/t slice of the activation between stages (PTD-P §4.1); DeepSpeed's
    pipeline engine sends the whole tensor from every TP rank."""
    cp_all_gather: bool = False
    """Context parallelism all-gathers K,V before attention (Llama 3 §3.3.2, torchtitan's allgather rotation)
    instead of passing them round a ring behind the attention blocks (Megatron's p2p CP)."""
    cp_repeat_kv: bool = False
    """K,V reach attention already repeated to every query head, so CP moves heads/t of them rather than the
    kv-heads (torchtitan's Llama calls `repeat_kv` before SDPA, models/llama/model.py at 9dec370)."""
    cp_grad_ring_fp32: bool = False
    """The backward all-gathers K,V again and passes their gradients round a ring in fp32, one hop behind each
    attention step (torch's `_templated_ring_attention_backward`: `dkv_rotater` ALL_TO_ALL, `convert_to_f32`
    True), instead of one bf16 reduce-scatter."""
    fp8_te_casts: bool = False
    """fp8 training casts counted from Transformer Engine's fp8 linear layers (model/elementwise.py `te_fp8_bytes`,
    per layer, and 4 bytes per local parameter a step for the weights' cast and transpose) instead of 1.25 × the
    memory-bound traffic."""
    cp_te_p2p: bool = False
    """Context parallelism runs Transformer Engine's P2P ring (`AttnFuncWithCP`, Megatron-Core's CP): c attention
    steps whose outputs it merges and whose gradients it accumulates with memory-bound ops of its own
    (model/elementwise.py `te_cp_bytes`); not with `cp_all_gather`."""
    cp_compiled: bool = False
    """torch's CP ring runs inside a torch.compile graph, where nothing hides its collectives: torchtitan compiles
    each TransformerBlock with `fullgraph=True` (`apply_compile`, parallelize_llama.py at 9dec370) and the
    patched SDPA runs inside it, so the ring is traced; a traced functional collective is waited on where it is
    issued (`_maybe_wrap_tensor` returns `wait_tensor(...)` when `_are_we_tracing()`,
    torch/distributed/_functional_collectives.py) and Inductor moves no wait unless
    `reorder_for_compute_comm_overlap` is set (default False; torchtitan sets only `_micro_pipeline_tp`). Eager,
    the same collectives return an AsyncCollectiveTensor waited on at first use, behind the next attention step."""
    interleaving: bool = True
    """The pipeline schedule supports virtual stages (DeepSpeed's PipelineEngine does not)."""
    zero3_prefetch_params: float | None = None
    """Parameters of the next unit gathered ahead while the current one computes: None = the whole next unit
    (FSDP); DeepSpeed ZeRO-3 at most `stage3_prefetch_bucket_size` (default 5e7) elements."""
    zero3_collectives_per_unit: int = 1
    """Separate gathers (and reduce-scatters) per layer: FSDP flattens a unit into one; DeepSpeed ZeRO-3 fetches
    each submodule with parameters on its own (GPT layer: 2 norms, QKV, projection, 2 MLP linears = 6), each
    paying a ring's n−1 hops."""
    zero2_per_unit: bool = False
    """ZeRO-2 issued unit by unit, as FSDP's SHARD_GRAD_OP runs it: each unit's parameters all-gathered before its
    forward (prefetched as ZeRO-3's are) and kept through its backward, its gradients reduce-scattered after its
    backward, in every micro-batch (FSDP1 frees the gathered parameters after each backward that syncs
    gradients: `_should_free_in_backward`, torch 2.1 `distributed/fsdp/_runtime_utils.py`). False: one bulk
    reduce-scatter and all-gather per step (Megatron's distributed optimizer, DeepSpeed's ZeRO-2 buckets)."""
    zero3_regather_on_recompute: bool = False
    """Full recompute gathers the layer's parameters a third time (DeepSpeed's fetch hooks fire again when the
    checkpointed forward reruns; FSDP recomputes inside the backward gather)."""
    overlap_slowdown: float = 0.75
    """Compute slowdown while overlapped NCCL communication runs, as a share of that communication's time (NCCL
    kernels take SMs and HBM bandwidth; Echo, arXiv 2412.12487; Ultra-Scale Playbook). TP overlap through
    Transformer Engine's userbuffers is charged by `tp_overlap_sms` instead. 0.75: what benchmarks/validate_model.py
    chooses with every publication, stack and GPU generation held out."""
    gemm_half_dim: float = 192.0
    """GEMM tile efficiency: a GEMM whose smallest dimension is n runs at gemm_efficiency·n/(n + this)."""
    hbm_efficiency: float = 0.8
    """Fraction of HBM bandwidth that memory-bound kernels (norms, activations, softmax, Adam) reach."""
    elementwise_traffic: float = 1.5
    """HBM bytes moved by non-GEMM kernels in the forward pass per byte of stored activation; the backward pass
    moves twice as much. `ELEMENTWISE_PRIOR` (write + read per tensor) times `ELEMENTWISE_FIT`."""
    elementwise_ops: str = ""
    """Block code whose memory-bound ops are counted op by op (model/elementwise.py: torchtitan-eager,
    torchtitan-compile); empty: `elementwise_traffic` × stored activation bytes."""
    collective_overhead_us: float = 10.0
    """Fixed cost of launching and synchronising one collective, microseconds (NCCL's base latency)."""
    moe_imbalance: float = 1.2
    """Busiest expert's tokens over the mean (capacity factor 1.2-1.25: Switch Transformer; Megatron MoE docs);
    the expert all-to-all and expert GEMMs wait for it."""
    loss_bytes_per_logit: float = 48.0
    """HBM traffic of the cross-entropy per logit, forward and backward. Megatron's vocab-parallel loss in fp32:
    cast (2+4), subtract max (4+4), exp (4+4), sum (4), normalise (4+4); backward scale (4+4) and cast (4+2)
    = 48 bytes (megatron/core/tensor_parallel/cross_entropy.py); eager PyTorch's log_softmax + nll about the
    same; a fused (compiled, chunked) loss reads the logits once each way, ~12."""
    optimizer_bytes_per_param: float = 38.0
    """HBM traffic of one mixed-precision Adam update per parameter: read grad (4) + master, m, v (12),
    write master, m, v (12) + bf16 weight (2), grad-norm read (4) and zeroing (4)."""
    grad_buffer_passes: float = 0.0
    """Passes per step over the data-parallel gradient buffer, which holds the gradient of every parameter the
    device computes (not only its optimizer shard), at `Training.grad_bytes` per element. Megatron-Core
    (core_r0.8.0 `distributed/param_and_grad_buffer.py`) zeroes it at the start of each step
    (`zero_grad_buffer` → `ParamAndGradBuffer.reset`: `grad_data.zero_()`), and Megatron-LM's
    `--check-for-nan-in-loss-and-grad` (on by default in bf16, `training/arguments.py`) takes each bucket's norm
    before its reduce (`Bucket.start_grad_sync`: `grad_data.norm(p=2)`): 2 passes, the zeroing then leaving
    `optimizer_bytes_per_param` (34). 0: the zeroing is counted there, over the optimizer's shard."""
    embedding_grad_bytes: float = 0.0
    """HBM bytes per element of the device's embedding table, per micro-batch, for its gradient: PyTorch's dense
    embedding backward writes a zeroed [vocab/t, h] gradient in the bf16 parameter dtype (2), which Megatron's DDP
    hook adds into the fp32 main gradient (core_r0.8.0 `distributed_data_parallel.py` `param_hook`:
    `param.main_grad.add_(param.grad.data)`, read 2 + 4, write 4): 12, on the first pipeline stage. 0: not
    counted."""
    memory_reserved_bytes: float = 2.0 * 2**30
    """CUDA context, NCCL buffers and workspace not counted by the formulas."""
    fragmentation: float = 0.05
    """Extra share of activation memory lost to allocator fragmentation."""

    def __post_init__(self) -> None:
        if not 0 < self.hbm_efficiency <= 1:
            msg = f"hbm_efficiency must be in (0, 1], got {self.hbm_efficiency}"
            raise SpecError(msg)
        if self.attention_kernel not in ATTENTION_KERNELS:
            msg = f"attention_kernel must be fa1, fa2, fa3, cudnn or triton, got {self.attention_kernel!r}"
            raise SpecError(msg)
        if self.elementwise_ops and self.elementwise_ops not in ELEMENTWISE_OPS:
            msg = f"elementwise_ops must be empty or one of {', '.join(ELEMENTWISE_OPS)}, got {self.elementwise_ops!r}"
            raise SpecError(msg)
        if self.stack not in STACKS:
            msg = f"stack must be one of {', '.join(STACKS)}, got {self.stack!r}"
            raise SpecError(msg)
        if self.zero3_collectives_per_unit < 1:
            msg = f"zero3_collectives_per_unit must be >= 1, got {self.zero3_collectives_per_unit}"
            raise SpecError(msg)
        if self.moe_imbalance < 1 or (self.zero3_prefetch_params or 0) < 0 or self.collective_overhead_us < 0:
            msg = "moe_imbalance must be >= 1, zero3_prefetch_params and collective_overhead_us >= 0"
            raise SpecError(msg)


ELEMENTWISE_PRIOR = {
    "fused": 2.0,  # each stored activation written once and read once (Transformer Engine, Apex, compile)
    "eager": 3.0,  # unfused PyTorch: one more round trip per elementwise op (norm, activation, residual)
    "megascale": 1.5,  # MegaScale fuses LayerNorm/GeLU into neighbouring kernels (NSDI'24 §3.4)
    "deepspeed": 2.5,  # DeepSpeed's fused kernels for some ops, eager for the rest
}
"""Prior HBM round trips of the memory-bound kernels by kind of stack."""

ELEMENTWISE_FIT = 0.75
"""Scale on the priors, chosen leave-one-source-out when it was a validation parameter; now fixed there too
(each prior is one stack's, so re-choosing it on the other stacks shared a per-stack number globally; the stacks
whose block code is known, torchtitan and llm-foundry, are counted op by op instead: model/elementwise.py)."""


def _traffic(kind: str) -> float:
    return ELEMENTWISE_PRIOR[kind] * ELEMENTWISE_FIT


ENGINES = {
    # Megatron-LM of 2021-2022 (PTD-P, Korthikanti et al., Megatron-DeepSpeed MT-NLG): materialised softmax,
    # fused but separate elementwise kernels, gradient all-reduce after the backward pass.
    "megatron-2022": lambda: Engine(
        name="megatron-2022",
        flash_attention=False,
        attention_kernel="fa2",
        dp_overlap=False,
        elementwise_traffic=_traffic("fused"),
    ),
    # Megatron-Core as NVIDIA's published recipes run it (README performance table: --overlap-grad-reduce
    # --overlap-param-gather --tp-comm-overlap, Transformer Engine with cuDNN fused attention: TE 1.7-1.8 picks it on
    # sm90, "Select FusedAttention on sm90 and FlashAttention on others for performance").
    "megatron-core": lambda: Engine(
        name="megatron-core",
        attention_kernel="cudnn",
        cp_te_p2p=True,
        fp8_te_casts=True,
        tp_overlap=True,
        tp_overlap_sms=16,
        elementwise_traffic=_traffic("fused"),
        optimizer_bytes_per_param=34.0,
        grad_buffer_passes=2.0,
        embedding_grad_bytes=12.0,
    ),
    # MegaScale (Jiang et al. NSDI'24 §3): Megatron with overlapped TP, DP and PP communication and fused
    # LayerNorm/GeLU kernels (fewer HBM round trips).
    "megascale": lambda: Engine(
        name="megascale",
        attention_kernel="fa2",
        tp_overlap=True,
        pp_overlap=True,
        elementwise_traffic=_traffic("megascale"),
    ),
    # Eager PyTorch FSDP1 as llm-foundry / Composer 2023 ran its MPT tables: `attn_impl: triton` (Tri Dao's
    # FlashAttention in Triton: submit_benchmarks.py's default at 061f2c7c and 5e85bd62), the MPT block's
    # memory-bound ops counted op by op (model/elementwise.py), flash-attn 1.0.9's fused cross-entropy
    # (`loss_fn: fused_crossentropy`, the default, xentropy_cuda_lib: the forward reads the bf16 logits, the
    # backward reads them and writes their gradient, 2 + 2 + 2 bytes); FULL_SHARD prefetches the next unit.
    "pytorch-fsdp": lambda: Engine(
        name="pytorch-fsdp",
        stack="fsdp",
        attention_kernel="triton",
        elementwise_traffic=_traffic("eager"),
        elementwise_ops="llm-foundry-mpt",
        loss_bytes_per_logit=6.0,
        zero2_per_unit=True,
    ),
    # torchtitan (FSDP2, eager): SDPA's FlashAttention-2 backend, one kernel per elementwise op (counted op by op
    # from its Llama block, model/elementwise.py); FSDP2 prefetches one unit in both passes. `torchtitan-compile`
    # fuses the elementwise kernels (torch.compile per block).
    "torchtitan": lambda: Engine(
        name="torchtitan",
        stack="torchtitan",
        cp_repeat_kv=True,
        cp_grad_ring_fp32=True,
        attention_kernel="fa2",
        elementwise_traffic=_traffic("eager"),
        elementwise_ops="torchtitan-eager",
    ),
    "torchtitan-compile": lambda: Engine(
        loss_bytes_per_logit=12.0,
        name="torchtitan-compile",
        stack="torchtitan",
        cp_repeat_kv=True,
        cp_grad_ring_fp32=True,
        cp_compiled=True,
        attention_kernel="fa2",
        elementwise_traffic=_traffic("fused"),
        elementwise_ops="torchtitan-compile",
    ),
    # DeepSpeed (ZeRO as DeepSpeed runs it): stage-3 prefetch bucket 5e7 elements (stage3_prefetch_bucket_size),
    # PipelineEngine without interleaving or scatter-gather; gradients reduced after the backward pass when
    # pipelining; FlashAttention-2 through the model code.
    "deepspeed": lambda: Engine(
        name="deepspeed",
        stack="deepspeed",
        attention_kernel="fa2",
        zero3_prefetch_params=5e7,
        zero3_collectives_per_unit=6,
        zero3_regather_on_recompute=True,
        p2p_scatter_gather=False,
        interleaving=False,
        elementwise_traffic=_traffic("deepspeed"),
    ),
    # DeepSpeed of 2021 (v0.3-0.5: PTD-P's ZeRO-3 comparison, Megatron-DeepSpeed MT-NLG): prefetched parameters
    # were gathered one tensor at a time (`_all_gather(..., async_op=True)` → `_allgather_param` per parameter,
    # deepspeed/runtime/zero/partition_parameters.py), 12 per GPT layer with biases; Megatron's unfused softmax.
    "deepspeed-2021": lambda: dataclasses.replace(
        ENGINES["deepspeed"](), name="deepspeed-2021", flash_attention=False, zero3_collectives_per_unit=12
    ),
}
"""Named engine profiles (`--engine`)."""


@checked
def resolve_engine(name: str) -> Engine:
    """An engine profile by name."""
    if name not in ENGINES:
        msg = f"unknown engine {name!r}\n\nHint: one of {', '.join(ENGINES)}"
        raise SpecError(msg)
    return ENGINES[name]()


def with_overrides(engine: Engine, **overrides: object) -> Engine:
    """`engine` with some fields replaced (None values are ignored)."""
    return dataclasses.replace(engine, **{k: v for k, v in overrides.items() if v is not None})


OPTIMISTIC = {
    "TP comm overlap": {"tp_overlap": False},
    "PP comm overlap": {"pp_overlap": False},
    "FlashAttention-3 / cuDNN attention": {"attention_kernel": "fa2"},
}
"""What a profile assumes that a run may not get, and the switch that takes it away: TP overlap needs
Transformer Engine's userbuffers (Megatron --tp-comm-overlap) or async TP; p2p overlap needs interleaving and
--overlap-p2p-comm; FA3/cuDNN attention needs Hopper, a recent cuDNN and Transformer Engine. A plan above every
published run of its class is ranked without them (`conservative`), and says which one carries it."""


def assumptions(engine: Engine) -> dict[str, Engine]:
    """The engine without each optimistic assumption it makes, by assumption (those it does not make are absent)."""
    return {
        name: dataclasses.replace(engine, **off)
        for name, off in OPTIMISTIC.items()
        if any(getattr(engine, k) != v for k, v in off.items())
    }


def conservative(engine: Engine) -> Engine:
    """The engine without any of its optimistic assumptions (`OPTIMISTIC`)."""
    changes = {k: v for name, off in OPTIMISTIC.items() if name in assumptions(engine) for k, v in off.items()}
    return dataclasses.replace(engine, **changes) if changes else engine
