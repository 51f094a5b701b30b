"""Issue 4: memory per device by part, step-time parts, bubble and collective formulas."""

from __future__ import annotations

import dataclasses
import math

import pytest

from tracediag.errors import SpecError
from tracediag.model.flops import param_count
from tracediag.model.memory import activation_bytes_per_layer, memory_per_device, stage_params
from tracediag.model.predict import predict
from tracediag.model.specs import MODELS, ModelSpec, Split, Training, resolve_device
from tracediag.model.stack import resolve_engine, with_overrides
from tracediag.model.time import collective_time, group_link, layer_cost, step_time

MODERN = resolve_engine("megatron-core")
MEGATRON = resolve_engine("megatron-2022")


def test_memory_total_by_hand_for_tiny_model():
    model, dev = MODELS["tiny"](), resolve_device("a100-80gb")
    train = Training(seq_len=128, global_batch=2, micro_batch=2, grad_bytes=4)
    mem = memory_per_device(model, dev, Split(zero=0), train, MODERN)
    n = param_count(model)
    assert (mem.weights, mem.gradients, mem.optimizer) == (2 * n, 4 * n, 12 * n)
    # per layer (FlashAttention, no dropout, GeLU, g/a = 1/2): s·b·h·(8 + 4 + 2) + 4·s·b·f
    sbh = 128 * 2 * 256
    per_layer = sbh * 14 + 4 * 128 * 2 * 1024
    assert per_layer == 1_966_080
    # Four layers + the token ids (int64); the embedding's output is the first layer's input, counted with it,
    # and the tiny model has no embedding dropout mask (Megatron-LM theoretical_memory_usage.py).
    assert mem.activations == 4 * per_layer + 8 * 128 * 2
    temporary = 6 * 128 * 2 * 1000  # bf16 logits + fp32 loss copy
    assert mem.total == pytest.approx(18 * n + mem.activations * 1.05 + temporary + 2 * 2**30)


def test_activations_follow_the_attention_width_not_the_model_width():
    """Q, K, V and the attention output are stored per query channel (heads · head_dim), which a model may set
    wider than its hidden size (Qwen3-30B-A3B: 32 × 128 on 2048)."""
    narrow = ModelSpec(layers=2, hidden=2048, heads=32, kv_heads=4, ffn=768, vocab=1000)
    wide = dataclasses.replace(narrow, attention_head_dim=128)
    split, train = Split(tp=2), Training(seq_len=4096, global_batch=1, micro_batch=1)
    extra = activation_bytes_per_layer(wide, split, train, MODERN) - activation_bytes_per_layer(
        narrow, split, train, MODERN
    )
    # (2 Q + 2 O) bytes per query channel and 2 · 2 per kv channel, 64 more channels per head, over tp
    assert extra == pytest.approx(4096 * (4 * 32 + 4 * 4) * 64 / 2)


def test_zero3_shards_all_model_states():
    model, dev = MODELS["tiny"](), resolve_device("a100-80gb")
    train = Training(seq_len=128, global_batch=8, micro_batch=1)
    z0 = memory_per_device(model, dev, Split(dp=8, zero=0), train, MODERN)
    z3 = memory_per_device(model, dev, Split(dp=8, zero=3), train, MODERN)
    assert z3.weights == pytest.approx(z0.weights / 8, rel=1e-3)
    assert z3.optimizer == pytest.approx(z0.optimizer / 8, rel=1e-3)


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_activations_match_korthikanti_table2(tp):
    """GPT layer, fp16, no FlashAttention: s·b·h·(10 + 24/t + 5·a·s/(h·t)), and ·34/t + 5as²b/t with SP."""
    model = MODELS["gpt3-175b"]()
    s, b, h, a = 2048, 1, model.hidden, model.heads
    train = Training(seq_len=s, global_batch=1, micro_batch=b)
    no_sp = activation_bytes_per_layer(model, Split(tp=tp), train, MEGATRON)
    assert no_sp == pytest.approx(s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp)))
    if tp > 1:
        sp = activation_bytes_per_layer(model, Split(tp=tp, sequence_parallel=True), train, MEGATRON)
        assert sp == pytest.approx(s * b * h / tp * (34 + 5 * a * s / h))


