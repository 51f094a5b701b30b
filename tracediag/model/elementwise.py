"""HBM traffic of a transformer block's memory-bound ops, counted op by op from the code that runs them.

The generic estimate (`Engine.elementwise_traffic` × stored activation bytes, docs/model.md "Step time") carries one
prior per kind of stack. Where the model code is known, the bytes each op reads and writes are counted here
instead, so eager and compiled runs of the same code differ by what torch.compile actually fuses.

torchtitan's Llama block (torchtitan/models/llama/model.py and models/norms.py at 9dec370, Dec 2024; the
train configs' `norm_type = "rmsnorm"`), forward, bytes per element of the tensor named, bf16 activations:

- RMSNorm, `(x.float() * rsqrt(x.pow(2).mean(-1) + eps)).type_as(x) * w`: eager float 2+4, pow 4+4, mean 4,
  mul 4+4, type_as 4+2, × w 2+2 = 36 per element; compiled read 2, write 2 = 4.
- residual adds (2 per block): eager 2+2+2 = 6 each; compiled the first fused into the FFN norm (2+2 in, 2+2
  out = 8 for both), the second 6.
- rotary embedding of q and k (`float`, complex multiply, `type_as`): eager 2+4, 4+4, 4+2 = 20; compiled 2+2.
- `repeat_kv` of k and v to the query heads (a materialised expand): read 2 per kv element, write 2 per
  q-sized element, eager and compiled alike (SDPA is an external kernel).
- SwiGLU `silu(w1 x) * w3 x` per ffn element: eager silu 2+2, mul 2+2+2 = 10; compiled 2+2 in, 2 out = 6.

llm-foundry's MPT block (llmfoundry/models/layers/blocks.py, norm.py, ffn.py at 061f2c7c and 5e85bd62, the
benchmark tables' commits; `submit_benchmarks.py` sets `norm_type: low_precision_layernorm`), bf16 activations
(FSDP mixed precision, Composer `amp_bf16`):

- `LPLayerNorm`: one `F.layer_norm` kernel with autocast off, in bf16: read 2, write 2 = 4 per element, twice.
- residual adds (2 per block): read 2 + 2, write 2 = 6 each.
- `nn.GELU(approximate='none')` per ffn element: read 2, write 2 = 4 (`mptglu`, for SwiGLU shapes:
  `act(gate_proj(x)) * up_proj(x)`, 4 + 6 = 10).
- dropouts: `resid_pdrop` 0.0 (the default, unset in the pretrain yamls), and ATen's dropout returns its input
  at p = 0; q, k, v are `split` views of the QKV output and the Triton kernel takes them strided (no copy).

The backward pass moves twice the forward's bytes, as in the generic estimate.

torch's context-parallel ring (`_templated_ring_attention` and its backward,
torch/distributed/tensor/experimental/_attention.py, Dec 2024) adds its own memory-bound ops around the c
attention steps, counted in bytes per element of one rank's queries (E = tokens/c · heads/t · head_dim; K and
V come repeated to as many heads): forward, each step after the first merges its block into the fp32 output
(`_SDPAMerger`: `block.to(float32)` 2+4, `out - block` 4+4+4, `sigmoid(...) *` 4+4, `out -` 4+4+4 = 38 eager;
fused, read the fp32 output and the bf16 block, write the output: 10; a round that takes half the queries
rewrites half and `_partial_update`'s `torch.cat` copies the other, no more), and packs K,V for the next
exchange (`torch.cat([key.flatten(), value.flatten()])`, 4+4 = 8, left out compiled with the all-gather
rotation, whose later packs nothing reads); per pass eager `key/value.contiguous()` 8 and the first block's
and the result's casts 6+6, compiled the first pack 8 and the result's cast 6. Backward, each step after the
first adds its dQ into the fp32 dQ (4+2+4 = 10, eager or fused) and its dK,dV into the received fp32 dK,dV
and packs them for the next hop (eager `+=` 2 × 10 and `torch.cat` 8+8, or `_partial_update` 2 × (5 + 8)
and the pack, up to 42; fused, read 8 + 4, write 8 = 20), plus the K,V pack; per pass eager zeros 12, the
first step's adds 30, its pack 16, the final casts 6 + 12 and `contiguous()` 8 = 84, compiled 36 (and the
gather's pack 8).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracediag.errors import SpecError

if TYPE_CHECKING:
    from tracediag.model.specs import ModelSpec, Split, Training

OPS = ("torchtitan-eager", "torchtitan-compile", "llm-foundry-mpt")
"""Block codes whose memory-bound ops are counted here (`Engine.elementwise_ops`)."""


def forward_bytes(model: ModelSpec, split: Split, train: Training, ops: str) -> float:
    """HBM bytes the memory-bound ops of one layer move in one micro-batch's forward pass, on one device."""
    tokens = train.micro_batch * train.seq_len / split.cp
    t, t_sp = split.tp, (split.tp if split.sequence_parallel else 1)
    n_h = tokens * model.hidden / t_sp
    n_q = tokens * model.heads * model.head_dim / t
    n_kv = tokens * max(model.groups // t, 1) * model.head_dim
    n_f = tokens * model.ffn * model.top_k / t
    repeat = 2 * (2 * n_kv + 2 * n_q) if model.groups < model.heads else 0.0
    if ops == "torchtitan-eager":
        return 2 * 36 * n_h + 2 * 6 * n_h + 20 * (n_q + n_kv) + repeat + (10 if model.swiglu else 4) * n_f
    if ops == "torchtitan-compile":
        return (4 + 8 + 6) * n_h + 4 * (n_q + n_kv) + repeat + (6 if model.swiglu else 4) * n_f
    if ops == "llm-foundry-mpt":
        return (2 * 4 + 2 * 6) * n_h + repeat + (10 if model.swiglu else 4) * n_f
    msg = f"unknown elementwise ops {ops!r}; one of {', '.join(OPS)}"
    raise SpecError(msg)


def te_fp8_bytes(model: ModelSpec, split: Split, train: Training) -> tuple[float, float]:
    """HBM bytes Transformer Engine's fp8 linear layers move beyond the bf16 block's, in one layer's forward pass and
    its backward, one micro-batch, on one device (Megatron-Core's TE layer: LayerNormLinear QKV and fc1, Linear
    projection and fc2; transformer_engine/pytorch/module at v1.8, delayed scaling).

    Forward: the norms write their output in fp8 (`layernorm_fwd_fp8` into a uint8 buffer: 1 byte less per
    element than bf16); the projection's and fc2's bf16 inputs are cast and transposed for the wgrad
    (`fp8_cast_transpose_fused`: read 2, write 1 + 1). Backward: every GEMM's output gradient is cast and
    transposed (`grad_output_preprocess`: 4 per element of the QKV, projection, fc1 and fc2 outputs; with sequence
    parallelism the row-parallel ones are cast on the shard, 3, and transposed once gathered, 2), and the two norms'
    fp8 outputs are transposed for their wgrad (`tex.fp8_transpose`, 1 + 1, on the gathered tensor under sequence
    parallelism). The weights' casts run once a step (`is_first_microbatch`), not here.
    """
    tokens = train.micro_batch * train.seq_len / split.cp
    t, t_sp = split.tp, (split.tp if split.sequence_parallel else 1)
    n_h = tokens * model.hidden / t_sp
    n_full = tokens * model.hidden
    n_q = tokens * model.heads * model.head_dim / t
    n_kv = tokens * max(model.groups // t, 1) * model.head_dim
    n_f = tokens * model.ffn * model.top_k / t
    fc1_out = (2 if model.swiglu else 1) * n_f
    row_grad = 3 * n_h + 2 * n_full if split.sequence_parallel else 4 * n_h
    forward = 4 * (n_q + n_f) - 2 * n_h
    backward = 4 * (n_q + 2 * n_kv) + 4 * fc1_out + 2 * row_grad + 2 * 2 * n_full
    return forward, backward


def te_cp_bytes(model: ModelSpec, split: Split, train: Training) -> tuple[float, float]:
    """HBM bytes of Transformer Engine's P2P context-parallel attention's own memory-bound ops (`AttnFuncWithCP`,
    transformer_engine/pytorch/attention.py at v1.8, Megatron-Core's CP) in one layer's forward pass and its
    backward, one micro-batch, on the rank whose steps all take full blocks (the pacing one); 0 without CP.

    Forward: K and V packed into the ring buffer (`torch.cat((k.unsqueeze(0), v.unsqueeze(0)))`, 2 + 2 bytes per
    element of each), the bf16 output zeroed (2 per query element), and every one of the c steps merged into it
    (`flash_attn_fwd_out_correction`, jit-fused: read the step's output and the running one, write it, 6).
    Backward: K, V copied into the ring buffer again (4 each), and each step's dQ added into dq (`dq.add_`, 6 per
    query element) and its dK, dV packed (`torch.cat`, 4 each) and added into the dKV travelling the ring
    (`dkv.add_`, 6 each).
    """
    c = split.cp
    if c <= 1:
        return 0.0, 0.0
    tokens = train.micro_batch * train.seq_len / c
    n_q = tokens * model.heads * model.head_dim / split.tp
    n_kv = tokens * max(model.groups // split.tp, 1) * model.head_dim
    forward = 2 * 4 * n_kv + 2 * n_q + c * 6 * n_q
    backward = 2 * 4 * n_kv + c * (6 * n_q + 2 * (4 + 6) * n_kv)
    return forward, backward


TORCH_CP_BYTES = {
    # (forward per pass, forward per step after the first, backward per pass, per step): bytes per element of
    # one rank's queries (module docstring), eager and compiled.
    "eager": (20.0, 46.0, 84.0, 60.0),
    "compiled": (6.0, 10.0, 36.0, 30.0),
}
"""torch's CP ring's own HBM traffic by stage (module docstring)."""


def torch_cp_bytes(
    model: ModelSpec, split: Split, train: Training, *, compiled: bool, all_gather: bool
) -> tuple[float, float]:
    """HBM bytes of torch's CP ring's own memory-bound ops (merges, accumulation, packing) in one layer's forward
    pass and its backward, one micro-batch, on one device; 0 without CP."""
    c = split.cp
    if c <= 1:
        return 0.0, 0.0
    n_q = train.micro_batch * train.seq_len / c * model.heads * model.head_dim / split.tp
    fwd_pass, fwd_step, bwd_pass, bwd_step = TORCH_CP_BYTES["compiled" if compiled else "eager"]
    if compiled:
        # the K,V pack: once per pass for the all-gather, every step for the ring's hops
        pack = (8.0, 0.0) if all_gather else (0.0, 8.0)
        fwd_pass, fwd_step = fwd_pass + pack[0], fwd_step + pack[1]
        bwd_pass, bwd_step = bwd_pass + pack[0], bwd_step + pack[1]
    return n_q * (fwd_pass + (c - 1) * fwd_step), n_q * (bwd_pass + (c - 1) * bwd_step)


def moe_dispatch_bytes(model: ModelSpec, split: Split, train: Training) -> float:
    """HBM bytes Megatron-Core's all-to-all token dispatcher moves around one MoE layer's experts in one
    micro-batch's forward pass, on one device; 0 for a dense model (megatron/core/transformer/moe/moe_utils.py
    and token_dispatcher.py `MoEAlltoAllTokenDispatcher`, core_r0.12).

    With T the device's tokens (over tp with sequence parallelism), k the experts per token and h the width:
    `permute` gathers each token's k copies grouped by expert (read 2, write 2 per copied element: 4·T·k·h);
    with several experts per rank, `sort_chunks_by_idxs` regroups the received tokens by local expert before
    the experts and back after them (split + cat, 4·T·k·h each); `unpermute` weights the expert outputs by
    their routing probabilities (read 2, write 2) and scatter-adds them into a zeroed output (read 2 per copy,
    write 2 + 2 per token): 6·T·k·h + 4·T·h. The fused kernels (`moe_permute_fusion`) move the same tensors.
    The backward moves twice the forward's bytes, as the other memory-bound ops do."""
    if model.experts <= 1:
        return 0.0
    t_sp = split.tp if split.sequence_parallel else 1
    tokens = train.micro_batch * train.seq_len / split.cp / t_sp
    copies = tokens * model.top_k * model.hidden
    sorts = 2 * 4 * copies if split.ep > 1 and model.experts > split.ep else 0.0
    return 4 * copies + sorts + 6 * copies + 4 * tokens * model.hidden
