"""Bytes per device by part: weights, gradients, optimizer, activations, temporaries (perf-model.md §2).

Notes
-----
Model states follow the ZeRO paper and Megatron's distributed-optimizer table: bf16 weights (2 bytes),
gradients of `Training.grad_bytes`, fp32 master weights + Adam m and v (12 bytes); ZeRO-1 shards the 12,
ZeRO-2 also the gradients, ZeRO-3 everything, over dp·cp. Activations follow Korthikanti et al. 2022
Table 2 generalised to GQA, SwiGLU and no-dropout models, held for the in-flight micro-batches of
the stage (1F1B: p − stage index; interleaving multiplies by 1 + (p−1)/(p·v), as in Megatron's
`theoretical_memory_usage.py`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from tracediag.model.flops import attention_params, expert_params, norm_params
from tracediag.model.specs import stage_layers

if TYPE_CHECKING:
    from tracediag.model.specs import DeviceSpec, ModelSpec, Split, Training
    from tracediag.model.stack import Engine


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryBreakdown:
    """Peak bytes on the most loaded device (the pipeline stage named in `stage`)."""

    stage: int
    """Pipeline stage (0-based) whose devices need the most memory."""
    weights: float
    gradients: float
    optimizer: float
    activations: float
    """Stored activations of all in-flight micro-batches."""
    in_flight_micro_batches: float
    """Micro-batches whose activations the stage holds at its peak (interleaving penalty included)."""
    temporary: float
    """Transient buffers: logits and loss (last stage), FSDP all-gather buffers, one layer's recompute, the
    whole sequence's K,V of all-gather context parallelism."""
    reserved: float
    """CUDA context, NCCL buffers and allocator fragmentation."""
    capacity: float
    """Device memory, bytes."""

    @property
    def total(self) -> float:
        """Sum of all parts."""
        return self.weights + self.gradients + self.optimizer + self.activations + self.temporary + self.reserved

    @property
    def headroom(self) -> float:
        """Capacity minus total; negative when the split does not fit."""
        return self.capacity - self.total

    @property
    def fits(self) -> bool:
        """Whether the total stays within device memory."""
        return self.total <= self.capacity

    def to_dict(self) -> dict[str, float | bool]:
        """Plain dict with the derived totals."""
        return {**asdict(self), "total": self.total, "headroom": self.headroom, "fits": self.fits}


def layer_params_local(model: ModelSpec, split: Split) -> tuple[float, float]:
    """(dense, expert) parameters of one layer held by one device."""
    dense = attention_params(model) / split.tp + norm_params(model)
    if model.experts > 1:
        return dense + model.hidden * model.experts, model.experts * expert_params(model) / (split.expert_tp * split.ep)
    return dense + expert_params(model) / split.tp, 0.0


def stage_params(model: ModelSpec, split: Split, stage: int) -> tuple[float, float]:
    """(dense, expert) parameters held by one device of pipeline stage `stage`."""
    layers = stage_layers(model.layers, split.pp)[stage]
    dense, expert = layer_params_local(model, split)
    dense, expert = dense * layers, expert * layers
    table = model.vocab * model.hidden / split.tp
    if stage == 0:
        dense += table + model.learned_positions * model.hidden
    if stage == split.pp - 1:
        # The output layer; with tied embeddings and pp > 1 the last stage keeps its own copy (Megatron).
        dense += model.hidden + (table if not model.tied_embeddings or split.pp > 1 else 0)
    return dense, expert


