"""Accelerators and links: the `--gpu` presets, each built from its vendor's datasheet.

A preset is a `Datasheet` (the vendor's dense peaks, memory, bandwidths and power limit, with the page and
table they are printed in) plus what no datasheet says: the memory the driver reports, the sustained
large-GEMM rate (a cited measurement, or a cited bound where none is published) and the links of the node
the part sits in. docs/model.md's device table lists the same numbers; tests/model/test_devices.py reads
that table back against `PRESETS`.

Notes
-----
What a variant changes, and where the model reads it: the dense bf16 and fp8 peaks (`peak_flops`,
`fp8_peak_flops`: every GEMM and attention rate is a share of them), HBM capacity (`memory_bytes`: what fits)
and bandwidth (`hbm_bandwidth`: the memory-bound kernels and the optimizer), the in-node link
(`intra_link`: TP, CP and in-node DP/EP collectives), and a power limit below the part's rating, which lowers
the clock the tensor cores sustain: `gemm_efficiency` is the generation's measured large-GEMM share
(model/rates.py) times `Preset.rate_scale`, so it scales GEMMs and attention alike.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from functools import partial

from tracediag.api_types import checked
from tracediag.errors import SpecError
from tracediag.model.rates import GEMM_EFFICIENCY_BF16

GB = 1e9
GIB = 2**30
MIB = 2**20
TFLOPS = 1e12

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


def _nvlink(name: str, total_gbps: float) -> LinkSpec:
    # Datasheets print NVLink per GPU as the sum of both directions; one direction is half.
    return LinkSpec(name=name, bandwidth_gbps=total_gbps / 2, efficiency=0.75, latency_us=2.0)


# In-node link efficiencies: NCCL all-reduce bus bandwidth on DGX A100 reaches ~230 of 300 GB/s (nccl-tests
# results quoted in NVIDIA's DGX A100 user guide); we use 0.75 for every NVLink generation. On the H800,
# DeepSeek measured 160 GB/s over NVLink (DeepSeek-V3 technical report, arXiv:2412.19437, §3.2.2), 0.8 of its
# 200 GB/s per direction. Network efficiencies: nccl-tests over IB/RoCE usually reach 85-95% of line rate
# (perf-model.md §4.2).
LINKS = {
    # NVLink per GPU, both directions: A100 600 GB/s, H100/H200 900 GB/s, H800 400 GB/s, H100 NVL's bridge
    # 600 GB/s, B200 1.8 TB/s (the datasheets of `PRESETS`).
    "nvlink3": partial(_nvlink, "nvlink3", 600.0),
    "nvlink4": partial(_nvlink, "nvlink4", 900.0),
    "nvlink5": partial(_nvlink, "nvlink5", 1800.0),
    "nvlink4-h800": partial(_nvlink, "nvlink4-h800", 400.0),
    "nvlink4-bridge": partial(_nvlink, "nvlink4-bridge", 600.0),
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
        if self.gpus_per_node < 1:
            msg = f"gpus_per_node must be >= 1, got {self.gpus_per_node}"
            raise SpecError(msg)
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


@dataclass(frozen=True, kw_only=True, slots=True)
class Datasheet:
    """What the vendor prints for one part: dense figures (sparsity halved away), with where it prints them."""

    part: str
    bf16_tflops: float
    """Dense bf16/fp16 tensor-core TFLOP/s."""
    fp8_tflops: float
    """Dense fp8 TFLOP/s; 0 without fp8 tensor cores."""
    memory_gb: float
    """Capacity as labelled ("80GB"); HBM stacks are binary, so the label counts GiB."""
    memory_type: str
    hbm_tbps: float
    """Peak HBM bandwidth, TB/s."""
    power_w: float
    """Board power limit the preset runs at (TDP / TBP, or the configured cap), W."""
    link_gbps: float
    """GPU-to-GPU bandwidth in the node as printed: per GPU, both directions, GB/s."""
    source: str
    """Page and table the numbers are read from."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Preset:
    """A datasheet and what it does not say: driver-visible memory, sustained GEMM rate, the node's links."""

    sheet: Datasheet
    arch: str
    device_class: str
    """Class of published MFU ceilings (model/ceilings.py): parts with the same tensor cores share one."""
    memory_bytes: float
    """What the driver reports (nvidia-smi / rocm-smi memory.total), else the label read as GiB."""
    memory_source: str
    intra_link: str
    inter_link: str
    gpus_per_node: int = 8
    rate_scale: float = 1.0
    """Sustained large-GEMM rate relative to the generation's measured share of peak (model/rates.py)."""
    rate_source: str = "the generation's measured large-GEMM share (model/rates.py)"

    def spec(self, name: str) -> DeviceSpec:
        """The preset as the model's `DeviceSpec`."""
        s = self.sheet
        return DeviceSpec(
            name=name,
            peak_flops=s.bf16_tflops * TFLOPS,
            fp8_peak_flops=s.fp8_tflops * TFLOPS,
            memory_bytes=self.memory_bytes,
            hbm_bandwidth=s.hbm_tbps * 1000 * GB,
            gemm_efficiency=GEMM_EFFICIENCY_BF16[self.arch] * self.rate_scale,
            arch=self.arch,
            gpus_per_node=self.gpus_per_node,
            intra_link=LINKS[self.intra_link](),
            inter_link=LINKS[self.inter_link](),
        )


