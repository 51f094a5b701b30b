"""What the analytic model takes in: model shape, device, links, split and training options.

Every class is a frozen, keyword-only dataclass whose `__post_init__` names the broken rule. Presets are
functions in plain dicts (`MODELS` here; `DEVICES` and `LINKS` in model/devices.py, re-exported); derive
variants with `dataclasses.replace`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tracediag.api_types import checked
from tracediag.errors import SpecError

# The device and link table lives in model/devices.py; its names are re-exported here, where the model's
# other inputs are (predict, plan, calibrate and the CLI import them from specs).
from tracediag.model.devices import DEVICES as DEVICES
from tracediag.model.devices import GB as GB
from tracediag.model.devices import GIB as GIB
from tracediag.model.devices import LINKS as LINKS
from tracediag.model.devices import TFLOPS as TFLOPS
from tracediag.model.devices import DeviceSpec as DeviceSpec  # noqa: TC001  (re-exported for runtime use)
from tracediag.model.devices import LinkSpec as LinkSpec
from tracediag.model.devices import parse_link as parse_link
from tracediag.model.devices import resolve_device as resolve_device

Recompute = Literal["none", "selective", "op", "full"]
RECOMPUTE_MODES: tuple[str, ...] = ("none", "selective", "op", "full")
"""none; selective = Megatron's (attention core only); op = torchtitan's per-op selective checkpointing (saves
matmul outputs but every second, recomputes the memory-bound ops); full = whole layers."""
DTYPES: tuple[str, ...] = ("bf16", "fp8")


def _positive(obj: object, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if value < 1:
            msg = f"{name} must be >= 1, got {value}"
            raise SpecError(msg)


# --------------------------------------------------------------------------------------------------- model


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    """The shape of a decoder-only transformer."""

    name: str = "custom"
    """Preset name or where the shape came from."""
    layers: int
    """Transformer blocks (L)."""
    hidden: int
    """Model width (h)."""
    heads: int
    """Query heads (a)."""
    kv_heads: int | None = None
    """Key/value heads (g) for grouped-query attention; None = heads (multi-head attention)."""
    ffn: int
    """MLP inner size (f); for SwiGLU the size of each of the gate and up projections."""
    swiglu: bool = False
    """Gated MLP (three matrices h×f) instead of GeLU (two)."""
    vocab: int
    """Vocabulary size (V)."""
    tied_embeddings: bool = False
    """The output layer reuses the input embedding matrix."""
    learned_positions: int = 0
    """Rows of a learned position-embedding table (GPT-3: 2048); 0 for rotary or ALiBi."""
    bias: bool = False
    """Linear layers and norms carry biases (GPT-2/3 style)."""
    dropout: bool = False
    """Dropout after attention and MLP (and on attention scores); its masks take activation memory."""
    experts: int = 1
    """MoE experts per MLP layer; 1 = dense."""
    top_k: int = 1
    """Experts each token is routed to (MoE only)."""
    attention_head_dim: int | None = None
    """Channels per attention head where they are not hidden / heads (Qwen3, Gemma, Mistral Nemo: the Hugging
    Face config's `head_dim`, Megatron's `--kv-channels`); None = hidden / heads."""

    def __post_init__(self) -> None:
        _positive(self, "layers", "hidden", "heads", "ffn", "vocab", "experts", "top_k")
        if self.attention_head_dim is not None:
            _positive(self, "attention_head_dim")
        elif self.hidden % self.heads:
            msg = f"hidden={self.hidden} not divisible by heads={self.heads}"
            raise SpecError(msg)
        if self.kv_heads is not None and (self.kv_heads < 1 or self.heads % self.kv_heads):
            msg = f"heads={self.heads} not divisible by kv_heads={self.kv_heads}"
            raise SpecError(msg)
        if self.top_k > self.experts:
            msg = f"top_k={self.top_k} exceeds experts={self.experts}"
            raise SpecError(msg)

    @property
    def groups(self) -> int:
        """Key/value heads (g), resolved."""
        return self.kv_heads or self.heads

    @property
    def head_dim(self) -> int:
        """Channels per head (d_h): `attention_head_dim`, else h / a."""
        return self.attention_head_dim or self.hidden // self.heads


def _gpt3(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    # Brown et al. 2020, Table 2.1 (n_layers, d_model, n_heads); f = 4h, vocab 50257, context 2048,
    # learned positions, tied embeddings, biases and dropout as in GPT-2.
    return ModelSpec(
        name=name,
        layers=layers,
        hidden=hidden,
        heads=heads,
        ffn=4 * hidden,
        vocab=50257,
        tied_embeddings=True,
        learned_positions=2048,
        bias=True,
        dropout=True,
    )


def _llama(name: str, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int) -> ModelSpec:
    # SwiGLU, RMSNorm, rotary positions, untied output layer, no biases, no dropout.
    return ModelSpec(
        name=name,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        ffn=ffn,
        swiglu=True,
        vocab=vocab,
    )


MODELS = {
    "tiny": lambda: ModelSpec(name="tiny", layers=4, hidden=256, heads=4, kv_heads=2, ffn=1024, vocab=1000),
    "gpt3-125m": lambda: _gpt3("gpt3-125m", 12, 768, 12),
    "gpt3-350m": lambda: _gpt3("gpt3-350m", 24, 1024, 16),
    "gpt3-760m": lambda: _gpt3("gpt3-760m", 24, 1536, 16),
    # Table 2.1 gives 1.3B 24 heads of 128 with d_model 2048, which do not match; 16 heads of 128 fit.
    "gpt3-1.3b": lambda: _gpt3("gpt3-1.3b", 24, 2048, 16),
    "gpt3-2.7b": lambda: _gpt3("gpt3-2.7b", 32, 2560, 32),
    "gpt3-6.7b": lambda: _gpt3("gpt3-6.7b", 32, 4096, 32),
    # Table 2.1 prints d_model 5140 for 13B, which 40 heads of 128 do not divide; 5120 = 40·128.
    "gpt3-13b": lambda: _gpt3("gpt3-13b", 40, 5120, 40),
    "gpt3-175b": lambda: _gpt3("gpt3-175b", 96, 12288, 96),
    # Llama 2: Touvron et al. 2023 Table 1 and the meta-llama/Llama-2-*-hf config.json files.
    "llama2-7b": lambda: _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000),
    "llama2-13b": lambda: _llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000),
    "llama2-70b": lambda: _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000),
    # Llama 3 / 3.1: Llama 3 paper (Dubey et al. 2024) Table 3 and meta-llama/Meta-Llama-3(.1)-* config.json.
    "llama3-8b": lambda: _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256),
    "llama3-70b": lambda: _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256),
    "llama3.1-8b": lambda: _llama("llama3.1-8b", 32, 4096, 32, 8, 14336, 128256),
    "llama3.1-70b": lambda: _llama("llama3.1-70b", 80, 8192, 64, 8, 28672, 128256),
    "llama3.1-405b": lambda: _llama("llama3.1-405b", 126, 16384, 128, 8, 53248, 128256),
}
"""Named model shapes. `tiny` is for tests."""


UNMODELLED_CONFIG = {
    "kv_lora_rank": "multi-head latent attention",
    "q_lora_rank": "multi-head latent attention",
    "n_shared_experts": "shared experts",
    "shared_expert_intermediate_size": "a shared expert",
    "first_k_dense_replace": "dense layers before the MoE layers",
    "mlp_only_layers": "dense layers among the MoE layers",
    "decoder_sparse_step": "MoE on every n-th layer only",
}
"""Hugging Face config keys of shapes `ModelSpec` cannot describe (DeepSeek-V2/V3, Qwen2-MoE and Qwen-MoE
variants): refused, not read as the dense or uniform-MoE model they are not."""


def read_hf_config(path: str | Path) -> ModelSpec:
    """Read a Hugging Face `config.json` (Llama, Mistral, Mixtral, Qwen2, GPT-2/NeoX style keys)."""
    path = Path(path)
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        msg = f"{path}: cannot read as JSON ({e})"
        raise SpecError(msg) from e
    keys = {
        "layers": ("num_hidden_layers", "n_layer"),
        "hidden": ("hidden_size", "n_embd", "d_model"),
        "heads": ("num_attention_heads", "n_head"),
        "vocab": ("vocab_size",),
    }
    found: dict[str, int] = {}
    for field_name, names in keys.items():
        value = next((cfg[n] for n in names if n in cfg), None)
        if value is None:
            msg = f"{path}: no {' or '.join(names)}\n\nHint: pass --layers/--hidden/--heads/--ffn/--vocab"
            raise SpecError(msg)
        found[field_name] = int(value)
    for key, what in UNMODELLED_CONFIG.items():
        value = cfg.get(key)
        if value not in (None, 1) if key == "decoder_sparse_step" else bool(value):
            msg = (
                f"{path}: {what} ({key} = {repr(value)[:40]}) is not modelled, so a prediction would be silently wrong"
                "\n\nHint: time an approximation with --layers/--hidden/--heads/--ffn/--vocab/--experts"
            )
            raise SpecError(msg)
    ffn = cfg.get("intermediate_size") or cfg.get("n_inner") or cfg.get("ffn_hidden_size") or 4 * found["hidden"]
    act = str(cfg.get("hidden_act", cfg.get("activation_function", "silu")))
    experts = int(cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts") or 1)
    moe_ffn = cfg.get("moe_intermediate_size")
    head_dim = int(cfg.get("head_dim") or 0)
    try:
        return ModelSpec(
            name=cfg.get("_name_or_path") or path.parent.name or path.stem,
            attention_head_dim=head_dim if head_dim and head_dim * found["heads"] != found["hidden"] else None,
            kv_heads=int(cfg.get("num_key_value_heads") or found["heads"]),
            ffn=int(moe_ffn if (experts > 1 and moe_ffn) else ffn),
            swiglu=act in ("silu", "swiglu", "swish"),
            tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            learned_positions=int(cfg.get("n_positions", 0)) if "n_positions" in cfg else 0,
            experts=experts,
            top_k=int(cfg.get("num_experts_per_tok") or 1),
            **found,
        )
    except SpecError as e:
        msg = f"{path}: {e}"
        raise SpecError(msg) from e


@checked
def resolve_model(name_or_path: str) -> ModelSpec:
    """A preset name, or a path to a Hugging Face `config.json`."""
    if name_or_path in MODELS:
        return MODELS[name_or_path]()
    if name_or_path.endswith(".json") or Path(name_or_path).exists():
        return read_hf_config(name_or_path)
    msg = f"unknown model {name_or_path!r}\n\nHint: one of {', '.join(MODELS)}, or a path to a config.json"
    raise SpecError(msg)


# --------------------------------------------------------------------------------------------------- split


@checked
@dataclass(frozen=True, kw_only=True, slots=True)
class Split:
    """How the work is divided over the devices."""

    tp: int = 1
    """Tensor-parallel degree; must divide heads and stay within a node."""
    pp: int = 1
    """Pipeline stages."""
    dp: int = 1
    """Data-parallel replicas (ZeRO/FSDP shards over these)."""
    cp: int = 1
    """Context-parallel degree (sequence split across devices for attention)."""
    ep: int = 1
    """Expert-parallel degree (MoE only), carved out of dp·cp, or of tp·dp·cp with `etp` below tp."""
    etp: int | None = None
    """Tensor-parallel degree of the expert layers (Megatron-Core `--expert-tensor-parallel-size`); None = tp.
    Below tp the expert-parallel group folds over tensor-parallel ranks (MoE parallel folding, Liu et al. 2025,
    arXiv:2504.14960; Megatron-Core since core_r0.10): ep·etp divides tp·dp·cp and each expert's shard is
    replicated over the rest."""
    vpp: int = 1
    """Virtual pipeline stages per device (interleaved 1F1B); 1 = plain 1F1B."""
    zero: int = 1
    """ZeRO stage 0-3 (3 = FSDP full shard). 1 is Megatron's distributed optimizer."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism: norms and dropout sharded over tp (all-reduce → RS + AG)."""

    def __post_init__(self) -> None:
        _positive(self, "tp", "pp", "dp", "cp", "ep", "vpp")
        if self.etp is not None and (self.etp < 1 or self.tp % self.etp):
            msg = f"etp={self.etp} must divide tp={self.tp}"
            raise SpecError(msg)
        if self.zero not in (0, 1, 2, 3):
            msg = f"zero must be 0, 1, 2 or 3, got {self.zero}"
            raise SpecError(msg)
        if self.vpp > 1 and self.pp == 1:
            msg = f"vpp={self.vpp} needs pp > 1"
            raise SpecError(msg)

    @property
    def gpus(self) -> int:
        """tp·pp·dp·cp."""
        return self.tp * self.pp * self.dp * self.cp

    @property
    def expert_tp(self) -> int:
        """Tensor-parallel degree of the expert layers (`etp`, else tp)."""
        return self.etp or self.tp

    @property
    def expert_dp(self) -> int:
        """Replicas of each expert shard: tp·dp·cp over ep·etp (dp·cp / ep without folding)."""
        return max(self.tp * self.dp * self.cp // (self.ep * self.expert_tp), 1)


@checked
@dataclass(frozen=True, kw_only=True, slots=True)
class Training:
    """What one step does."""

    seq_len: int
    """Tokens per sequence (s)."""
    global_batch: int
    """Sequences per step over all replicas (B)."""
    micro_batch: int = 1
    """Sequences per micro-batch per replica (b)."""
    recompute: Recompute = "none"
    """Activation recomputation: none, selective (attention core), op (per-op, torchtitan) or full (whole layer)."""
    grad_bytes: int = 4
    """Bytes per gradient element kept and reduced (4: fp32 main grads, Megatron's default; 2: bf16)."""
    dtype: str = "bf16"
    """Precision of the linear layers' GEMMs: bf16, or fp8 (Transformer Engine / torchao float8; attention and
    the other kernels stay bf16)."""

    def __post_init__(self) -> None:
        _positive(self, "seq_len", "global_batch", "micro_batch")
        if self.recompute not in RECOMPUTE_MODES:
            msg = f"recompute must be one of {', '.join(RECOMPUTE_MODES)}, got {self.recompute!r}"
            raise SpecError(msg)
        if self.grad_bytes not in (2, 4):
            msg = f"grad_bytes must be 2 or 4, got {self.grad_bytes}"
            raise SpecError(msg)
        if self.dtype not in DTYPES:
            msg = f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}"
            raise SpecError(msg)


