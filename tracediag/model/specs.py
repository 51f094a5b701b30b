"""What the analytic model takes in: model shape, device, links, split and training options.

Every class is a frozen, keyword-only dataclass whose `__post_init__` names the broken rule. Presets are
functions in plain dicts (`MODELS`, `DEVICES`, `LINKS`); derive variants with `dataclasses.replace`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tracediag.api_types import checked
from tracediag.errors import SpecError
from tracediag.model.rates import GEMM_EFFICIENCY_BF16

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

    def __post_init__(self) -> None:
        _positive(self, "layers", "hidden", "heads", "ffn", "vocab", "experts", "top_k")
        if self.hidden % self.heads:
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
        """Channels per head (d_h = h / a)."""
        return self.hidden // self.heads


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
    ffn = cfg.get("intermediate_size") or cfg.get("n_inner") or cfg.get("ffn_hidden_size") or 4 * found["hidden"]
    act = str(cfg.get("hidden_act", cfg.get("activation_function", "silu")))
    experts = int(cfg.get("num_local_experts") or cfg.get("num_experts") or 1)
    moe_ffn = cfg.get("moe_intermediate_size")
    return ModelSpec(
        name=cfg.get("_name_or_path") or path.parent.name or path.stem,
        kv_heads=int(cfg.get("num_key_value_heads") or found["heads"]),
        ffn=int(moe_ffn if (experts > 1 and moe_ffn) else ffn),
        swiglu=act in ("silu", "swiglu", "swish"),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        learned_positions=int(cfg.get("n_positions", 0)) if "n_positions" in cfg else 0,
        experts=experts,
        top_k=int(cfg.get("num_experts_per_tok") or 1),
        **found,
    )


@checked
def resolve_model(name_or_path: str) -> ModelSpec:
    """A preset name, or a path to a Hugging Face `config.json`."""
    if name_or_path in MODELS:
        return MODELS[name_or_path]()
    if name_or_path.endswith(".json") or Path(name_or_path).exists():
        return read_hf_config(name_or_path)
    msg = f"unknown model {name_or_path!r}\n\nHint: one of {', '.join(MODELS)}, or a path to a config.json"
    raise SpecError(msg)


# --------------------------------------------------------------------------------------------------- links


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkSpec:
    """One GPU's share of an interconnect, in one direction."""

    name: str
    bandwidth_gbps: float
    """GB/s per GPU per direction (vendor figure, or a measured nccl-tests bus bandwidth)."""
    efficiency: float = 0.8
    """Fraction of `bandwidth_gbps` that collectives reach as bus bandwidth (nccl-tests convention)."""
    latency_us: float = 8.0
    """Latency of one ring hop over this link, microseconds (NCCL's tuning model, src/graph/tuning.cc `hwLat`:
    ring hops of 1.9-3.4 µs over NVLink and 4-14 µs over the network for the LL128 and Simple protocols)."""

    def __post_init__(self) -> None:
        if self.bandwidth_gbps <= 0 or not 0 < self.efficiency <= 1 or self.latency_us < 0:
            msg = f"link {self.name}: bandwidth must be > 0, efficiency in (0, 1], latency >= 0"
            raise SpecError(msg)

    @property
    def busbw(self) -> float:
        """Achieved bus bandwidth, bytes/s."""
        return self.bandwidth_gbps * 1e9 * self.efficiency


