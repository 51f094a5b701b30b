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
