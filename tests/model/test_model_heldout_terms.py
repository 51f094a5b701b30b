"""Issue 28: the terms the held-out runs exposed (benchmarks/heldout_model.py): attention's backward work in the
rates' own convention, torchtitan's and llm-foundry's memory-bound ops counted op by op, and FSDP's SHARD_GRAD_OP
as it issues its collectives."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys

import pytest
from conftest import ROOT

from tracediag.errors import SpecError
from tracediag.model.ceilings import MOE_MEASURED, moe_warning
from tracediag.model.elementwise import forward_bytes, moe_dispatch_bytes, te_cp_bytes, te_fp8_bytes, torch_cp_bytes
from tracediag.model.emit import megatron_args
from tracediag.model.memory import (
    activation_bytes_per_layer,
    cp_gather_bytes,
    layer_params_local,
    stage_memory,
    stage_params,
)
from tracediag.model.predict import predict
from tracediag.model.rates import BACKWARD_FLOPS, attention_rate
from tracediag.model.specs import MODELS, ModelSpec, Split, Training, resolve_device
from tracediag.model.stack import resolve_engine, with_overrides
from tracediag.model.time import _attention_time, collective_time, layer_cost, process_group_links, step_time


def test_attention_backward_is_two_and_a_half_forwards_at_the_backward_rate():
    model, dev, engine = MODELS["llama3-8b"](), resolve_device("h100-sxm"), resolve_engine("megatron-core")
    flops = 1e15
    fwd, bwd = _attention_time(flops, 8192, dev, engine, model)
    assert engine.attention_kernel == "cudnn"
    r_f = attention_rate(dev.arch, "cudnn", 8192, 128, backward=False)
    r_b = attention_rate(dev.arch, "cudnn", 8192, 128, backward=True)
    assert BACKWARD_FLOPS == 2.5
    assert fwd == pytest.approx(flops / (dev.peak_flops * dev.gemm_efficiency * r_f))
    assert bwd / fwd == pytest.approx(2.5 * r_f / r_b)


def test_fa2_forward_plus_backward_matches_the_labelled_benchmark_bars():
    # flash-attention assets/flash2_{a100,h100}_fwd_bwd_benchmark.png (d), causal hd128, 16k: 189 and 328 TFLOP/s
    # counted as 3.5 x the forward's FLOPs; the model's fwd and bwd curves, timed as it times them.
    model = MODELS["llama3-8b"]()
    engine = with_overrides(resolve_engine("megatron-core"), attention_kernel="fa2")
    for device, published in (("a100-80gb", 189), ("h100-sxm", 328)):
        fwd, bwd = _attention_time(1e15, 16384, resolve_device(device), engine, model)
        assert 3.5e15 / (fwd + bwd) / 1e12 == pytest.approx(published, rel=0.06)


def test_torchtitan_llama_block_bytes_by_hand():
    model = MODELS["llama3-8b"]()  # h 4096, 32 heads, 8 kv heads, hd 128, ffn 14336, SwiGLU
    train = Training(seq_len=1, global_batch=1, micro_batch=1)
    h, q, kv, f = 4096, 4096, 1024, 14336
    repeat = 2 * (2 * kv + 2 * q)
    eager = 2 * 36 * h + 2 * 6 * h + 20 * (q + kv) + repeat + 10 * f
    compiled = 18 * h + 4 * (q + kv) + repeat + 6 * f
    assert forward_bytes(model, Split(), train, "torchtitan-eager") == eager == 610_304
    assert forward_bytes(model, Split(), train, "torchtitan-compile") == compiled == 200_704
    # tp 2 with sequence parallelism halves every tensor
    split = Split(tp=2, dp=1, sequence_parallel=True)
    assert forward_bytes(model, split, train, "torchtitan-eager") == eager / 2
    with pytest.raises(SpecError, match="elementwise ops"):
        forward_bytes(model, Split(), train, "eager")


def test_llm_foundry_mpt_block_bytes_by_hand():
    # MPT-7B (llm-foundry's mpt-7b.yaml): h 4096, 32 heads, no GQA, GELU MLP at 4h
    model = ModelSpec(name="mpt-7b", layers=32, hidden=4096, heads=32, ffn=16384, vocab=50368)
    train = Training(seq_len=1, global_batch=1, micro_batch=1)
    # two bf16 LayerNorms (2 + 2), two residual adds (2 + 2 + 2), GELU (2 + 2) per ffn element; no dropout
    assert forward_bytes(model, Split(), train, "llm-foundry-mpt") == 2 * 4 * 4096 + 2 * 6 * 4096 + 4 * 16384
    # the generic eager prior charges the same block twice as much (2.25 round trips of 32 stored bytes per h)
    engine = resolve_engine("pytorch-fsdp")
    assert engine.elementwise_ops == "llm-foundry-mpt"
    assert engine.attention_kernel == "triton"  # submit_benchmarks.py's attn_impl default
    generic = engine.elementwise_traffic * activation_bytes_per_layer(model, Split(), train, engine)
    assert generic == pytest.approx(72 * 4096)
    # flash-attn 1.0.9's fused cross-entropy: read the bf16 logits, then read them and write their gradient
    assert engine.loss_bytes_per_logit == 6


def test_eager_torchtitan_pays_the_counted_bytes_over_hbm():
    model, dev = MODELS["llama3-8b"](), resolve_device("h100-sxm")
    train = Training(seq_len=8192, global_batch=8, micro_batch=1, recompute="none")
    eager, compiled = resolve_engine("torchtitan"), resolve_engine("torchtitan-compile")
    split = Split(dp=8, zero=3)
    diff = (
        layer_cost(model, dev, eager, split, train).elementwise
        - layer_cost(model, dev, compiled, split, train).elementwise
    )
    bw = dev.hbm_bandwidth * eager.hbm_efficiency
    counted = forward_bytes(model, split, train, "torchtitan-eager") - forward_bytes(
        model, split, train, "torchtitan-compile"
    )
    assert diff == pytest.approx(3 * counted / bw)  # forward + twice that backward
    generic = dataclasses.replace(eager, elementwise_ops="")
    assert (
        layer_cost(model, dev, generic, split, train).elementwise
        < layer_cost(model, dev, eager, split, train).elementwise
    )
    with pytest.raises(SpecError, match="elementwise_ops"):
        dataclasses.replace(eager, elementwise_ops="eager")


def test_torch_cp_moves_repeated_kv_and_rings_fp32_gradients():
    # Llama 3.1 405B (128 heads, 8 kv heads, hd 128) at 256K, tp8 cp8 across nodes, full recompute, as
    # torchtitan ran it: SDPA sees K,V repeated to 128/8 = 16 heads per rank, not 8/8 = 1.
    model = MODELS["llama3.1-405b"]()
    dev = resolve_device("h100-hbm2e-500w")
    split = Split(tp=8, cp=8, dp=1, pp=8, sequence_parallel=True)
    train = Training(seq_len=262144, global_batch=8, micro_batch=1, recompute="full")
    titan = with_overrides(resolve_engine("torchtitan-compile"), cp_all_gather=True)  # torchtitan's default rotation
    assert titan.cp_repeat_kv
    assert titan.cp_grad_ring_fp32
    assert not resolve_engine("megatron-core").cp_repeat_kv
    cost = layer_cost(model, dev, titan, split, train)
    kv_bytes = 2 * (262144 / 8) * 16 * 128 * 2  # 268 MB: K and V of this rank's 32K tokens, 16 heads, bf16
    link = process_group_links(dev, split, titan.collective_overhead_us)["cp"]
    gather = collective_time("all_gather", 8 * kv_bytes, 8, link)
    hop = collective_time("p2p", 2 * kv_bytes, 2, link)  # fp32 gradients of K and V: twice the bytes
    # compiled, each collective is waited on where it is issued: two forward gathers (forward, recompute), the
    # backward's, and the fp32 gradients' 8 hops, all exposed
    assert titan.cp_compiled
    assert cost.cp_comm == pytest.approx(3 * gather + 8 * hop)
    assert 0.03 < gather < 0.06
    assert 0.01 < hop < 0.015  # 537 MB over one 400 Gb/s RoCE NIC
    # eager (the same code, no torch.compile): each gather behind the first of the 8 attention steps of its pass,
    # each gradient hop behind the next backward step, the last one waited on after the loop
    eager = with_overrides(resolve_engine("torchtitan"), cp_all_gather=True)
    assert not eager.cp_compiled
    fwd, bwd = _attention_time(4 * (262144 / 8) * 262144 * 128 * 128 / 8 / 2, 262144 / 8, dev, eager, model)
    want = 2 * max(gather - fwd / 8, 0) + max(gather - bwd / 8, 0) + 7 * max(hop - bwd / 8, 0) + hop
    assert layer_cost(model, dev, eager, split, train).cp_comm == pytest.approx(want)
    assert want < 0.5 * cost.cp_comm
    # rotation "alltoall" compiled: every pass fetches K,V in 7 hops, all exposed like the gradients'
    ring = dataclasses.replace(titan, cp_all_gather=False)
    kv_hop = collective_time("p2p", kv_bytes, 2, link)
    assert layer_cost(model, dev, ring, split, train).cp_comm == pytest.approx(3 * 7 * kv_hop + 8 * hop)
    # the kv-heads count (what Llama 3's own all-gather CP moves) is 16x smaller
    plain = layer_cost(
        model, dev, dataclasses.replace(titan, cp_repeat_kv=False, cp_grad_ring_fp32=False), split, train
    )
    assert plain.cp_comm < cost.cp_comm / 10


def test_all_gather_cp_holds_the_whole_sequences_kv_in_the_backward():
    """All-gather CP materialises every rank's K,V for the layer it computes: torchtitan's (K,V repeated to the
    query heads, fp32 gradients passed round a ring one chunk at a time) and Llama 3's (kv-heads, gradients
    reduce-scattered from a whole-sequence buffer). The ring CP holds none of it."""
    model = MODELS["llama3.1-8b"]()  # 32 heads, 8 kv heads, hd 128
    dev = resolve_device("h100-hbm2e-500w")
    train = Training(seq_len=262144, global_batch=1, micro_batch=1, recompute="full")
    split = Split(tp=1, cp=8, dp=1, zero=3)
    titan = with_overrides(resolve_engine("torchtitan-compile"), cp_all_gather=True)
    ring = dataclasses.replace(titan, cp_all_gather=False)
    kv_full = 2 * 262144 * 32 * 128 * 2  # K and V of all 256K tokens, 32 heads, bf16: 4.3 GB
    grads = 2 * (2 * kv_full / 8)  # fp32 dK,dV of one rank's chunk, accumulating and in flight
    extra = stage_memory(model, dev, split, train, titan, 0).temporary
    assert extra - stage_memory(model, dev, split, train, ring, 0).temporary == pytest.approx(kv_full + grads)
    assert cp_gather_bytes(model, split, train, titan) == pytest.approx(6.44e9, rel=0.01)
    llama3 = with_overrides(resolve_engine("megatron-core"), cp_all_gather=True)
    sp = Split(tp=8, cp=16, pp=16, dp=1, zero=1, sequence_parallel=True)
    t3 = Training(seq_len=131072, global_batch=16, micro_batch=1)
    big = MODELS["llama3.1-405b"]()  # 8 kv heads over tp 8: one per rank
    assert cp_gather_bytes(big, sp, t3, llama3) == pytest.approx(2 * (2 * 131072 * 1 * 128 * 2))
    assert cp_gather_bytes(model, dataclasses.replace(split, cp=1), train, titan) == 0.0


def test_torch_cp_ring_merges_and_accumulates_over_hbm():
    # Llama 3.1 8B at 256K on 8 GPUs, cp8, full recompute (torchtitan Table 2): each rank's 32K queries, 32 heads
    # of 128 = 134M elements; compiled, the 7 steps after the first merge into the fp32 output at 10 bytes an
    # element (plus the all-gather's pack and the result's cast, 14 a pass) and the backward accumulates dQ and
    # dK,dV at 30 (plus 44 a pass: zeros, first step, casts, pack)
    model = MODELS["llama3.1-8b"]()
    dev = resolve_device("h100-hbm2e-500w")
    split = Split(tp=1, cp=8, dp=1, pp=1)
    train = Training(seq_len=262144, global_batch=1, micro_batch=1, recompute="full")
    n_q = 32768 * 32 * 128
    assert torch_cp_bytes(model, split, train, compiled=True, all_gather=True) == (84 * n_q, 254 * n_q)
    assert torch_cp_bytes(model, split, train, compiled=False, all_gather=True) == (342 * n_q, 504 * n_q)
    assert torch_cp_bytes(model, dataclasses.replace(split, cp=1), train, compiled=True, all_gather=True) == (0, 0)
    titan = with_overrides(resolve_engine("torchtitan-compile"), cp_all_gather=True)
    bw = dev.hbm_bandwidth * titan.hbm_efficiency
    with_ring = layer_cost(model, dev, titan, split, train)
    without = layer_cost(model, dev, dataclasses.replace(titan, cp_grad_ring_fp32=False), split, train)
    # two forward passes (forward, recompute) and the backward: 422 bytes an element, 57 GB, ~29 ms a layer
    assert with_ring.elementwise - without.elementwise == pytest.approx((2 * 84 + 254) * n_q / bw)
    assert with_ring.recompute - without.recompute == pytest.approx(84 * n_q / bw)
    assert 0.025 < (2 * 84 + 254) * n_q / bw < 0.035


def test_triton_attention_gives_its_measured_bars_with_a_fast_forward():
    # Dao 2023 Fig. 4(d) (flash-attention assets/flash2_a100_fwd_bwd_benchmark.png (d)): FlashAttention Triton,
    # A100 causal hd128, forward + backward 50 / 68 / 80 TFLOP/s at 512 / 2k / 16k; its forward 1/1.4 of FA2's.
    model, a100 = MODELS["llama3-8b"](), resolve_device("a100-80gb")
    engine = with_overrides(resolve_engine("pytorch-fsdp"), attention_kernel="triton")
    fa2 = with_overrides(engine, attention_kernel="fa2")
    for seq, published in ((512, 50), (2048, 68), (16384, 80)):
        fwd, bwd = _attention_time(1e15, seq, a100, engine, model)
        f2, b2 = _attention_time(1e15, seq, a100, fa2, model)
        # the bars' ratio to FA2's bar (99 / 155 / 189) times the model's own FA2 rate
        fa2_bar = {512: 99, 2048: 155, 16384: 189}[seq]
        assert 3.5e15 / (fwd + bwd) == pytest.approx(published / fa2_bar * 3.5e15 / (f2 + b2))
        assert fwd / f2 == pytest.approx(1.4)
        assert bwd / b2 > 2.1  # the backward loses most: 2.2x (512) to 2.7x (16k) FA2's time
    # at 16k the implied bar is within the FA2 curve's own 6% of the published 80 TFLOP/s
    fwd, bwd = _attention_time(1e15, 16384, a100, engine, model)
    assert 3.5e15 / (fwd + bwd) / 1e12 == pytest.approx(80, rel=0.06)
    # Hopper: the A100 ratio on the H100 FA2 curve (no published H100 Triton bar)
    h100 = resolve_device("h100-sxm")
    fwd, bwd = _attention_time(1e15, 16384, h100, engine, model)
    f2, b2 = _attention_time(1e15, 16384, h100, fa2, model)
    assert (f2 + b2) / (fwd + bwd) == pytest.approx(80 / 189)
    with pytest.raises(SpecError, match="fa1, fa2, fa3, cudnn or triton"):
        with_overrides(engine, attention_kernel="fa4")


def test_flashattention_v1_gives_its_labelled_bars():
    # flash-attention assets/flash2_{a100,h100}_fwd_bwd_benchmark.png (d): FlashAttention (v1), causal hd128,
    # forward + backward 55 / 69 / 83 TFLOP/s on A100 and 98 / 108 / 137 on H100 at 512 / 2k / 16k, against
    # FlashAttention-2's 99 / 155 / 189 and 163 / 265 / 328.
    model = MODELS["llama3-8b"]()
    fa1 = with_overrides(resolve_engine("megatron-core"), attention_kernel="fa1")
    fa2 = with_overrides(fa1, attention_kernel="fa2")
    bars = {"a100-80gb": ((55, 99), (69, 155), (83, 189)), "h100-sxm": ((98, 163), (108, 265), (137, 328))}
    for gpu, pairs in bars.items():
        dev = resolve_device(gpu)
        for seq, (v1, v2) in zip((512, 2048, 16384), pairs, strict=True):
            f1, b1 = _attention_time(1e15, seq, dev, fa1, model)
            f2, b2 = _attention_time(1e15, seq, dev, fa2, model)
            assert (f2 + b2) / (f1 + b1) == pytest.approx(v1 / v2)
            assert f2 / f1 == pytest.approx(b2 / b1)  # FA2's split between the passes


def test_transformer_engine_tp_overlap_costs_its_sms_not_overlap_slowdown():
    # Megatron-Core's userbuffers (TE initialize_ub defaults): reduce-scatters and the two backward re-gathers
    # hold 16 SMs while they run (6 of a layer's 10 collectives), ring-exchange all-gathers use copy engines.
    from tracediag.model.time import step_time

    model, dev = MODELS["llama3-70b"](), resolve_device("h100-sxm")
    split = Split(tp=8, dp=1, sequence_parallel=True)
    train = Training(seq_len=4096, global_batch=4, micro_batch=1, recompute="none")
    te = resolve_engine("megatron-core")
    assert te.tp_overlap_sms == 16
    cost = layer_cost(model, dev, te, split, train)
    hidden = 4 * model.layers * (cost.tp_comm_raw - cost.tp_comm)
    nccl = dataclasses.replace(te, tp_overlap_sms=0)
    no_dp = step_time(model, dev, split, train, te).interference_s
    assert no_dp == pytest.approx(hidden * 0.6 * 16 / 132)
    # the NCCL-style charge is overlap_slowdown x all of it, four times more here
    assert step_time(model, dev, split, train, nccl).interference_s == pytest.approx(hidden * te.overlap_slowdown)
    # and a bigger overlap_slowdown no longer moves a TE run's TP cost
    assert step_time(model, dev, split, train, dataclasses.replace(te, overlap_slowdown=0.75)).interference_s == (
        pytest.approx(no_dp)
    )


def test_fsdp_shard_grad_op_gathers_each_unit_once_and_reduce_scatters_each_unit():
    # FSDP1 SHARD_GRAD_OP (llm-foundry's large-scale 1B/3B runs): each unit's parameters are all-gathered for its
    # forward and kept through its backward, its gradients reduce-scattered after it, in every micro-batch; not
    # one bulk reduce-scatter and all-gather per step as Megatron's distributed optimizer issues them.
    model, dev = MODELS["gpt3-1.3b"](), resolve_device("h100-sxm")
    split = Split(dp=512, zero=2)
    train = Training(seq_len=2048, global_batch=512 * 12 * 2, micro_batch=12, grad_bytes=4)
    fsdp = resolve_engine("pytorch-fsdp")
    assert fsdp.zero2_per_unit
    assert not resolve_engine("megatron-core").zero2_per_unit
    link = process_group_links(dev, split)["dp"]
    unit = layer_params_local(model, split)[0]
    total = sum(stage_params(model, split, 0))
    rest = total - model.layers * unit
    gather = collective_time("all_gather", 2 * unit, 512, link)
    reduce = collective_time("reduce_scatter", 4 * unit, 512, link)
    edge = collective_time("all_gather", 2 * rest, 512, link) + collective_time("reduce_scatter", 4 * rest, 512, link)
    t = step_time(model, dev, split, train, fsdp)
    assert t.micro_batches == 2
    assert t.dp_comm_s == pytest.approx(2 * (model.layers * (gather + reduce) + edge))
    # FULL_SHARD gathers each unit again for the backward
    t3 = step_time(model, dev, dataclasses.replace(split, zero=3), train, fsdp)
    assert t3.dp_comm_s == pytest.approx(
        2 * (model.layers * (2 * gather + reduce) + edge + collective_time("all_gather", 2 * rest, 512, link))
    )
    # the bulk pair, once per step, is what the mechanism replaces
    bulk = step_time(model, dev, split, train, with_overrides(fsdp, zero2_per_unit=False))
    assert bulk.dp_comm_s == pytest.approx(
        collective_time("reduce_scatter", 4 * total, 512, link) + collective_time("all_gather", 2 * total, 512, link)
    )
    assert t.dp_comm_s > 10 * bulk.dp_comm_s  # 24 units' rings of 511 steps against one of each


def _validate_model():
    if "validate_model" in sys.modules:
        return sys.modules["validate_model"]
    spec = importlib.util.spec_from_file_location("validate_model", ROOT / "benchmarks" / "validate_model.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_llm_foundry_rows_run_the_kernel_sharding_and_gradient_dtype_their_tables_say():
    # llm-foundry 5e85bd62 scripts/train/benchmarking/sweep.py (the large-scale H100 table's runs): 1b/3b
    # SHARD_GRAD_OP, attn_impl flash for 1b/7b/70b and triton for 13b/30b; every table's MP Mode column is the
    # run's fsdp_config.mixed_precision (collect_results.py), DEFAULT reducing fp32 gradients (Composer).
    vm = _validate_model()
    cases, _ = vm.cases(ROOT / "benchmarks" / "heldout_model.csv")
    large = {
        c.name: c
        for c in cases
        if c.publication == "llm-foundry" and c.device_name == "h100-sxm" and dict(c.split)["dp"] == 512
    }
    assert set(large) == {"MPT-70b", "MPT-30b", "MPT-13b", "MPT-7b", "MPT-1b"}
    assert {n: dict(c.split)["zero"] for n, c in large.items()} == {
        "MPT-70b": 3,
        "MPT-30b": 3,
        "MPT-13b": 3,
        "MPT-7b": 3,
        "MPT-1b": 2,
    }
    kernel = {n: vm.engine_for(c.engine, dict(c.engine_overrides), ()).attention_kernel for n, c in large.items()}
    assert kernel == {"MPT-70b": "fa2", "MPT-30b": "triton", "MPT-13b": "triton", "MPT-7b": "fa2", "MPT-1b": "fa2"}
    foundry = [c for c in cases if c.publication == "llm-foundry"]
    assert len(foundry) == 35
    # the A100 80GB table's 70b rows ran PURE (bf16 reduction), every other held-out row DEFAULT
    pure = [c for c in foundry if c.train.grad_bytes == 2]
    assert [(c.name, c.device_name) for c in pure] == [("MPT-70b", "a100-80gb")]


def test_te_cudnn_attention_gives_transformer_engines_own_measured_speedup_over_flash_attn():
    """Megatron-Core's attention is cuDNN's as Transformer Engine 1.7 measured it against flash-attn 2.4.2 (TE v1.8
    docs/examples/attention/attention.ipynb, H100 PCIe): 0.7496 / 0.5415 ms at 2K causal, 19.0716 / 12.0122 ms at 8K
    causal GQA, forward + backward; the FlashAttention-3 paper's cuDNN bars (fa3) are faster than that."""
    model, h100 = MODELS["llama3-8b"](), resolve_device("h100-sxm")
    core = resolve_engine("megatron-core")
    fa2, fa3 = (with_overrides(core, attention_kernel=k) for k in ("fa2", "fa3"))
    for seq, speedup in ((2048, 0.7496 / 0.5415), (8192, 19.0716 / 12.0122)):
        cudnn = sum(_attention_time(1e15, seq, h100, core, model))
        assert sum(_attention_time(1e15, seq, h100, fa2, model)) / cudnn == pytest.approx(speedup)
        assert sum(_attention_time(1e15, seq, h100, fa3, model)) < cudnn
    # between the measured lengths the speed-up is interpolated in log(s), beyond them held
    at_4k = sum(_attention_time(1e15, 4096, h100, fa2, model)) / sum(_attention_time(1e15, 4096, h100, core, model))
    assert at_4k == pytest.approx((0.7496 / 0.5415 + 19.0716 / 12.0122) / 2)
    at_32k = sum(_attention_time(1e15, 32768, h100, fa2, model)) / sum(_attention_time(1e15, 32768, h100, core, model))
    assert at_32k == pytest.approx(19.0716 / 12.0122)
    # Ampere: TE prefers flash-attn there (and the model has no Ampere cuDNN rate): FA2's
    a100 = resolve_device("a100-80gb")
    assert _attention_time(1e15, 4096, a100, core, model) == _attention_time(1e15, 4096, a100, fa2, model)