def check_split(model: ModelSpec, device: DeviceSpec, split: Split, train: Training, gpus: int) -> None:
    """Raise `SpecError` naming the first rule the split breaks."""
    problems = []
    if split.gpus != gpus:
        problems.append(f"tp·pp·dp·cp = {split.tp}·{split.pp}·{split.dp}·{split.cp} = {split.gpus} ≠ gpus={gpus}")
    if model.heads % split.tp:
        problems.append(f"heads={model.heads} not divisible by tp={split.tp}")
    if model.groups % split.tp and split.tp % model.groups:
        problems.append(f"kv_heads={model.groups} and tp={split.tp}: neither divides the other")
    if split.tp > device.gpus_per_node:
        problems.append(f"tp={split.tp} exceeds gpus_per_node={device.gpus_per_node}")
    if split.pp * split.vpp > model.layers:
        problems.append(f"pp·vpp = {split.pp * split.vpp} exceeds layers={model.layers}")
    # Interleaving with layers per stage not divisible by vpp is allowed: engines take uneven
    # virtual chunks (Megatron's first/last-stage layer options; Llama 3 §3.3.2). `plan` still
    # proposes only even chunks, which every engine accepts.
    if train.global_batch % (train.micro_batch * split.dp):
        problems.append(
            f"global_batch={train.global_batch} not divisible by micro_batch·dp = {train.micro_batch}·{split.dp}"
        )
    if split.vpp > 1 and (train.global_batch // (train.micro_batch * split.dp)) % split.pp:
        problems.append("interleaving needs micro-batches per step divisible by pp")
    if split.cp > 1 and train.seq_len % (2 * split.cp):
        problems.append(f"seq_len={train.seq_len} not divisible by 2·cp = {2 * split.cp}")
    if split.sequence_parallel and split.tp == 1:
        problems.append("sequence parallelism needs tp > 1")
    if split.ep > 1 and split.etp is None and (model.experts % split.ep or (split.dp * split.cp) % split.ep):
        problems.append(
            f"ep={split.ep} must divide experts={model.experts} and dp·cp={split.dp * split.cp}"
            " (or set etp below tp to fold it over tensor-parallel ranks)"
        )
    folded = split.tp * split.dp * split.cp
    if split.etp is not None and (model.experts % split.ep or folded % (split.ep * split.etp)):
        problems.append(
            f"ep={split.ep} must divide experts={model.experts}, and ep·etp = {split.ep * split.etp} tp·dp·cp={folded}"
        )
    if split.etp is not None and split.etp < split.tp and not split.sequence_parallel:
        problems.append("folding experts over tensor-parallel ranks needs sequence parallelism (Megatron-Core's)")
    if train.dtype == "fp8" and device.fp8_peak_flops <= 0:
        problems.append(f"dtype fp8 needs a device with fp8 tensor cores; {device.name} has none")
    if problems:
        msg = "impossible split: " + "; ".join(problems)
        raise SpecError(msg)


def stage_layers(layers: int, pp: int) -> tuple[int, ...]:
    """Layers per pipeline stage, first to last.

    An even split when `pp` divides `layers`; otherwise the middle stages take ceil(L/p) each and the first
    and last stages share the rest, which also offsets their embedding and loss work (Llama 3 §3.3.2).
    """
    if layers % pp == 0 or pp == 1:
        return (layers // pp,) * pp
    per = -(-layers // pp)
    rest = layers - per * (pp - 2)
    if pp == 2 or rest < 2:
        return tuple(layers // pp + (1 if i < layers % pp else 0) for i in range(pp))
    first = rest // 2
    return (first, *([per] * (pp - 2)), rest - first)