# In-node link efficiencies: NCCL all-reduce bus bandwidth on DGX A100 reaches ~230 of 300 GB/s (nccl-tests
# results quoted in NVIDIA's DGX A100 user guide); we use 0.75 for every NVLink generation.
# Network efficiencies: nccl-tests over IB/RoCE usually reach 85-95% of line rate (perf-model.md §4.2).
LINKS = {
    # NVLink per-GPU bandwidth per direction: A100 600 GB/s, H100 900 GB/s, B200 1.8 TB/s total
    # (NVIDIA A100/H100/B200 datasheets), halved for one direction.
    "nvlink3": lambda: LinkSpec(name="nvlink3", bandwidth_gbps=300.0, efficiency=0.75, latency_us=2.0),
    "nvlink4": lambda: LinkSpec(name="nvlink4", bandwidth_gbps=450.0, efficiency=0.75, latency_us=2.0),
    "nvlink5": lambda: LinkSpec(name="nvlink5", bandwidth_gbps=900.0, efficiency=0.75, latency_us=2.0),
    # AMD Instinct MI300X datasheet: 896 GB/s aggregate Infinity Fabric (7 peers x 128 GB/s bidirectional).
    "infinity-fabric": lambda: LinkSpec(name="infinity-fabric", bandwidth_gbps=448.0, efficiency=0.7, latency_us=2.5),
    # PCIe x16: Gen4 32 GB/s, Gen5 64 GB/s per direction (PCI-SIG).
    "pcie4": lambda: LinkSpec(name="pcie4", bandwidth_gbps=32.0, efficiency=0.8, latency_us=3.0),
    "pcie5": lambda: LinkSpec(name="pcie5", bandwidth_gbps=64.0, efficiency=0.8, latency_us=3.0),
    # InfiniBand per port: HDR 200 Gb/s, NDR 400 Gb/s, XDR 800 Gb/s (NVIDIA ConnectX-6/7/8), one NIC per GPU.
    "ib-hdr": lambda: LinkSpec(name="ib-hdr", bandwidth_gbps=25.0, efficiency=0.9, latency_us=8.0),
    "ib-ndr": lambda: LinkSpec(name="ib-ndr", bandwidth_gbps=50.0, efficiency=0.9, latency_us=8.0),
    "ib-xdr": lambda: LinkSpec(name="ib-xdr", bandwidth_gbps=100.0, efficiency=0.9, latency_us=8.0),
    # RoCE line rates per GPU NIC; Ethernet fabrics reach a little less than IB.
    "roce-100g": lambda: LinkSpec(name="roce-100g", bandwidth_gbps=12.5, efficiency=0.85, latency_us=10.0),
    "roce-200g": lambda: LinkSpec(name="roce-200g", bandwidth_gbps=25.0, efficiency=0.85, latency_us=10.0),
    "roce-400g": lambda: LinkSpec(name="roce-400g", bandwidth_gbps=50.0, efficiency=0.85, latency_us=10.0),
}
"""Named links; `parse_link` also takes a number, read as a measured bus bandwidth in GB/s."""


def parse_link(text: str) -> LinkSpec:
    """A link preset name, or a measured bus bandwidth in GB/s (efficiency 1)."""
    if text in LINKS:
        return LINKS[text]()
    try:
        gbps = float(text.removesuffix("GB/s").removesuffix("gbps"))
    except ValueError:
        msg = f"unknown link {text!r}\n\nHint: one of {', '.join(LINKS)}, or a measured GB/s such as 180"
        raise SpecError(msg) from None
    return LinkSpec(name=f"measured-{gbps:g}GBps", bandwidth_gbps=gbps, efficiency=1.0)