def test_transformer_engine_cp_ring_pays_its_merges_and_gradient_accumulation():
    """Megatron-Core's CP is TE's P2P ring (`AttnFuncWithCP`, TE v1.8): per pass K,V packed, the output zeroed and every
    step merged into it; backward K,V copied, and each step's dQ added and dK,dV packed and added. Llama 3's
    all-gather CP does not run it."""
    model = MODELS["llama3-8b"]()  # 32 heads, 8 KV heads, hd 128
    train = Training(seq_len=8192, global_batch=4, micro_batch=1, recompute="none")
    split = Split(dp=2, cp=2, zero=1)
    n_q, n_kv = 4096 * 32 * 128, 4096 * 8 * 128
    fwd, bwd = te_cp_bytes(model, split, train)
    assert fwd == 8 * n_kv + 2 * n_q + 2 * 6 * n_q
    assert bwd == 8 * n_kv + 2 * (6 * n_q + 20 * n_kv)
    assert te_cp_bytes(model, Split(dp=4, zero=1), train) == (0.0, 0.0)
    h100 = resolve_device("h100-sxm")
    core = resolve_engine("megatron-core")
    assert core.cp_te_p2p
    off = with_overrides(core, cp_te_p2p=False)
    bw = h100.hbm_bandwidth * core.hbm_efficiency
    diff = (
        layer_cost(model, h100, core, split, train).elementwise - layer_cost(model, h100, off, split, train).elementwise
    )
    assert diff == pytest.approx((fwd + bwd) / bw)
    gathered = with_overrides(core, cp_all_gather=True)
    assert layer_cost(model, h100, gathered, split, train).elementwise == pytest.approx(
        layer_cost(model, h100, with_overrides(off, cp_all_gather=True), split, train).elementwise
    )