# ---- datasheets --------------------------------------------------------------------------------------------

_A100 = "NVIDIA A100 datasheet (nvidia.com/en-us/data-center/a100/, Specifications table)"
_H100 = "NVIDIA H100 datasheet (nvidia.com/en-us/data-center/h100/, Technical Specifications table)"
_H100_PCIE = "NVIDIA H100 PCIe product brief PB-11133-001_v02 (Nov 2022)"
_TITAN = (
    "torchtitan benchmarks/llama3_h100_202412_torchtitan.md (commit 820504e2, Hardware: Grand Teton, "
    "96GB HBM2e at 2.4 TB/s, default 500 W power limit, 400 Gb/s RDMA per GPU)"
)

A100_SXM_40 = Datasheet(
    part="NVIDIA A100 SXM4 40GB",
    bf16_tflops=312,
    fp8_tflops=0,
    memory_gb=40,
    memory_type="HBM2",
    hbm_tbps=1.555,
    power_w=400,
    link_gbps=600,
    source=_A100 + "; DGX A100: 8 x ConnectX-6 HDR 200 Gb/s",
)
A100_SXM_80 = dataclasses.replace(
    A100_SXM_40, part="NVIDIA A100 SXM4 80GB", memory_gb=80, memory_type="HBM2e", hbm_tbps=2.039
)
A100_PCIE_40 = dataclasses.replace(
    A100_SXM_40,
    part="NVIDIA A100 PCIe 40GB",
    power_w=250,
    link_gbps=64,
    source=_A100 + " (PCIe Gen4 64 GB/s; its NVLink bridge joins only pairs)",
)
A100_PCIE_80 = dataclasses.replace(
    A100_PCIE_40, part="NVIDIA A100 PCIe 80GB", memory_gb=80, memory_type="HBM2e", hbm_tbps=1.935, power_w=300
)
H100_SXM = Datasheet(
    part="NVIDIA H100 SXM5 80GB",
    bf16_tflops=989.4,
    fp8_tflops=1978.9,
    memory_gb=80,
    memory_type="HBM3",
    hbm_tbps=3.35,
    power_w=700,
    link_gbps=900,
    source=_H100 + ", H100 SXM column (BF16 1,979 and FP8 3,958 with sparsity); DGX H100: 8 x ConnectX-7 NDR",
)
H100_SXM_500W = dataclasses.replace(
    H100_SXM,
    part="NVIDIA H100 SXM5 80GB at a 500 W power limit",
    power_w=500,
    source=_H100 + ", H100 SXM column, with the configurable limit set to 500 W (nvidia-smi -pl 500)",
)
H100_HBM2E_500W = dataclasses.replace(
    H100_SXM,
    part="NVIDIA H100 SXM 96GB HBM2e at 500 W (Meta Grand Teton)",
    memory_gb=96,
    memory_type="HBM2e",
    hbm_tbps=2.4,
    power_w=500,
    source=_TITAN + "; peaks: torchtitan counts MFU against the SXM's 989 TFLOP/s (footnote 2)",
)
H100_PCIE = Datasheet(
    part="NVIDIA H100 PCIe 80GB",
    bf16_tflops=756.5,
    fp8_tflops=1513,
    memory_gb=80,
    memory_type="HBM2e",
    hbm_tbps=2.0,
    power_w=350,
    link_gbps=128,
    source=(
        "NVIDIA H100 datasheet, 2022 edition, H100 PCIe column (BF16 1,513, FP8 3,026 with sparsity; 80GB, 2 TB/s; "
        "PCIe Gen5 128 GB/s); " + _H100_PCIE + ": 350 W TDP, HBM2e"
    ),
)
H100_NVL = Datasheet(
    part="NVIDIA H100 NVL 94GB",
    bf16_tflops=835.5,
    fp8_tflops=1670.5,
    memory_gb=94,
    memory_type="HBM3",
    hbm_tbps=3.9,
    power_w=400,
    link_gbps=600,
    source=_H100 + ", H100 NVL column (BF16 1,671, FP8 3,341 with sparsity; 350-400 W; NVLink bridge 600 GB/s)",
)
H800 = dataclasses.replace(
    H100_SXM,
    part="NVIDIA H800 SXM5 80GB",
    link_gbps=400,
    source=(
        "DeepSeek, Insights into DeepSeek-V3 (ISCA'25, arXiv:2505.09343) §2: the H800 SXM is the H100's Hopper "
        "but for FP64 and NVLink, cut from 900 to 400 GB/s, with eight 400G IB CX7 NICs per node; "
        "nvidia-smi: 700 W"
    ),
)
H200 = Datasheet(
    part="NVIDIA H200 SXM 141GB",
    bf16_tflops=989.4,
    fp8_tflops=1978.9,
    memory_gb=141,
    memory_type="HBM3e",
    hbm_tbps=4.8,
    power_w=700,
    link_gbps=900,
    source="NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200/, Technical Specifications, H200 SXM column)",
)
B200 = Datasheet(
    part="NVIDIA B200 (HGX/DGX B200)",
    bf16_tflops=2250,
    fp8_tflops=4500,
    memory_gb=180,
    memory_type="HBM3e",
    hbm_tbps=8.0,
    power_w=1000,
    link_gbps=1800,
    source=(
        "NVIDIA DGX B200 datasheet (1,440 GB and 64 TB/s over 8 GPUs, NVLink5 1.8 TB/s per GPU, 8 x ConnectX-7 "
        "400 Gb/s) and HGX B200 specifications (FP16/BF16 36 PFLOPS and FP8 72 PFLOPS per 8 GPUs with "
        "sparsity; up to 1,000 W per GPU)"
    ),
)
GB200 = Datasheet(
    part="NVIDIA GB200 (Blackwell GPU of the GB200 NVL72)",
    bf16_tflops=2500,
    fp8_tflops=5000,
    memory_gb=186,
    memory_type="HBM3e",
    hbm_tbps=8.0,
    power_w=1200,
    link_gbps=1800,
    source=(
        "NVIDIA GB200 NVL72 specifications (nvidia.com/en-us/data-center/gb200-nvl72/: 72 GPUs, FP16/BF16 360 and "
        "FP8 720 PFLOPS with sparsity, 13.4 TB HBM3e at 576 TB/s, NVLink 130 TB/s in one 72-GPU domain) and the "
        "NVIDIA Blackwell architecture technical brief (GB200's GPU at 1,200 W: BF16 2,500, FP8 5,000 TFLOP/s dense; "
        "HGX B200 at 1,000 W: 2,250 / 4,500); DGX GB200: one ConnectX-7 400 Gb/s per GPU"
    ),
)
MI300X = Datasheet(
    part="AMD Instinct MI300X",
    bf16_tflops=1307.4,
    fp8_tflops=2614.9,
    memory_gb=192,
    memory_type="HBM3",
    hbm_tbps=5.3,
    power_w=750,
    link_gbps=896,
    source=(
        "AMD Instinct MI300X datasheet (amd.com/en/products/accelerators/instinct/mi300/mi300x.html, "
        "Specifications: BF16 1,307.4, FP8 2,614.9 dense; 750 W TBP; Infinity Fabric 7 x 128 GB/s)"
    ),
)
MI325X = dataclasses.replace(
    MI300X,
    part="AMD Instinct MI325X",
    memory_gb=256,
    memory_type="HBM3E",
    hbm_tbps=6.0,
    power_w=1000,
    source=(
        "AMD Instinct MI325X datasheet (amd.com/en/products/accelerators/instinct/mi300/mi325x.html, "
        "Specifications: MI300X's compute, 256 GB HBM3E at 6 TB/s, 1,000 W TBP)"
    ),
)

