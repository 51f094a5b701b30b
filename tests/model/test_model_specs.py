"""Issue 4: model shapes, presets, HF config reading, parameter and FLOP counts, split rules."""

from __future__ import annotations

import json

import pytest

from tracediag.errors import SpecError
from tracediag.model.flops import flops_6n, model_flops, param_count
from tracediag.model.specs import (
    DEVICES,
    MODELS,
    ModelSpec,
    Split,
    Training,
    check_split,
    parse_link,
    read_hf_config,
    resolve_device,
    resolve_model,
    stage_layers,
)


def test_llama3_8b_parameter_count_from_shape():
    # meta-llama/Meta-Llama-3-8B has 8,030,261,248 parameters.
    assert param_count(MODELS["llama3-8b"]()) == 8_030_261_248


def test_llama2_70b_and_405b_parameter_counts():
    assert param_count(MODELS["llama2-70b"]()) == pytest.approx(68.98e9, rel=1e-3)
    assert param_count(MODELS["llama3.1-405b"]()) == pytest.approx(405.85e9, rel=1e-3)


def test_gpt3_175b_model_flops_match_korthikanti_closed_form():
    model = MODELS["gpt3-175b"]()
    b, s, n, h, v = 1536, 2048, model.layers, model.hidden, model.vocab
    closed = 72 * b * s * n * h * h * (1 + s / (6 * h) + v / (12 * n * h))
    assert model_flops(model, s, b) == pytest.approx(closed, rel=1e-3)
    # and 6·N·T is the same within the attention and embedding terms (a few %)
    assert model_flops(model, s, b) / (6 * param_count(model) * b * s) == pytest.approx(1.03, abs=0.02)


def test_flops_6n_is_palm_convention():
    model = MODELS["gpt3-1.3b"]()
    n = param_count(model)
    assert flops_6n(model, 2048, 4) == pytest.approx((6 * n + 12 * 24 * 2048 * 2048) * 2048 * 4)


def test_read_hf_config(tmp_path):
    cfg = {
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "hidden_act": "silu",
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    model = read_hf_config(path)
    assert (model.layers, model.hidden, model.groups, model.ffn, model.swiglu) == (32, 4096, 8, 14336, True)
    assert param_count(model) == 8_030_261_248
    assert resolve_model(str(path)) == model


def test_hf_config_missing_key_names_it(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(SpecError, match="num_hidden_layers"):
        read_hf_config(path)


QWEN3_30B_A3B = {
    # Qwen/Qwen3-30B-A3B config.json (Hugging Face): 32 query heads of 128 channels on a 2048-wide model
    "architectures": ["Qwen3MoeForCausalLM"],
    "decoder_sparse_step": 1,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "mlp_only_layers": [],
    "moe_intermediate_size": 768,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "tie_word_embeddings": False,
    "vocab_size": 151936,
}


def test_hf_config_head_dim_sets_the_attention_width(tmp_path):
    """Qwen3-30B-A3B's heads are 128 wide on a 2048-wide model (Q is 4096 channels, not 2048): its model card's
    30.5 B parameters with 3.3 B activated come out only with the config's head_dim."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN3_30B_A3B))
    model = read_hf_config(path)
    assert (model.head_dim, model.attention_head_dim, model.experts, model.top_k, model.ffn) == (128, 128, 128, 8, 768)
    assert param_count(model) == pytest.approx(30.5e9, rel=0.01)
    assert param_count(model, active=True) == pytest.approx(3.3e9, rel=0.03)
    # a head_dim that is hidden / heads changes nothing
    path.write_text(json.dumps({**QWEN3_30B_A3B, "head_dim": 64}))
    assert read_hf_config(path).attention_head_dim is None
    assert ModelSpec(layers=1, hidden=2048, heads=32, ffn=1, vocab=1, attention_head_dim=128).head_dim == 128
    with pytest.raises(SpecError, match="not divisible"):
        ModelSpec(layers=1, hidden=2050, heads=32, ffn=1, vocab=1)


@pytest.mark.parametrize(
    ("keys", "what"),
    [
        ({"kv_lora_rank": 512, "q_lora_rank": 1536, "n_routed_experts": 256}, "multi-head latent attention"),
        ({"shared_expert_intermediate_size": 5632}, "a shared expert"),
        ({"n_shared_experts": 1}, "shared experts"),
        ({"first_k_dense_replace": 3}, "dense layers before the MoE layers"),
        ({"mlp_only_layers": [0, 1]}, "dense layers among the MoE layers"),
        ({"decoder_sparse_step": 2}, "every n-th layer"),
    ],
)
def test_hf_config_refuses_shapes_it_cannot_describe(tmp_path, keys, what):
    """DeepSeek-V3's latent attention and shared expert, Qwen2-MoE's shared expert, dense layers among MoE ones:
    read as a uniform model they would give a confident wrong count, so they are refused with the key named."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**QWEN3_30B_A3B, **keys}))
    with pytest.raises(SpecError, match=what):
        read_hf_config(path)


def test_unknown_names_list_the_choices():
    with pytest.raises(SpecError, match="llama3-8b"):
        resolve_model("llama9")
    with pytest.raises(SpecError, match="h100-sxm"):
        resolve_device("tpu")
    with pytest.raises(SpecError, match="ib-ndr"):
        parse_link("carrier-pigeon")


def test_device_overrides_and_measured_link():
    dev = resolve_device("h100-sxm", gpus_per_node=4, inter_link=parse_link("37.5"))
    assert dev.gpus_per_node == 4
    assert dev.inter_link.busbw == pytest.approx(37.5e9)
    assert set(DEVICES) >= {"a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "b200", "mi300x"}


def test_model_rejects_heads_not_dividing_hidden():
    with pytest.raises(SpecError, match="hidden=100 not divisible by heads=3"):
        ModelSpec(layers=2, hidden=100, heads=3, ffn=400, vocab=10)


@pytest.mark.parametrize(
    ("split", "message"),
    [
        (Split(tp=16, pp=1, dp=2), "tp=16 exceeds gpus_per_node=8"),
        (Split(tp=3, pp=1, dp=4), "heads=32 not divisible by tp=3"),
        (Split(tp=2, pp=2, dp=2), "2·2·2·1 = 8 ≠ gpus=16"),
        (Split(tp=1, pp=1, dp=16, cp=1), "global_batch=24 not divisible by micro_batch·dp = 1·16"),
    ],
    ids=["tp-node", "heads", "product", "batch"],
)
def test_impossible_split_names_the_rule(split, message):
    model, dev = MODELS["llama3-8b"](), resolve_device("h100-sxm")
    with pytest.raises(SpecError, match="impossible split") as info:
        check_split(model, dev, split, Training(seq_len=4096, global_batch=24), gpus=16)
    assert message in str(info.value)


def test_stage_layers_even_and_llama_style_uneven():
    assert stage_layers(32, 4) == (8, 8, 8, 8)
    layers = stage_layers(126, 16)
    assert sum(layers) == 126
    assert layers[1:-1] == (8,) * 14
    assert layers[0] + layers[-1] == 14
