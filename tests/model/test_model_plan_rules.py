"""Issue 10 item 6: plans an expert would sign — headroom, emit-aware search, uneven interleaving, near-ties,
true reasons, published MFU ceilings."""

from __future__ import annotations

import dataclasses
import re

import orjson
import pytest

from tracediag.model.ceilings import ceiling_for
from tracediag.model.emit import deepspeed_config, emit, megatron_args, unsupported
from tracediag.model.plan import (
    DEFAULT_HEADROOM,
    NEAR_TIE,
    ceiling_warning,
    complexity,
    interleavings,
    plan,
)
from tracediag.model.predict import predict
from tracediag.model.specs import MODELS, Split, Training, resolve_device, stage_layers
from tracediag.model.stack import assumptions, resolve_engine

tomllib = pytest.importorskip("tomllib")

MODERN = resolve_engine("megatron-core")
H100 = resolve_device("h100-sxm")
ARGS = {"gpus": 64, "seq_len": 8192, "global_batch": 128}


@pytest.fixture(scope="module")
def llama70b():
    return MODELS["llama3-70b"]()


def test_headroom_keeps_memory_free(llama70b):
    """Without headroom splits that fill more than 90% of memory are searched (the issue's complaint: the best
    70B split filled 79 of 80 GiB); with the default they are not, and the flag is honoured exactly."""
    tight = plan(llama70b, H100, MODERN, top=1, headroom=0.0, **ARGS)
    assert tight.fitting > plan(llama70b, H100, MODERN, top=1, **ARGS).fitting
    for headroom in (DEFAULT_HEADROOM, 0.2):
        result = plan(llama70b, H100, MODERN, top=3, headroom=headroom, **ARGS)
        assert result.headroom == headroom
        for r in result.ranked:
            assert r.prediction.memory.total <= (1 - headroom) * r.prediction.memory.capacity


@pytest.mark.parametrize("target", ["megatron", "torchtitan", "deepspeed"])
def test_emit_aware_plan_proposes_only_what_the_target_runs(llama70b, target):
    result = plan(llama70b, H100, MODERN, top=4, target=target, **ARGS)
    assert result.target == target
    for r in result.ranked:
        p = r.prediction
        assert unsupported(target, p.model, p.split) is None
        text = emit(p, target)  # never raises for a proposed split
        s = p.split
        if target == "megatron":
            words = megatron_args(p)
            assert s.zero in (0, 1, 3)
            assert not (s.zero == 3 and s.pp > 1)
            assert ("--use-distributed-optimizer" in words) == (s.zero == 1 and s.dp * s.cp > 1)
        elif target == "torchtitan":
            par = tomllib.loads(emit(p, "torchtitan-0.2"))["parallelism"]
            assert s.zero in (0, 2, 3)
            if s.zero:
                assert par["fsdp_reshard_after_forward"] == ("always" if s.zero == 3 else "never")
        else:
            cfg = deepspeed_config(p)
            assert text.endswith(orjson.dumps(cfg, option=orjson.OPT_INDENT_2).decode() + "\n")
            assert cfg["zero_optimization"]["stage"] == s.zero
            assert s.vpp == 1
            assert s.pp == 1 or s.zero <= 1


def _torchtitan_stage_layers(layers: int, pp: int, per_stage: int, first_less: int, last_less: int, v: int):
    """Layers per rank as torchtitan's `generate_llm_fqn_per_model_part` lays out the virtual stages: the
    embedding and output count as `first_less`/`last_less` layers, virtual stage i sits on rank i % pp."""
    units = layers + first_less + last_less
    stages = units // per_stage
    assert stages * per_stage == units
    assert stages == pp * v
    per_rank = [0] * pp
    for i in range(stages):
        per_rank[i % pp] += per_stage - (first_less if i == 0 else 0) - (last_less if i == stages - 1 else 0)
    return tuple(per_rank)