# ---- what the datasheets do not say ------------------------------------------------------------------------

_SMI = "nvidia-smi memory.total"
_MAMF = (
    "Bekman, ml-engineering compute/accelerator/README.md (commit 744d01e1), Maximum Achievable Matmul FLOPS "
    "table, BF16"
)
_POWER_BOUND = 835.5 / 989.4
"""No measurement of a Hopper's bf16 matmul rate at a 500 W limit is published (torchtitan's authors: its peak
is "between SXM and NVL, and we don't know its exact value"). A higher power limit never lowers the clock, so
NVIDIA's rating of the same 132-SM die at 400 W (H100 NVL, 835.5 TFLOP/s) bounds it from below and the SXM's
700 W rating from above. The presets take the bound, not a guess inside the range: their GEMMs run at
835.5/989.4 of the SXM's sustained rate, while MFU stays counted against 989.4 TFLOP/s, as torchtitan counts
it. Predictions are so the slow end; the uncapped SXM is the fast end (`--gpu h100-sxm`), and a calibration
profile or `--peak-tflops` replaces both."""
_POWER_SOURCE = (
    "lower bound: NVIDIA's 400 W rating of the 132-SM die (H100 NVL 835.5 of the SXM's 989.4 TFLOP/s); no "
    "measurement at 500 W is published"
)