def test_transformer_engine_fp8_casts_are_counted_from_its_linear_layers():
    """Megatron-Core's fp8 (TE v1.8, delayed scaling): the norms write fp8, the projection's and fc2's inputs and every
    GEMM's output gradient are cast and transposed, the norms' outputs transposed for the wgrad, and each weight is
    cast and transposed once a step; other stacks keep 1.25 x their memory-bound traffic."""
    model = ModelSpec(
        name="llama2-7b", layers=32, hidden=4096, heads=32, ffn=11008, vocab=32000, swiglu=True, tied_embeddings=False
    )
    train = Training(seq_len=4096, global_batch=8, micro_batch=1, recompute="none", dtype="fp8")
    split = Split(dp=8, zero=1)
    n, f = 4096 * 4096, 4096 * 11008  # per micro-batch: h, q, k and v are all 4096 wide here; ffn 11008
    fwd, bwd = te_fp8_bytes(model, split, train)
    assert fwd == 4 * (n + f) - 2 * n
    assert bwd == 4 * (n + 2 * n) + 4 * 2 * f + 2 * 4 * n + 2 * 2 * n
    h100 = resolve_device("h100-sxm")
    core = resolve_engine("megatron-core")
    assert core.fp8_te_casts
    bf16 = dataclasses.replace(train, dtype="bf16")
    bw = h100.hbm_bandwidth * core.hbm_efficiency
    fp8_ew = layer_cost(model, h100, core, split, train).elementwise
    assert fp8_ew - layer_cost(model, h100, core, split, bf16).elementwise == pytest.approx((fwd + bwd) / bw)
    generic = with_overrides(core, fp8_te_casts=False)
    bf16_ew = layer_cost(model, h100, generic, split, bf16).elementwise
    assert layer_cost(model, h100, generic, split, train).elementwise == pytest.approx(1.25 * bf16_ew)
    # the weights: 4 bytes per local parameter a step
    on, off = step_time(model, h100, split, train, core), step_time(model, h100, split, train, generic)
    assert on.optimizer_s - off.optimizer_s == pytest.approx(4 * sum(stage_params(model, split, 0)) / bw)