def test_collective_time_follows_nccl_tests_bus_bandwidth():
    dev = resolve_device("a100-80gb")
    link = group_link(dev, 8, 1)
    assert link.link == "nvlink3"
    assert link.busbw == pytest.approx(300e9 * 0.75)
    # all-reduce as a tree: a launch plus 2·log2(n) hops; all-gather as a ring: n − 1 hops
    expected = 10e-6 + 2 * 3 * 2e-6 + 2 * 7 / 8 * 1e9 / link.busbw
    assert collective_time("all_reduce", 1e9, 8, link) == pytest.approx(expected)
    assert collective_time("all_gather", 1e9, 8, link) == pytest.approx(10e-6 + 7 * 2e-6 + 7 / 8 * 1e9 / link.busbw)
    # a ring of 512 ranks, one per node, pays 511 network hops: latency-bound for small messages
    wide = group_link(dev, 512, 8)
    assert collective_time("all_gather", 1e6, 512, wide) > 511 * 8e-6
    # a DP group one GPU per node rides one NIC; eight per node share the node's eight NICs
    assert group_link(dev, 4, 8).busbw == pytest.approx(25e9 * 0.9)
    assert group_link(dev, 32, 1).busbw == pytest.approx(min(300e9 * 0.75, 8 * 25e9 * 0.9))


def test_all_to_all_across_nodes_sends_each_ranks_off_node_share_through_its_own_nic():
    """A ring over nodes shares the node's NICs (once per node per channel); an all-to-all does not: EP 32 with 4
    ranks per node (tp 2) sends 28/32 of each rank's tokens over that rank's one 400 Gb/s NIC."""
    dev = resolve_device("h100-sxm")
    link = group_link(dev, 32, 2)
    net = dev.inter_link.busbw
    assert link.busbw == pytest.approx(min(dev.intra_link.busbw, 4 * net))  # the ring's
    nbytes = 1e9
    a2a = collective_time("all_to_all", nbytes, 32, link)
    assert a2a == pytest.approx(link.overhead + 31 * link.hop_latency + nbytes * 28 / 32 / net)
    assert a2a > 3 * collective_time("all_gather", nbytes, 32, link)
    # inside a node, and one rank per node, nothing changes
    inside, spread = group_link(dev, 8, 1), group_link(dev, 8, 8)
    assert collective_time("all_to_all", nbytes, 8, inside) == pytest.approx(
        inside.overhead + 7 * inside.hop_latency + nbytes * 7 / 8 / inside.busbw
    )
    assert collective_time("all_to_all", nbytes, 8, spread) == pytest.approx(
        spread.overhead + 7 * spread.hop_latency + nbytes * 7 / 8 / net
    )


def _stage_time(t):
    return (t.compute_s - t.interference_s + t.exposed_tp_s + t.exposed_cp_s + t.exposed_ep_s) / t.micro_batches


@pytest.mark.parametrize("vpp", [1, 2])
def test_bubble_is_the_other_stages_once_over_v(vpp):
    """1F1B fills and drains through every stage but the slowest once: with even layers and the logits on the
    last stage, (p−1)/v micro-batches of a logit-free stage, not of the heavier last one that paces the rest."""
    model, dev = MODELS["gpt3-6.7b"](), resolve_device("a100-80gb", speed_variation=0.0)
    split = Split(tp=2, pp=4, dp=1, vpp=vpp, zero=0, sequence_parallel=True)
    train = Training(seq_len=2048, global_batch=8, micro_batch=1)
    t = step_time(model, dev, split, train, MEGATRON)
    assert t.micro_batches == 8
    inner = layer_cost(model, dev, MEGATRON, split, train).total * model.layers / 4
    assert _stage_time(t) > 1.01 * inner  # the last stage carries the logits
    assert t.bubble_s == pytest.approx(3 / vpp * inner)