# --------------------------------------------------------------------------------------------------- device


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceSpec:
    """One accelerator and the node it usually sits in."""

    name: str
    peak_flops: float
    """Dense bf16/fp16 tensor-core FLOP/s (no sparsity)."""
    memory_bytes: float
    """HBM capacity, bytes."""
    hbm_bandwidth: float
    """HBM bandwidth, bytes/s."""
    gemm_efficiency: float = 0.8
    """Fraction of `peak_flops` that large bf16 GEMMs reach (cuBLAS/hipBLASLt); scales every compute rate, so a
    calibration profile scales this one number (model/rates.py)."""
    arch: str = "hopper"
    """Generation whose measured kernel rates apply: ampere, hopper, blackwell, cdna3 (model/rates.py)."""
    fp8_peak_flops: float = 0.0
    """Dense fp8 tensor-core FLOP/s; 0 when the device has no fp8."""
    network_oversubscription: float = 1.0
    """Ratio of injected to bisection bandwidth of the network (1 = rail-optimised, non-blocking fat tree)."""
    speed_variation: float = 0.015
    """Standard deviation of compute speed across devices of one model (clocks, thermals, silicon): Sinha et al.
    SC'22 "Not All GPUs Are Created Equal" measured 6-8% spread over clusters of hundreds of GPUs, σ ≈ 1.5%.
    Every synchronous step waits for the slowest of N devices, about σ·√(2 ln N) slower than the mean."""
    gpus_per_node: int = 8
    intra_link: LinkSpec
    """Link between GPUs of one node."""
    inter_link: LinkSpec
    """Network link of one GPU to other nodes (one NIC per GPU)."""

    def __post_init__(self) -> None:
        _positive(self, "gpus_per_node")
        if min(self.peak_flops, self.memory_bytes, self.hbm_bandwidth) <= 0:
            msg = f"device {self.name}: peak_flops, memory_bytes and hbm_bandwidth must be > 0"
            raise SpecError(msg)
        if not 0 < self.gemm_efficiency <= 1:
            msg = f"device {self.name}: gemm_efficiency must be in (0, 1], got {self.gemm_efficiency}"
            raise SpecError(msg)
        if not 0 <= self.speed_variation < 0.5:
            msg = f"device {self.name}: speed_variation must be in [0, 0.5), got {self.speed_variation}"
            raise SpecError(msg)
        if not self.network_oversubscription >= 1:
            msg = f"device {self.name}: network_oversubscription must be >= 1, got {self.network_oversubscription}"
            raise SpecError(msg)


GB = 1e9
GIB = 2**30
TFLOPS = 1e12