def test_megatron_bridge_rows_run_the_device_gradient_dtype_and_buffer_passes_their_recipes_say():
    # Megatron-Bridge perf recipes: grad_reduce_in_fp32 False (bf16 gradient buffer) in both containers; 25.09's
    # YAMLs (fa0315ae) turn ddp.check_for_nan_in_grad off, 25.11's llama recipes (97ad8cc6) keep it on.
    vm = _validate_model()
    cases, _ = vm.cases(ROOT / "benchmarks" / "heldout_model.csv")
    bridge = [c for c in cases if c.publication == "Megatron-Bridge"]
    assert sorted({c.device_name for c in bridge}) == ["b200", "gb200", "h100-sxm"]
    assert {c.generation for c in bridge} == {"B200", "H100"}
    assert all(c.train.grad_bytes == 2 and c.train.dtype == "fp8" for c in bridge)
    passes = {
        c.index: vm.engine_for(c.engine, dict(c.engine_overrides), ()).grad_buffer_passes
        for c in bridge
        if c.device_name == "b200"
    }
    assert sorted(passes.values()) == [1.0, 1.0, 2.0, 2.0]


QWEN3_30B = ModelSpec(
    layers=48, hidden=2048, heads=32, kv_heads=4, attention_head_dim=128, ffn=768, swiglu=True, vocab=151936,
    experts=128, top_k=8,
)  # fmt: skip