def test_breakdown_adds_up_and_mfu_is_model_flops_over_peak():
    model, dev = MODELS["llama3-8b"](), resolve_device("h100-sxm")
    split = Split(tp=2, pp=2, dp=4, zero=1, sequence_parallel=True)
    p = predict(model, dev, split, Training(seq_len=8192, global_batch=32, micro_batch=1), MODERN)
    t = p.time
    parts = (
        t.compute_s
        + t.exposed_tp_s
        + t.exposed_cp_s
        + t.exposed_ep_s
        + t.exposed_pp_s
        + t.exposed_dp_s
        + t.bubble_s
        + t.optimizer_s
    )
    assert parts == pytest.approx(t.step_time_s)
    assert p.mfu == pytest.approx(p.model_flops_per_step / (t.step_time_s * 16 * dev.peak_flops))
    assert p.tokens_per_s == pytest.approx(32 * 8192 / t.step_time_s)
    assert 0 < p.mfu == p.hfu < 1  # nothing recomputed


def test_full_recompute_costs_time_and_saves_memory():
    model, dev = MODELS["gpt3-13b"](), resolve_device("a100-80gb")
    split = Split(tp=4, dp=2, zero=1)
    base = Training(seq_len=2048, global_batch=16, micro_batch=2)
    none = predict(model, dev, split, base, MEGATRON)
    full = predict(model, dev, split, dataclasses.replace(base, recompute="full"), MEGATRON)
    assert full.step_time_s > none.step_time_s
    assert full.memory.activations < none.memory.activations / 5
    # recompute repeats the forward: about a third more compute
    assert full.time.compute_s / none.time.compute_s == pytest.approx(4 / 3, abs=0.06)
    assert math.isclose(full.mfu * full.step_time_s, none.mfu * none.step_time_s, rel_tol=1e-9)
    # recompute adds one forward of three to the executed FLOPs (the logits are not recomputed)
    assert (full.hfu * full.step_time_s) / (none.hfu * none.step_time_s) == pytest.approx(4 / 3, abs=0.01)
    # the materialised softmax computes the masked half of the causal scores too: executed > model FLOPs
    s, h = 2048, model.hidden
    causal_over_full = (1 + s / (12 * h) + model.vocab / (12 * model.layers * h)) / (
        1 + s / (6 * h) + model.vocab / (12 * model.layers * h)
    )
    assert none.mfu / none.hfu == pytest.approx(causal_over_full, rel=0.01)
    assert none.mfu_full_s2 == pytest.approx(none.hfu, rel=0.01)


def test_interleaving_with_uneven_stages_is_allowed_and_shrinks_the_bubble():
    """Llama 3.1 405B on pp=16: 126 layers give stages of 7 and 8 layers (Llama 3 §3.3.2), which no
    vpp divides; engines run such uneven virtual chunks, so predict must too, and interleaving by v
    must cut the bubble by v (Narayanan et al. 2021)."""
    model = MODELS["llama3.1-405b"]()
    device = resolve_device("h100-sxm")
    training = Training(seq_len=8192, global_batch=2048, micro_batch=1)
    bubbles = {}
    for v in (1, 2, 4):
        split = Split(tp=8, pp=16, dp=64, vpp=v, zero=1, sequence_parallel=True)
        bubbles[v] = predict(model, device, split, training, MODERN).time.bubble_s
    assert bubbles[2] == pytest.approx(bubbles[1] / 2, rel=1e-6)
    assert bubbles[4] == pytest.approx(bubbles[1] / 4, rel=1e-6)


def test_op_recompute_sits_between_none_and_full():
    model, dev = MODELS["llama3-8b"](), resolve_device("h100-sxm")
    split = Split(tp=2, dp=4, zero=1, sequence_parallel=True)
    engine = resolve_engine("torchtitan")
    preds = {
        mode: predict(model, dev, split, Training(seq_len=8192, global_batch=8, recompute=mode), engine)
        for mode in ("none", "op", "full")
    }
    acts = {k: p.memory.activations for k, p in preds.items()}
    times = {k: p.step_time_s for k, p in preds.items()}
    assert acts["full"] < acts["op"] < acts["none"]
    assert times["none"] < times["op"] < times["full"]
    # op recomputes every second matmul: half of full recompute's FLOPs without attention (FlashAttention
    # executes the causal half of the scores: 2·s²·a·d_h per layer and sequence)
    extra = {k: (p.hfu - p.mfu) * p.step_time_s for k, p in preds.items()}
    attention = 2.0 * 8192**2 * model.heads * model.head_dim * model.layers * 8
    full_extra_flops = extra["full"] * preds["full"].gpus * dev.peak_flops
    op_extra_flops = extra["op"] * preds["op"].gpus * dev.peak_flops
    assert extra["none"] == 0
    assert op_extra_flops == pytest.approx((full_extra_flops - attention) / 2)