PRESETS: dict[str, Preset] = {
    "a100-40gb": Preset(
        sheet=A100_SXM_40,
        arch="ampere",
        device_class="A100",
        memory_bytes=40 * GIB,
        memory_source=_SMI + " 40960 MiB",
        intra_link="nvlink3",
        inter_link="ib-hdr",
    ),
    "a100-80gb": Preset(
        sheet=A100_SXM_80,
        arch="ampere",
        device_class="A100",
        memory_bytes=80 * GIB,
        memory_source=_SMI + " 81920 MiB",
        intra_link="nvlink3",
        inter_link="ib-hdr",
    ),
    # The PCIe cards carry the SXM's rated peak at 250-300 W; measured, they sustain less: 252.9 against the
    # SXM's 271.2 TFLOP/s in the same large-matmul search.
    "a100-pcie-40gb": Preset(
        sheet=A100_PCIE_40,
        arch="ampere",
        device_class="A100",
        memory_bytes=40 * GIB,
        memory_source=_SMI + " 40960 MiB",
        intra_link="pcie4",
        inter_link="ib-hdr",
        rate_scale=252.9 / 271.2,
        rate_source=_MAMF + ": A100 PCIe 252.9 / A100 SXM 271.2 TFLOP/s",
    ),
    "a100-pcie-80gb": Preset(
        sheet=A100_PCIE_80,
        arch="ampere",
        device_class="A100",
        memory_bytes=80 * GIB,
        memory_source=_SMI + " 81920 MiB",
        intra_link="pcie4",
        inter_link="ib-hdr",
        rate_scale=252.9 / 271.2,
        rate_source=_MAMF + ": A100 PCIe 252.9 / A100 SXM 271.2 TFLOP/s",
    ),
    "h100-sxm": Preset(
        sheet=H100_SXM,
        arch="hopper",
        device_class="H100",
        memory_bytes=81559 * MIB,
        memory_source=_SMI + " 81559 MiB",
        intra_link="nvlink4",
        inter_link="ib-ndr",
    ),
    "h100-sxm-500w": Preset(
        sheet=H100_SXM_500W,
        arch="hopper",
        device_class="H100",
        memory_bytes=81559 * MIB,
        memory_source=_SMI + " 81559 MiB",
        intra_link="nvlink4",
        inter_link="ib-ndr",
        rate_scale=_POWER_BOUND,
        rate_source=_POWER_SOURCE,
    ),
    # torchtitan's published Llama 3.1 8B/70B/405B runs: 8 GPUs per host on NVLink, RoCE backend network
    # (Meta's Grand Teton; Gangidi et al., "RDMA over Ethernet for Distributed AI Training at Meta Scale",
    # SIGCOMM'24). 94 GiB visible of the 96 GB: Ujeniya et al. 2026 (arXiv:2604.11391), §3 test bed.
    "h100-hbm2e-500w": Preset(
        sheet=H100_HBM2E_500W,
        arch="hopper",
        device_class="H100",
        memory_bytes=94 * GIB,
        memory_source="94 GiB (Ujeniya et al. 2026, arXiv:2604.11391, H100 HBM2e test bed)",
        intra_link="nvlink4",
        inter_link="roce-400g",
        rate_scale=_POWER_BOUND,
        rate_source=_POWER_SOURCE,
    ),
    # 114 SMs at 1,620 MHz: its rated peak already carries the lower clock; its share of it is taken as the
    # SXM's (no measurement of the PCIe part's sustained rate is published). Eight cards on PCIe switches;
    # the NVLink bridge joins only pairs, so the node's link is PCIe.
    "h100-pcie": Preset(
        sheet=H100_PCIE,
        arch="hopper",
        device_class="H100",
        memory_bytes=81559 * MIB,
        memory_source=_SMI + " 81559 MiB",
        intra_link="pcie5",
        inter_link="ib-ndr",
    ),
    # The NVLink domain is the bridged pair: a "node" of 2, reached beyond by one NIC per GPU.
    "h100-nvl": Preset(
        sheet=H100_NVL,
        arch="hopper",
        device_class="H100",
        memory_bytes=95830 * MIB,
        memory_source=_SMI + " 95830 MiB",
        intra_link="nvlink4-bridge",
        inter_link="ib-ndr",
        gpus_per_node=2,
    ),
    "h800": Preset(
        sheet=H800,
        arch="hopper",
        device_class="H100",
        memory_bytes=81559 * MIB,
        memory_source=_SMI + " 81559 MiB",
        intra_link="nvlink4-h800",
        inter_link="ib-ndr",
    ),
    "h200": Preset(
        sheet=H200,
        arch="hopper",
        device_class="H100",
        memory_bytes=143771 * MIB,
        memory_source=_SMI + " 143771 MiB",
        intra_link="nvlink4",
        inter_link="ib-ndr",
    ),
    "b200": Preset(
        sheet=B200,
        arch="blackwell",
        device_class="B200",
        memory_bytes=183359 * MIB,
        memory_source=_SMI + " 183359 MiB",
        intra_link="nvlink5",
        inter_link="ib-ndr",
    ),
    # One GB200 NVL72 rack is one NVLink domain of 72 GPUs (the node the model's in-node link spans); beyond it one
    # 400 Gb/s NIC per GPU. Its sustained matmul share is B200's times the two parts' measured shares of their peaks.
    "gb200": Preset(
        sheet=GB200,
        arch="blackwell",
        device_class="B200",
        memory_bytes=186 * GIB,
        memory_source="the label read as GiB (no driver total at hand)",
        intra_link="nvlink5",
        inter_link="ib-ndr",
        gpus_per_node=72,
        rate_scale=(1822.0 / 2500) / (1745.0 / 2250),
        rate_source=_MAMF + ": GB200 1,822.0 of 2,500 / B200 1,745.0 of 2,250 TFLOP/s",
    ),
    "mi300x": Preset(
        sheet=MI300X,
        arch="cdna3",
        device_class="MI300",
        memory_bytes=205822885888,
        memory_source="rocm-smi VRAM Total Memory 205,822,885,888 B",
        intra_link="infinity-fabric",
        inter_link="roce-400g",
    ),
    # Same CDNA3 compute as the MI300X at 1,000 W instead of 750 W: it sustains 784.9 against the MI300X's
    # 668.4 TFLOP/s in the same search (ROCm 6.2.4 against 6.3; tuned GEMMs on both).
    "mi325x": Preset(
        sheet=MI325X,
        arch="cdna3",
        device_class="MI300",
        memory_bytes=256 * GIB,
        memory_source="the label read as GiB (no driver total at hand)",
        intra_link="infinity-fabric",
        inter_link="roce-400g",
        rate_scale=784.9 / 668.4,
        rate_source=_MAMF + ": MI325X 784.9 / MI300X 668.4 TFLOP/s",
    ),
}
"""The `--gpu` presets. MI250X is left out: model/rates.py has no measured CDNA2 GEMM or attention rate."""

DEVICES = {name: partial(preset.spec, name) for name, preset in PRESETS.items()}
"""Named devices with the links of their usual node (each a function returning a fresh `DeviceSpec`)."""


def unknown_device(name: str) -> str:
    """One line for a name that is no preset: the closest presets, then all of them."""
    low = name.strip().lower()
    near = [n for n in DEVICES if low and (n.startswith(low) or low.startswith(n))]
    near += [n for n in difflib.get_close_matches(low, DEVICES, n=3, cutoff=0.6) if n not in near]
    guess = f" (closest: {', '.join(near[:3])})" if near else ""
    return f"unknown GPU {name!r}{guess}; presets: {', '.join(DEVICES)}"


@checked
def resolve_device(name: str, **overrides: object) -> DeviceSpec:
    """A device preset with some fields replaced (None values are ignored)."""
    if name not in DEVICES:
        raise SpecError(unknown_device(name))
    return dataclasses.replace(DEVICES[name](), **{k: v for k, v in overrides.items() if v is not None})