def test_moe_dispatcher_bytes_by_hand():
    """Megatron-Core's all-to-all dispatcher around Qwen3-30B-A3B's experts, 4096 tokens, k = 8, h = 2048: the
    permute (4 bytes per routed copy), the two regroupings by local expert (4 each, only with several experts
    per rank behind an all-to-all), the probability weighting and scatter-add (6 per copy, 4 per token)."""
    train = Training(seq_len=4096, global_batch=8, micro_batch=1)
    copies, tokens = 4096 * 8 * 2048, 4096 * 2048
    assert moe_dispatch_bytes(QWEN3_30B, Split(dp=8, ep=8), train) == 18 * copies + 4 * tokens
    assert moe_dispatch_bytes(QWEN3_30B, Split(dp=8, ep=1), train) == 10 * copies + 4 * tokens
    sp = Split(tp=2, dp=4, ep=4, sequence_parallel=True)  # each tp rank dispatches its half of the sequence
    assert moe_dispatch_bytes(QWEN3_30B, sp, train) == (18 * copies + 4 * tokens) / 2
    assert moe_dispatch_bytes(MODELS["llama3-8b"](), Split(dp=8), train) == 0.0
    # the step pays it three times (forward, backward twice) over HBM, beside the block's own prior
    dev, eng = resolve_device("h100-sxm"), resolve_engine("megatron-core")
    split = Split(dp=8, ep=8, zero=1)
    cost = layer_cost(QWEN3_30B, dev, eng, split, train)
    bw = dev.hbm_bandwidth * eng.hbm_efficiency
    prior = eng.elementwise_traffic * activation_bytes_per_layer(QWEN3_30B, split, train, eng)
    assert cost.elementwise == pytest.approx(3 * (prior + 18 * copies + 4 * tokens) / bw)


