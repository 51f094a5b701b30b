"""The best MFU published runs reached, by device class and model size, in the causal FLOP count; and how far
the model was from the published MoE runs it was scored on (`moe_warning`).

Notes
-----
Each entry is one measured run with its shape, so its published MFU (full s² convention, as every source
here counts) converts to the causal count `Prediction.mfu` uses by the ratio of the two FLOP counts for that
run. A plan above the entry of its class and size promises what no published run reached; `plan` ranks such
a split by a conservative estimate and names the assumption that carries it (model/plan.py). The model is not
tuned to these numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from tracediag.model.devices import PRESETS
from tracediag.model.flops import model_flops, param_count
from tracediag.model.specs import ModelSpec

if TYPE_CHECKING:
    from tracediag.model.predict import Prediction


@dataclass(frozen=True, kw_only=True)
class Ceiling:
    """The highest MFU a published bf16 run of one device class and size class reached."""

    device_class: str
    size_class: str
    mfu: float
    """As published (full s² attention count)."""
    model: ModelSpec
    """The run's shape, to convert `mfu` to the causal count."""
    seq_len: int
    run: str
    source: str
    cite: str
    """Short citation for one-line output."""

    @cached_property
    def mfu_causal(self) -> float:
        """`mfu` in the causal count (`Prediction.mfu`'s)."""
        full = model_flops(self.model, self.seq_len, 1)
        return self.mfu * model_flops(self.model, self.seq_len, 1, causal=True) / full


SIZE_CLASSES = ((20e9, "<20B"), (100e9, "20-100B"), (float("inf"), ">=100B"))
"""Parameter-count classes a ceiling applies to (upper bound, name)."""


def size_class(params: float) -> str:
    """The size class of a model of `params` parameters."""
    return next(name for bound, name in SIZE_CLASSES if params < bound)


def _gpt(name: str, layers: int, hidden: int, heads: int, vocab: int, ffn: int | None = None) -> ModelSpec:
    return ModelSpec(name=name, layers=layers, hidden=hidden, heads=heads, ffn=ffn or 4 * hidden, vocab=vocab)


_MEGATRON_README = (
    "NVIDIA/Megatron-LM README, Performance Benchmarking (images/model_table.png, commit f2e5db402c, 2024-07)"
)
_FOUNDRY = "mosaicml/llm-foundry scripts/train/benchmarking/README.md (commit 061f2c7c), A100 40GB"

CEILINGS = (
    # Megatron-Core weak scaling on H100 SXM, seq 4096, vocab 131072, f = 4h: the best run of each size class.
    Ceiling(
        device_class="H100",
        size_class="<20B",
        mfu=0.49,
        model=_gpt("GPT-16B", 32, 6144, 48, 131072),
        seq_len=4096,
        run="Megatron-Core GPT-16B on 192 H100",
        source=_MEGATRON_README,
        cite="Megatron-LM README, GPT-16B",
    ),
    Ceiling(
        device_class="H100",
        size_class="20-100B",
        mfu=0.46,
        model=_gpt("GPT-32B", 48, 7168, 56, 131072),
        seq_len=4096,
        run="Megatron-Core GPT-32B on 384 H100",
        source=_MEGATRON_README,
        cite="Megatron-LM README, GPT-32B",
    ),
    Ceiling(
        device_class="H100",
        size_class=">=100B",
        mfu=0.48,
        model=_gpt("GPT-314B", 96, 16384, 128, 131072),
        seq_len=4096,
        run="Megatron-Core GPT-314B on 3,072 H100",
        source=_MEGATRON_README,
        cite="Megatron-LM README, GPT-314B",
    ),
    # llm-foundry MPT on 128 A100 40GB, seq 2048 (MFU by 6N + 12·L·h·s, the full s² count).
    Ceiling(
        device_class="A100",
        size_class="<20B",
        mfu=0.5193,
        model=_gpt("MPT-13B", 40, 5120, 40, 50368),
        seq_len=2048,
        run="llm-foundry MPT-13B on 128 A100",
        source=_FOUNDRY,
        cite="llm-foundry benchmarks, MPT-13B",
    ),
    Ceiling(
        device_class="A100",
        size_class="20-100B",
        mfu=0.5225,
        model=_gpt("MPT-30B", 48, 7168, 56, 50368),
        seq_len=2048,
        run="llm-foundry MPT-30B on 128 A100",
        source=_FOUNDRY,
        cite="llm-foundry benchmarks, MPT-30B",
    ),
    # MegaScale's 175B on 256 A100 (Table 2), above Korthikanti et al.'s 1T at 56.3% (Table 5).
    Ceiling(
        device_class="A100",
        size_class=">=100B",
        mfu=0.653,
        model=_gpt("GPT-175B", 96, 12288, 128, 64000),
        seq_len=2048,
        run="MegaScale GPT-175B on 256 A100",
        source="Jiang et al. 2024, MegaScale, NSDI'24, arXiv:2402.15627, Table 2",
        cite="MegaScale, Table 2",
    ),
)
"""Best published bf16 MFU by device class and size class. For scale: Llama 3 405B reached 38-43% on 8K-16K
H100 (Dubey et al. 2024, Table 4), 38% at 131K tokens."""


def device_class(device_name: str) -> str | None:
    """The class of a device preset name (`Preset.device_class`, model/devices.py), None for a name that is no
    preset. A calibrated device keeps its preset's name before " (calibrated: ...)"."""
    preset = PRESETS.get(device_name.split(" (", 1)[0])
    return preset.device_class if preset is not None else None


def ceiling_for(device_name: str, model: ModelSpec) -> Ceiling | None:
    """The ceiling of a device's class and a model's size, None when none is tabulated."""
    cls, size = device_class(device_name), size_class(param_count(model))
    return next((c for c in CEILINGS if c.device_class == cls and c.size_class == size), None)


def mfu_ceiling(p: Prediction) -> Ceiling | None:
    """The ceiling of the prediction's device class and model size, None when none is tabulated."""
    return ceiling_for(p.device.name, p.model)


def above_ceiling(p: Prediction) -> Ceiling | None:
    """The ceiling a bf16 prediction exceeds (causal MFU against the run's causal MFU), else None; fp8 plans
    are not compared (the table holds bf16 runs)."""
    ceiling = mfu_ceiling(p)
    if ceiling is None or p.training.dtype != "bf16" or p.mfu <= ceiling.mfu_causal:
        return None
    return ceiling


def describe(c: Ceiling) -> str:
    """One line: the run, its published MFU and its causal count."""
    return f"{c.run}, {100 * c.mfu:.1f}% as published = {100 * c.mfu_causal:.1f}% causal ({c.cite})"


MOE_MEASURED = (0.81, 3.01)
"""Predicted over measured throughput, least and most, on the published MoE runs the model was scored on
(Megatron-Bridge's Qwen3-30B-A3B and Qwen3-235B-A22B on DGX-H100, B200 and GB200: benchmarks/heldout_moe.md);
tests/model/test_model_heldout_terms.py recomputes it."""


def moe_warning(p: Prediction) -> str:
    """For a mixture-of-experts model, how far the model was off on the only MoE runs it was scored on ('' for a
    dense model): its MoE terms are the experts' GEMMs, router, dispatcher traffic and all-to-all, and the runs
    differ from them both ways (their all-to-all partly hidden, their host and launch costs not counted)."""
    if p.model.experts <= 1:
        return ""
    lo, hi = MOE_MEASURED
    return (
        f"mixture of experts: on the published MoE runs it was scored on the model predicted {lo:.2f}-{hi:.2f}x "
        "the measured throughput (benchmarks/heldout_moe.md)"
    )