def cp_kv_heads(model: ModelSpec, split: Split, engine: Engine) -> float:
    """K,V heads one device's context-parallel attention moves: the query heads when the model repeats K,V
    before attention (`Engine.cp_repeat_kv`), else its kv-heads, over tp."""
    return model.heads / split.tp if engine.cp_repeat_kv else max(model.groups // split.tp, 1)


def cp_gather_bytes(model: ModelSpec, split: Split, train: Training, engine: Engine) -> float:
    """Transient bytes of all-gather context parallelism in one layer's backward, its peak: the whole sequence's
    K,V gathered again (bf16), and their gradients, which torch's ring passes round in fp32 one rank's chunk at
    a time (the accumulating one and the one in flight), and which Llama 3's all-gather CP reduce-scatters from
    a whole-sequence buffer. 0 without CP or with the ring CP, which holds two chunks."""
    if split.cp <= 1 or not engine.cp_all_gather:
        return 0.0
    kv_full = 2 * train.micro_batch * train.seq_len * cp_kv_heads(model, split, engine) * model.head_dim * 2
    grads = 2 * (2 * kv_full / split.cp) if engine.cp_grad_ring_fp32 else kv_full
    return kv_full + grads


def activation_bytes_per_layer(model: ModelSpec, split: Split, train: Training, engine: Engine) -> float:
    """Stored activations of one layer for one micro-batch, without recomputation, on one device."""
    s = train.seq_len / split.cp
    sbh = s * train.micro_batch * model.hidden
    t, t_sp = split.tp, (split.tp if split.sequence_parallel else 1)
    drop = 1 if model.dropout else 0
    # Replicated without SP: two norm inputs (4), QKV and fc1 inputs (4), two dropout masks (2).
    replicated = sbh * (8 + 2 * drop)
    # Sharded over tp: Q (2) and K, V (4·g/a), attention output (2), per query channel (a·d_h, h unless the
    # model sets its head size); MLP inner activations per f.
    q_kv_o = sbh * model.heads * model.head_dim / model.hidden * (4 + 4 * model.groups / model.heads)
    mlp_inner = s * train.micro_batch * model.ffn * (6 if model.swiglu else 4) * model.top_k
    core = 0.0
    if not engine.flash_attention:
        # softmax output (2) + dropout mask (1) + dropout output (2) per score, a·s² per sequence.
        core = (2 + 3 * drop) * model.heads * s * train.seq_len * train.micro_batch
    return replicated / t_sp + (q_kv_o + mlp_inner + core) / t


def stored_bytes_per_layer(model: ModelSpec, split: Split, train: Training, engine: Engine) -> float:
    """What one layer keeps for the backward pass under the recompute mode."""
    full = activation_bytes_per_layer(model, split, train, engine)
    if train.recompute == "full":
        t_sp = split.tp if split.sequence_parallel else 1
        return 2 * train.seq_len / split.cp * train.micro_batch * model.hidden / t_sp
    if train.recompute == "op":
        # torchtitan's per-op policy keeps the layer input, attention's inputs and output, and every second
        # matmul output; the norms, activations and the other matmuls are recomputed.
        s = train.seq_len / split.cp
        t_sp = split.tp if split.sequence_parallel else 1
        sbh = s * train.micro_batch * model.hidden
        q_kv_o = sbh * model.heads * model.head_dim / model.hidden * (4 + 4 * model.groups / model.heads) / split.tp
        mlp_inner = s * train.micro_batch * model.ffn * (6 if model.swiglu else 4) * model.top_k / split.tp
        return 2 * sbh / t_sp + q_kv_o + mlp_inner / 2
    if train.recompute == "selective" and not engine.flash_attention:
        drop = 1 if model.dropout else 0
        core = (2 + 3 * drop) * model.heads * train.seq_len**2 / split.cp * train.micro_batch / split.tp
        return full - core
    return full


def memory_per_device(
    model: ModelSpec, device: DeviceSpec, split: Split, train: Training, engine: Engine
) -> MemoryBreakdown:
    """Peak memory of the most loaded pipeline stage (the first, the last or a middle one)."""
    stages = sorted({0, split.pp - 1, min(1, split.pp - 1)})
    return max((stage_memory(model, device, split, train, engine, i) for i in stages), key=lambda mb: mb.total)


def stage_memory(
    model: ModelSpec, device: DeviceSpec, split: Split, train: Training, engine: Engine, stage: int
) -> MemoryBreakdown:
    """Peak memory of the devices of pipeline stage `stage`: the first holds the embedding and p in-flight
    micro-batches, a middle one only its transformer layers, the last the output layer and the logits."""
    m = train.global_batch // (train.micro_batch * split.dp)
    shard = split.dp * split.cp
    expert_shard = split.expert_dp
    per_layer = stored_bytes_per_layer(model, split, train, engine)
    layer_full = activation_bytes_per_layer(model, split, train, engine)
    layers = stage_layers(model.layers, split.pp)
    t_sp = split.tp if split.sequence_parallel else 1
    sbh = train.seq_len / split.cp * train.micro_batch * model.hidden
    dense, expert = stage_params(model, split, stage)
    params = dense + expert
    sharded = dense / shard + expert / expert_shard
    weights = 2 * (sharded if split.zero == 3 else params)
    grads = train.grad_bytes * (sharded if split.zero >= 2 else params)
    optimizer = 12 * (sharded if split.zero >= 1 else params)
    in_flight = float(min(m, split.pp - stage))
    if split.vpp > 1:
        in_flight *= 1 + (split.pp - 1) / (split.pp * split.vpp)
    # The first stage also keeps, per micro-batch, the token ids (int64) and the embedding dropout's mask (one
    # byte per element); the embedding's output is the first layer's input, counted with it (Korthikanti et al.
    # 2022 §4.3; Megatron-LM training/theoretical_memory_usage.py, d98e8a64dd).
    tokens = train.seq_len / split.cp * train.micro_batch
    embedding = 8 * tokens + (sbh / t_sp if model.dropout else 0.0)
    acts = in_flight * (layers[stage] * per_layer + (embedding if stage == 0 else 0.0))
    temporary = layer_full if train.recompute != "none" else 0.0
    if stage == split.pp - 1:
        temporary += 6 * train.seq_len / split.cp * train.micro_batch * model.vocab / split.tp
    if split.zero == 3:
        dense_layer, expert_layer = layer_params_local(model, split)
        temporary += 2 * 2 * (dense_layer + expert_layer)
    temporary += cp_gather_bytes(model, split, train, engine)
    reserved = engine.memory_reserved_bytes + engine.fragmentation * acts
    return MemoryBreakdown(
        stage=stage,
        weights=weights,
        gradients=grads,
        optimizer=optimizer,
        activations=acts,
        in_flight_micro_batches=in_flight,
        temporary=temporary,
        reserved=reserved,
        capacity=device.memory_bytes,
    )