def test_full_recompute_reruns_the_expert_all_to_alls():
    dev, eng = resolve_device("h100-sxm"), resolve_engine("megatron-core")
    split = Split(dp=16, ep=16, zero=1)
    base = Training(seq_len=4096, global_batch=16, micro_batch=1)
    none = layer_cost(QWEN3_30B, dev, eng, split, base).ep_comm
    full = layer_cost(QWEN3_30B, dev, eng, split, dataclasses.replace(base, recompute="full")).ep_comm
    assert full == pytest.approx(none * 6 / 4)


def test_moe_predictions_carry_the_measured_miss():
    """The MoE warning's range is what benchmarks/heldout_moe.py measures now, and only MoE models carry it."""
    spec = importlib.util.spec_from_file_location("heldout_moe", ROOT / "benchmarks" / "heldout_moe.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    lo, hi = module.optimism_range()
    assert (round(lo, 2), round(hi, 2)) == MOE_MEASURED
    assert len(module.scores()[0]) >= 8
    dev, eng = resolve_device("h100-sxm"), resolve_engine("megatron-core")
    train = Training(seq_len=4096, global_batch=16, micro_batch=1)
    moe = predict(QWEN3_30B, dev, Split(dp=16, ep=8, zero=1), train, eng)
    assert f"{hi:.2f}x" in moe_warning(moe)
    assert moe_warning(predict(MODELS["llama3-8b"](), dev, Split(dp=16, zero=1), train, eng)) == ""


def test_experts_fold_over_tensor_parallel_ranks_as_megatron_core_runs_them():
    """Qwen3-235B-A22B on 256 H100 as Megatron-Bridge runs it: tp 2, pp 8, ep 32 over dp 16, which only MoE
    parallel folding allows (expert tensor parallelism 1: the EP group takes both tp ranks of 16 replicas)."""
    model = dataclasses.replace(QWEN3_30B, layers=94, hidden=4096, heads=64, ffn=1536)
    dev, eng = resolve_device("h100-sxm"), resolve_engine("megatron-core")
    train = Training(seq_len=4096, global_batch=2048, micro_batch=1)
    with pytest.raises(SpecError, match="etp"):
        predict(model, dev, Split(tp=2, pp=8, dp=16, ep=32, zero=1, sequence_parallel=True), train, eng)
    folded = Split(tp=2, pp=8, dp=16, ep=32, etp=1, zero=1, sequence_parallel=True)
    p = predict(model, dev, folded, train, eng)
    assert (folded.expert_tp, folded.expert_dp) == (1, 1)
    # every rank holds 4 whole experts (not 8 halves at tp 2): 128/32 of the layer's expert weights
    assert layer_params_local(model, folded)[1] == 128 * 3 * 4096 * 1536 / 32
    # its EP group is 32 consecutive ranks (4 nodes), not 32 ranks 2 apart
    links = process_group_links(dev, folded)
    assert links["ep"].alltoall_busbw == pytest.approx(31 / (24 / dev.inter_link.busbw))
    # etp = tp spelled out is the unfolded layout
    plain = Split(tp=2, pp=8, dp=16, cp=2, ep=8, zero=1, sequence_parallel=True)
    same = dataclasses.replace(plain, etp=2)
    assert process_group_links(dev, same)["ep"] == process_group_links(dev, plain)["ep"]
    # the experts' FLOPs per rank are the unfolded split's (half the tokens through whole experts): without the
    # tile term the GEMM times agree; with it the folded split's wider expert GEMMs run faster
    unfolded = Split(tp=2, pp=8, dp=16, ep=16, zero=1, sequence_parallel=True)
    flat = with_overrides(eng, gemm_half_dim=0.0)
    a, b = (layer_cost(model, dev, flat, sp, train).gemm for sp in (folded, unfolded))
    assert a == pytest.approx(b, rel=1e-9)
    a, b = (layer_cost(model, dev, eng, sp, train).gemm for sp in (folded, unfolded))
    assert a < b
    assert "--expert-tensor-parallel-size" in megatron_args(p)
    with pytest.raises(SpecError, match="etp"):
        Split(tp=2, etp=3)
    with pytest.raises(SpecError, match="sequence parallelism"):
        predict(model, dev, dataclasses.replace(folded, sequence_parallel=False), train, eng)