def test_uneven_stages_with_interleaving_as_llama3_ran():
    """405B: 126 layers over 16 stages, the first and last one layer fewer (Llama 3 §3.3.2), interleaved."""
    layers = stage_layers(126, 16)
    assert layers == (7, *[8] * 14, 7)
    assert interleavings(layers) == [2, 4]
    model = MODELS["llama3.1-405b"]()
    split = Split(tp=8, pp=16, dp=8, vpp=2, zero=1, sequence_parallel=True)
    train = Training(seq_len=8192, global_batch=256, micro_batch=1, recompute="full")
    p = predict(model, H100, split, train, MODERN)
    # torchtitan expresses it exactly: 4 layers per virtual stage, embedding/output as the missing layers.
    tt = Split(tp=8, pp=16, dp=8, vpp=2, zero=2, sequence_parallel=True)
    par = tomllib.loads(
        emit(predict(model, H100, tt, Training(seq_len=8192, global_batch=256), MODERN), "torchtitan-0.2")
    )["parallelism"]
    got = _torchtitan_stage_layers(
        126,
        16,
        par["pipeline_parallel_layers_per_stage"],
        par["pipeline_parallel_first_stage_less_layers"],
        par["pipeline_parallel_last_stage_less_layers"],
        2,
    )
    assert got == layers
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    # Megatron splits each stage evenly over its virtual stages, so 7 layers cannot take vpp=2.
    assert "do not split evenly" in unsupported("megatron", model, split)
    assert "--decoder-first-pipeline-num-layers" in megatron_args(
        predict(model, H100, Split(tp=8, pp=16, dp=8, zero=1, sequence_parallel=True), train, MODERN)
    )
    assert p.split.vpp == 2


def test_near_ties_go_to_the_simpler_split_with_true_reasons(llama70b):
    result = plan(llama70b, H100, MODERN, top=6, **ARGS)
    ranked = [r.prediction for r in result.ranked]
    best = ranked[0]
    ceiling = ceiling_for("h100-sxm", llama70b)
    floor = best.model_flops_per_step / (ceiling.mfu_causal * 64 * H100.peak_flops)
    for r in result.ranked:
        # ranked by the predicted step, or by the step at the published ceiling's MFU when that is slower
        assert r.rank_time_s == pytest.approx(max(r.prediction.step_time_s, floor))
    assert best.step_time_s < floor  # this case is above the ceiling: the capped ranking is exercised
    for r in result.ranked[1:]:
        p = r.prediction
        if r.rank_time_s < result.ranked[0].rank_time_s * (1 + NEAR_TIE):
            assert "within 1% of #1" in r.reason
            if "#1 is simpler" in r.reason:
                assert complexity(best.split, best.training) < complexity(p.split, p.training)
        else:
            assert "slower than #1" in r.reason
        # every time difference named is real: at least 0.5% of #1's step, never "+0 s"
        for delta in re.findall(r"([+-][0-9.e+-]+) s ", r.reason):
            assert abs(float(delta)) >= 0.005 * best.step_time_s
        assert "+0 s" not in r.reason
    # #1 is chosen against the fastest split found: it is within 1% of it
    first = result.ranked[0].reason
    if not first.startswith("fastest"):
        gap = float(re.match(r"([0-9.]+)% slower than the fastest split found", first).group(1))
        assert gap <= 100 * NEAR_TIE


def test_published_mfu_ceiling_flags_optimistic_plans():
    model = MODELS["llama3-8b"]()
    train = Training(seq_len=8192, global_batch=64, micro_batch=1)
    split = Split(tp=1, pp=1, dp=8, zero=1)
    high = predict(model, H100, split, train, MODERN)
    ceiling = ceiling_for("h100-sxm", model)
    assert ceiling.size_class == "<20B"
    # GPT-16B at 4096 tokens: 49% counting the full s², causal = 49% · (1 + s/12h + V/12lh) / (1 + s/6h + V/12lh)
    s, h, v, layers = 4096, 6144, 131072, 32
    assert ceiling.mfu_causal == pytest.approx(
        0.49 * (1 + s / (12 * h) + v / (12 * layers * h)) / (1 + s / (6 * h) + v / (12 * layers * h)), rel=2e-3
    )
    assert high.mfu > ceiling.mfu_causal
    warning = ceiling_warning(high)
    assert warning.startswith(f"MFU {100 * high.mfu:.1f}% is above the best published H100 run of its size (<20B")
    # it names the assumption whose removal costs most, with the MFU without it
    without = {name: predict(model, H100, split, train, e).mfu for name, e in assumptions(MODERN).items()}
    name = min(without, key=without.__getitem__)
    assert f"rests most on {name} (without it {100 * without[name]:.1f}%)" in warning
    # no published run of the class in the table: no claim either way
    assert ceiling_warning(predict(model, resolve_device("mi300x"), split, train, MODERN)) == ""
    slow = predict(model, resolve_device("h100-sxm", gemm_efficiency=0.3), split, train, MODERN)
    assert slow.mfu < 0.47
    assert ceiling_warning(slow) == ""
    # the ceilings are bf16 runs: an fp8 plan is not compared with them
    fp8 = predict(model, H100, split, dataclasses.replace(train, dtype="fp8"), MODERN)
    assert fp8.mfu > 0.47
    assert ceiling_warning(fp8) == ""
