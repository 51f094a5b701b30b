"""One prediction: inputs, memory, step time, utilisation; saved as JSON for `analyze --plan`."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

from tracediag import display
from tracediag.api_types import checked
from tracediag.errors import SpecError, shown
from tracediag.model.flops import layer_forward_flops, model_flops, param_count
from tracediag.model.memory import MemoryBreakdown, memory_per_device
from tracediag.model.specs import DeviceSpec, LinkSpec, ModelSpec, Split, Training, check_split
from tracediag.model.stack import Engine
from tracediag.model.time import TimeBreakdown, process_group_links, step_time

SCHEMA_VERSION = 1
"""Version of the saved prediction JSON."""

FLOPS_CONVENTION = {
    "mfu": "model FLOPs, causal attention (half the s^2 scores), no recompute / (step time * GPUs * dense peak)",
    "mfu_full_s2": "model FLOPs with the full s^2 score matrix (Megatron-LM 2024, PaLM, Llama 3, llm-foundry), "
    "no recompute / (step time * GPUs * dense peak)",
    "hfu": "executed FLOPs (causal attention when fused, full s^2 when materialised) plus the recomputed "
    "forward / (step time * GPUs * dense peak)",
}
"""What each utilisation counts (in the saved JSON as `flops_convention`)."""


@dataclass(frozen=True, kw_only=True, slots=True, repr=False)
class Prediction:
    """What the analytic model expects of one run; the fields `check` compares with a trace."""

    model: ModelSpec
    device: DeviceSpec
    split: Split
    training: Training
    engine: Engine
    gpus: int
    memory: MemoryBreakdown
    time: TimeBreakdown
    params: int
    """Total parameters."""
    model_flops_per_step: float
    """Causal count: 3× forward matmul FLOPs with causal attention (half the s² scores), no recompute; the
    FlashAttention papers' and Megatron-LM's current `num_floating_point_operations` count."""
    model_flops_full_s2: float
    """Megatron-LM 2024 / Korthikanti / PaLM convention: the same with the full s×s score matrix."""
    mfu: float
    """Model FLOPs utilisation, causal count, against the device's dense peak (never above `hfu`)."""
    mfu_full_s2: float
    """MFU under the full-s² convention, as Megatron-LM (2024), PaLM, Llama 3, llm-foundry and torchtitan
    report it: comparable with their published numbers, but it credits attention work no causal kernel does,
    so at long sequences it can exceed `hfu` and even 1."""
    hfu: float
    """Hardware FLOPs utilisation: the FLOPs the kernels execute (causal attention when fused, the full s²
    when the scores are materialised) plus the recomputed forward, against the dense peak; at most 1."""
    tokens_per_s: float
    """Tokens per second over all devices."""
    link_busbw: dict[str, float]
    """Bus bandwidth (bytes/s) assumed per collective kind: tp, cp, ep, dp, pp."""
    links: dict[str, str]
    """Link each collective kind runs over."""

    def __repr__(self) -> str:
        s = self.split
        dims = " ".join(
            f"{k}={getattr(s, k)}" for k in ("tp", "pp", "dp", "cp", "ep") if k in "tp pp dp" or getattr(s, k) > 1
        )
        memory = f"{self.memory.total / 2**30:.1f} GiB per device ({'fits' if self.fits else 'does not fit'})"
        return (
            f"<Prediction: {self.model.name} on {self.gpus} x {self.device.name}, {dims}: "
            f"step {self.step_time_s:.3f} s, MFU {100 * self.mfu:.1f}%, {memory}>"
        )

    def _repr_html_(self) -> str | None:
        """The `tracediag predict` text as a block (`tracediag.report.notebook`)."""
        return display.html(self)

    @property
    def fits(self) -> bool:
        """Whether the most loaded device stays within memory."""
        return self.memory.fits

    @property
    def step_time_s(self) -> float:
        """Predicted seconds per step."""
        return self.time.step_time_s

    def to_dict(self) -> dict[str, Any]:
        """Inputs and outputs as plain data (the saved JSON's content)."""
        t = self.time
        return {
            "schema_version": SCHEMA_VERSION,
            "inputs": {
                "model": asdict(self.model),
                "device": asdict(self.device),
                "split": asdict(self.split),
                "training": asdict(self.training),
                "engine": asdict(self.engine),
                "gpus": self.gpus,
            },
            "fits": self.fits,
            "memory_bytes_per_device": self.memory.total,
            "memory": self.memory.to_dict(),
            "step_time_s": t.step_time_s,
            "breakdown": t.to_dict(),
            "params": self.params,
            "model_flops_per_step": self.model_flops_per_step,
            "model_flops_full_s2": self.model_flops_full_s2,
            "mfu": self.mfu,
            "mfu_full_s2": self.mfu_full_s2,
            "hfu": self.hfu,
            "flops_convention": FLOPS_CONVENTION,
            "tokens_per_s": self.tokens_per_s,
            "link_busbw": self.link_busbw,
            "links": self.links,
        }

    def save(self, path: str | Path) -> None:
        """Write `to_dict()` as JSON."""
        Path(path).write_bytes(orjson.dumps(self.to_dict(), option=orjson.OPT_INDENT_2))