# gemm_efficiency: measured large-GEMM share of dense peak per generation (model/rates.py cites each one);
# fp8 peaks from the same datasheets (dense, no sparsity).
DEVICES = {
    # NVIDIA A100 datasheet: 312 TFLOP/s bf16 dense; 40 GB HBM2 1,555 GB/s; 80 GB HBM2e 2,039 GB/s;
    # NVLink3 600 GB/s; DGX A100 has 8 GPUs and 8 HDR 200 Gb/s NICs.
    "a100-40gb": lambda: DeviceSpec(
        name="a100-40gb",
        peak_flops=312 * TFLOPS,
        memory_bytes=40 * GIB,
        hbm_bandwidth=1555 * GB,
        gemm_efficiency=GEMM_EFFICIENCY_BF16["ampere"],
        arch="ampere",
        fp8_peak_flops=0 * TFLOPS,
        intra_link=LINKS["nvlink3"](),
        inter_link=LINKS["ib-hdr"](),
    ),
    "a100-80gb": lambda: DeviceSpec(
        name="a100-80gb",
        peak_flops=312 * TFLOPS,
        memory_bytes=80 * GIB,
        hbm_bandwidth=2039 * GB,
        gemm_efficiency=GEMM_EFFICIENCY_BF16["ampere"],
        arch="ampere",
        fp8_peak_flops=0 * TFLOPS,
        intra_link=LINKS["nvlink3"](),
        inter_link=LINKS["ib-hdr"](),
    ),
    # NVIDIA H100 datasheet: SXM 989.4 TFLOP/s bf16 dense, 80 GB HBM3 3.35 TB/s, NVLink4 900 GB/s; PCIe
    # 756 TFLOP/s, 80 GB HBM2e 2.0 TB/s, PCIe Gen5. DGX H100: 8 ConnectX-7 NDR 400 Gb/s.
    "h100-sxm": lambda: DeviceSpec(
        name="h100-sxm",
        peak_flops=989.4 * TFLOPS,
        memory_bytes=80 * GIB,
        hbm_bandwidth=3350 * GB,
        gemm_efficiency=GEMM_EFFICIENCY_BF16["hopper"],
        arch="hopper",
        fp8_peak_flops=1978.9 * TFLOPS,
        intra_link=LINKS["nvlink4"](),
        inter_link=LINKS["ib-ndr"](),
    ),
    "h100-pcie": lambda: DeviceSpec(
        name="h100-pcie",
        peak_flops=756 * TFLOPS,
        memory_bytes=80 * GIB,
        hbm_bandwidth=2000 * GB,
        gemm_efficiency=GEMM_EFFICIENCY_BF16["hopper"],
        arch="hopper",
        fp8_peak_flops=1513 * TFLOPS,
        intra_link=LINKS["pcie5"](),
        inter_link=LINKS["ib-ndr"](),
    ),
    # NVIDIA H200 datasheet: same compute as H100 SXM, 141 GB HBM3e at 4.8 TB/s.
    "h200": lambda: DeviceSpec(
        name="h200",
        peak_flops=989.4 * TFLOPS,
        memory_bytes=141 * GB,
        hbm_bandwidth=4800 * GB,
        gemm_efficiency=GEMM_EFFICIENCY_BF16["hopper"],
        arch="hopper",
        fp8_peak_flops=1978.9 * TFLOPS,
        intra_link=LINKS["nvlink4"](),
        inter_link=LINKS["ib-ndr"](),
    ),
    # NVIDIA DGX B200 datasheet: 8 GPUs, 1,440 GB HBM3e and 64 TB/s in total (180 GB, 8 TB/s each),
    # NVLink5 1.8 TB/s per GPU, 8 ConnectX-7 400 Gb/s; HGX B200 bf16 dense 2.25 PFLOP/s per GPU.
    "b200": lambda: DeviceSpec(
        name="b200",
        peak_flops=2250 * TFLOPS,
        memory_bytes=180 * GB,
        hbm_bandwidth=8000 * GB,
        gemm_efficiency=GEMM_EFFICIENCY_BF16["blackwell"],
        arch="blackwell",
        fp8_peak_flops=4500 * TFLOPS,
        intra_link=LINKS["nvlink5"](),
        inter_link=LINKS["ib-ndr"](),
    ),
    # AMD Instinct MI300X datasheet: 1,307.4 TFLOP/s bf16 dense, 192 GB HBM3 at 5.3 TB/s, Infinity
    # Fabric 896 GB/s aggregate; typical 8-GPU platform with 400 Gb/s NICs.
    "mi300x": lambda: DeviceSpec(
        name="mi300x",
        peak_flops=1307.4 * TFLOPS,
        memory_bytes=192 * GB,
        hbm_bandwidth=5300 * GB,
        gemm_efficiency=GEMM_EFFICIENCY_BF16["cdna3"],
        arch="cdna3",
        fp8_peak_flops=2614.9 * TFLOPS,
        intra_link=LINKS["infinity-fabric"](),
        inter_link=LINKS["roce-400g"](),
    ),
}
"""Named devices with the links of their usual node."""


@checked
def resolve_device(name: str, **overrides: object) -> DeviceSpec:
    """A device preset with some fields replaced (None values are ignored)."""
    if name not in DEVICES:
        msg = f"unknown GPU {name!r}\n\nHint: one of {', '.join(DEVICES)}"
        raise SpecError(msg)
    return dataclasses.replace(DEVICES[name](), **{k: v for k, v in overrides.items() if v is not None})


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
    """Expert-parallel degree (MoE only), carved out of dp·cp."""
    vpp: int = 1
    """Virtual pipeline stages per device (interleaved 1F1B); 1 = plain 1F1B."""
    zero: int = 1
    """ZeRO stage 0-3 (3 = FSDP full shard). 1 is Megatron's distributed optimizer."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism: norms and dropout sharded over tp (all-reduce → RS + AG)."""

    def __post_init__(self) -> None:
        _positive(self, "tp", "pp", "dp", "cp", "ep", "vpp")
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
    if split.ep > 1 and (model.experts % split.ep or (split.dp * split.cp) % split.ep):
        problems.append(f"ep={split.ep} must divide experts={model.experts} and dp·cp={split.dp * split.cp}")
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
