"""Parameter counts and FLOPs of a decoder-only transformer (perf-model.md §1).

Notes
-----
Model FLOPs are three times the forward matmul FLOPs with the logits layer, without the embedding lookup, in
two conventions: `causal=True` counts the half of the s×s scores a causal kernel computes (the FlashAttention
papers' count, Megatron-LM's current `num_floating_point_operations`); the default counts the full s×s
matrix, as Megatron-LM's 2024 formula and Korthikanti et al. 2022 do. `flops_6n` is the PaLM / llm-foundry
convention (6N + 12·L·h·s per token, full s²).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tracediag.model.specs import ModelSpec


def attention_params(model: ModelSpec) -> int:
    """Weights (and biases) of one attention block: Q, K, V and the output projection."""
    q = model.heads * model.head_dim
    kv = 2 * model.groups * model.head_dim
    weights = model.hidden * (q + kv) + q * model.hidden
    return weights + (q + kv + model.hidden if model.bias else 0)


def expert_params(model: ModelSpec) -> int:
    """Weights (and biases) of one MLP (one expert for MoE)."""
    matrices = 3 if model.swiglu else 2
    weights = matrices * model.hidden * model.ffn
    return weights + ((matrices - 1) * model.ffn + model.hidden if model.bias else 0)


def norm_params(model: ModelSpec) -> int:
    """The two norms of one layer."""
    return 2 * model.hidden * (2 if model.bias else 1)


def layer_params(model: ModelSpec, *, active: bool = False) -> int:
    """One transformer block; `active` counts only the top-k experts a token uses."""
    experts = model.top_k if active else model.experts
    router = model.hidden * model.experts if model.experts > 1 else 0
    return attention_params(model) + experts * expert_params(model) + router + norm_params(model)


def embedding_params(model: ModelSpec) -> int:
    """Input embedding (+ learned positions) and, if untied, the output layer, plus the final norm."""
    emb = model.vocab * model.hidden + model.learned_positions * model.hidden
    out = 0 if model.tied_embeddings else model.vocab * model.hidden
    return emb + out + model.hidden * (2 if model.bias else 1)


def param_count(model: ModelSpec, *, active: bool = False) -> int:
    """Total parameters (N); `active` counts only the routed experts of MoE layers."""
    return model.layers * layer_params(model, active=active) + embedding_params(model)


def layer_forward_flops(model: ModelSpec, seq_len: int, *, causal: bool = False) -> float:
    """Forward matmul FLOPs of one layer for one sequence (attention scores full unless `causal`)."""
    matmul = 2 * seq_len * (layer_params(model, active=True) - norm_params(model))
    attention = 4 * seq_len * seq_len * model.heads * model.head_dim
    return matmul + (attention / 2 if causal else attention)


def logits_forward_flops(model: ModelSpec, seq_len: int) -> float:
    """Forward FLOPs of the output layer for one sequence."""
    return 2.0 * seq_len * model.hidden * model.vocab


def model_flops(model: ModelSpec, seq_len: int, sequences: int, *, causal: bool = False) -> float:
    """Model FLOPs of a training step (forward + backward = 3× forward, no recompute)."""
    fwd = model.layers * layer_forward_flops(model, seq_len, causal=causal) + logits_forward_flops(model, seq_len)
    return 3.0 * fwd * sequences


def flops_6n(model: ModelSpec, seq_len: int, sequences: int) -> float:
    """PaLM / llm-foundry model FLOPs: (6N + 12·L·h·s) per token, N = all parameters."""
    per_token = 6.0 * param_count(model, active=True) + 12.0 * model.layers * model.hidden * seq_len
    return per_token * seq_len * sequences