def executed_flops(model: ModelSpec, training: Training, engine: Engine) -> float:
    """FLOPs the kernels of one step execute: a fused (FlashAttention-class) kernel skips the masked half of
    the causal scores, a materialised softmax computes all of them; plus the recomputed forward FLOPs of
    whole layers (full), every second matmul (op) or the attention core (selective, unfused)."""
    seqs, s = training.global_batch, training.seq_len
    causal = engine.flash_attention
    done = model_flops(model, s, seqs, causal=causal)
    if training.recompute == "full":
        return done + seqs * model.layers * layer_forward_flops(model, s, causal=causal)
    if training.recompute == "op":  # every second matmul of the linear layers
        matmul = layer_forward_flops(model, s, causal=True) - 2.0 * s * s * model.heads * model.head_dim
        return done + seqs * model.layers * matmul / 2
    if training.recompute == "selective" and not causal:
        return done + seqs * model.layers * 4.0 * s * s * model.heads * model.head_dim
    return done


@checked
def predict(
    model: ModelSpec,
    device: DeviceSpec,
    split: Split,
    training: Training,
    engine: Engine,
    *,
    gpus: int | None = None,
) -> Prediction:
    """Predict memory, step time and utilisation of one split; raise `SpecError` if it is impossible."""
    gpus = split.gpus if gpus is None else gpus
    check_split(model, device, split, training, gpus)
    memory = memory_per_device(model, device, split, training, engine)
    time = step_time(model, device, split, training, engine)
    flops = model_flops(model, training.seq_len, training.global_batch, causal=True)
    full_s2 = model_flops(model, training.seq_len, training.global_batch)
    peak = device.peak_flops * time.step_time_s
    links = process_group_links(device, split, engine.collective_overhead_us)
    return Prediction(
        model=model,
        device=device,
        split=split,
        training=training,
        engine=engine,
        gpus=gpus,
        memory=memory,
        time=time,
        params=param_count(model),
        model_flops_per_step=flops,
        model_flops_full_s2=full_s2,
        mfu=flops / (peak * gpus),
        mfu_full_s2=full_s2 / (peak * gpus),
        hfu=executed_flops(model, training, engine) / (peak * gpus),
        tokens_per_s=training.global_batch * training.seq_len / time.step_time_s,
        link_busbw={k: v.busbw for k, v in links.items()},
        links={k: v.link for k, v in links.items()},
    )


def _build(cls: type, data: dict[str, Any]) -> Any:
    fields = {f.name: f.type for f in dataclasses.fields(cls)}
    for key, value in data.items():  # JSON booleans are no counts, numbers no flags
        kind = fields.get(key)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if (kind in ("int", "float") and not number) or (kind == "bool" and not isinstance(value, bool)):
            msg = f"{key} is {type(value).__name__}, not {'a number' if kind != 'bool' else 'true or false'}"
            raise SpecError(msg)
    return cls(**{k: v for k, v in data.items() if k in fields})


@checked
def load_prediction(path: str | Path) -> Prediction:
    """Read a prediction saved by `Prediction.save` (`tracediag predict -o`).

    The inputs are read back and the prediction is recomputed from them, so the result is exactly what the
    current model says for the saved run; the saved outputs are checked to be there.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        msg = f"{shown(path)}: cannot read the prediction ({e.strerror or e})"
        raise SpecError(msg) from None
    try:
        data = orjson.loads(raw)
        inputs = data["inputs"]
        version = data["schema_version"]
    except (orjson.JSONDecodeError, KeyError, TypeError) as e:
        msg = f"{shown(path)}: not a tracediag prediction ({e})\n\nHint: write one with `tracediag predict -o`"
        raise SpecError(msg) from e
    if version != SCHEMA_VERSION:
        msg = f"{path}: prediction schema_version {version}, expected {SCHEMA_VERSION}"
        raise SpecError(msg)
    _check_numbers(path, inputs, "inputs")
    try:
        dev = dict(inputs["device"])
        dev["intra_link"] = _build(LinkSpec, dev["intra_link"])
        dev["inter_link"] = _build(LinkSpec, dev["inter_link"])
        return predict(
            _build(ModelSpec, inputs["model"]),
            _build(DeviceSpec, dev),
            _build(Split, inputs["split"]),
            _build(Training, inputs["training"]),
            _build(Engine, inputs["engine"]),
            gpus=inputs["gpus"],
        )
    except SpecError as e:  # a spec's own check: say which file it came from
        msg = f"{shown(path)}: {e}"
        raise SpecError(msg) from None


SAVED_NUMBER_MAX = 1e18
"""No saved input is larger (a device of 1e18 FLOP/s or bytes is none): beyond, the file was edited."""


def _check_numbers(path: Path, value: object, key: str) -> None:
    """`SpecError` naming the file and key for a number of the saved inputs that is not finite, is
    negative or is past `SAVED_NUMBER_MAX` (no input of a prediction is any of these)."""
    if isinstance(value, dict):
        for k, v in value.items():
            _check_numbers(path, v, f"{key}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_numbers(path, v, f"{key}[{i}]")
    elif (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and not (math.isfinite(value) and 0 <= value <= SAVED_NUMBER_MAX)
    ):
        msg = f"{shown(path)}: {key} is {value:.6g}, outside 0..{SAVED_NUMBER_MAX:g}"
        raise SpecError(msg)