def test_fp8_speeds_up_gemms_on_hopper_and_is_refused_on_ampere():
    model = MODELS["llama3-8b"]()
    split = Split(dp=8, zero=1)
    h100 = resolve_device("h100-sxm")
    bf16 = predict(model, h100, split, Training(seq_len=8192, global_batch=8), MODERN)
    fp8 = predict(model, h100, split, Training(seq_len=8192, global_batch=8, dtype="fp8"), MODERN)
    assert fp8.time.gemm_s < 0.8 * bf16.time.gemm_s
    with pytest.raises(SpecError, match="fp8"):
        predict(model, resolve_device("a100-80gb"), split, Training(seq_len=8192, global_batch=8, dtype="fp8"), MODERN)


def test_attention_runs_slower_per_flop_at_short_sequences_and_with_fa2_on_hopper():
    from tracediag.model.rates import attention_rate

    assert attention_rate("hopper", "fa3", 512, 128, backward=False) < attention_rate(
        "hopper", "fa3", 16384, 128, backward=False
    )
    assert attention_rate("hopper", "fa2", 8192, 128, backward=False) < 0.6 * attention_rate(
        "hopper", "fa3", 8192, 128, backward=False
    )
    assert attention_rate("hopper", "fa3", 8192, 64, backward=True) < attention_rate(
        "hopper", "fa3", 8192, 128, backward=True
    )


def test_zero3_ring_latency_makes_wide_data_parallel_groups_slower_per_gpu():
    model, dev = MODELS["gpt3-175b"](), resolve_device("a100-80gb")
    engine = resolve_engine("deepspeed")
    per_gpu = []
    for gpus in (384, 1536):
        train = Training(seq_len=2048, global_batch=1536, micro_batch=1536 // gpus, recompute="full", grad_bytes=2)
        p = predict(model, dev, Split(dp=gpus, zero=3), train, engine)
        per_gpu.append(p.mfu)
        assert p.time.exposed_dp_s > 0
    assert per_gpu[1] < 0.6 * per_gpu[0]


def test_megatron_core_pays_its_gradient_buffer_and_dense_embedding_gradient():
    """Megatron-Core (core_r0.8.0) zeroes the whole DDP gradient buffer each step and Megatron-LM takes each bucket's
    norm before the reduce, whatever the distributed optimizer's shard; and each micro-batch's dense embedding
    gradient (bf16, zeroed) is added into the fp32 main gradient on the first stage."""
    model = ModelSpec(name="gpt-1.7b", layers=24, hidden=2048, heads=16, ffn=8192, vocab=131072, tied_embeddings=False)
    dev = resolve_device("h100-sxm")
    split = Split(dp=48, zero=1)
    train = Training(seq_len=4096, global_batch=192, micro_batch=1, recompute="none")
    core = resolve_engine("megatron-core")
    assert (core.grad_buffer_passes, core.embedding_grad_bytes, core.optimizer_bytes_per_param) == (2, 12, 34)
    without = with_overrides(core, grad_buffer_passes=0.0, embedding_grad_bytes=0.0, optimizer_bytes_per_param=38.0)
    on, off = step_time(model, dev, split, train, core), step_time(model, dev, split, train, without)
    bw = dev.hbm_bandwidth * core.hbm_efficiency
    replica = sum(stage_params(model, split, 0))
    # two 4-byte passes over every local gradient; the 4 bytes of zeroing leave the optimizer's 1/48 shard
    assert on.optimizer_s - off.optimizer_s == pytest.approx((replica * 2 * 4 - replica / 48 * 4) / bw)
    embedding = 12 * model.vocab * model.hidden / bw
    assert on.elementwise_s - off.elementwise_s == pytest.approx(on.micro_batches * embedding)
    # the embedding is the first stage's: with pp 2 the last stage (logits) paces the step and pays none of it
    split2 = Split(pp=2, dp=24, zero=1)
    on2, off2 = step_time(model, dev, split2, train, core), step_time(model, dev, split2, train, without)
    assert on2.elementwise_s == pytest.approx(off2.elementwise_s)
