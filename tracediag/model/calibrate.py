"""Calibration: the device and link efficiencies a user's own run reached, as a profile JSON.

A `Profile` holds scales on the device preset (GEMM rate, HBM bandwidth) and measured bus bandwidths of
the two link classes; `apply_profile` turns a preset into the calibrated `DeviceSpec`. Profiles come from

- a trace (`calibrate_from_trace`): GEMM ops with recorded shapes give the achieved GEMM rate against the
  model's rate for the same shapes; the run's matched collectives give bus bandwidth per collective
  kind and group size; with the run's model and split, the non-GEMM compute per step gives the HBM
  scale. Each part is calibrated separately.
- one measured number (`calibrate_from_step_time`, `step_time_from_measure`): a step time, MFU, HFU or
  tokens/s of a known split. One number calibrates one scalar: the compute scale, solved by bisection so
  the prediction matches; links and HBM stay as the preset says.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson
import polars as pl

from tracediag.analysis import Analysis
from tracediag.api_types import checked
from tracediag.errors import SpecError, shown
from tracediag.model.predict import predict
from tracediag.model.specs import DeviceSpec, ModelSpec, Split, Training
from tracediag.model.stack import Engine
from tracediag.model.time import FACTOR, gemm_time
from tracediag.schema import GemmTable
from tracediag.units import NS_PER_S

PROFILE_VERSION = 1
"""Version of the profile JSON."""

PARTS = ("compute", "hbm", "intra_link", "inter_link")
"""What a profile can calibrate."""

MEASURES = ("step_time", "mfu", "hfu", "tokens_per_s")
"""The single numbers `calibrate` accepts."""

_DTYPE_CLASS = {
    "c10::BFloat16": "bf16",
    "c10::Half": "bf16",
    "float": "fp32",
    "c10::Float8_e4m3fn": "fp8",
    "c10::Float8_e5m2": "fp8",
}
"""Recorded `Input type` → the rate class; bf16 and fp16 share the dense 16-bit tensor-core peak."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CollectiveFit:
    """Bus bandwidth one collective kind reached in one group size."""

    op: str
    group_size: int
    link: str
    """`intra` (the group fits in a node) or `inter`."""
    instances: int
    median_bytes: float
    busbw_gbps: float
    """Σ bytes·bus factor / Σ transfer time (nccl-tests convention; large messages dominate)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class GemmFit:
    """Achieved and predicted rate of one GEMM shape."""

    op: str
    shape: str
    """`BxMxKxN`."""
    dtype: str
    count: int
    achieved_tflops: float
    predicted_tflops: float
    """The model's rate for this shape on the uncalibrated device."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Profile:
    """Measured efficiencies of one device and its links, relative to the preset they were fitted on."""

    source: str
    """Where the numbers came from (trace paths, or the measured number and its split)."""
    device: str
    """Device preset the scales are relative to."""
    compute_scale: float = 1.0
    """Achieved / predicted GEMM rate (multiplies `gemm_efficiency`)."""
    hbm_scale: float = 1.0
    """Achieved / predicted memory-bound rate (multiplies `hbm_bandwidth`)."""
    intra_busbw_gbps: float | None = None
    """Measured bus bandwidth of in-node groups, GB/s (replaces the in-node link)."""
    inter_busbw_gbps: float | None = None
    """Measured bus bandwidth of groups spanning nodes, GB/s (replaces the network link)."""
    calibrated: tuple[str, ...] = ()
    """The parts (`PARTS`) that came from measurement; the rest is the preset."""
    collectives: tuple[CollectiveFit, ...] = ()
    gemms: tuple[GemmFit, ...] = ()
    notes: tuple[str, ...] = ()
    """What the calibration could not tell apart, and self-checks (predicted vs measured step time)."""

    def __post_init__(self) -> None:
        bad = [p for p in self.calibrated if p not in PARTS]
        if bad or self.compute_scale <= 0 or self.hbm_scale <= 0:
            msg = f"profile: unknown parts {bad} or a scale <= 0"
            raise SpecError(msg)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (the saved JSON)."""
        return {"profile_version": PROFILE_VERSION, **asdict(self)}

    @checked
    def save(self, path: str | Path) -> None:
        """Write `to_dict()` as JSON."""
        Path(path).write_bytes(orjson.dumps(self.to_dict(), option=orjson.OPT_INDENT_2) + b"\n")

    def describe(self) -> str:
        """One line: which parts are calibrated, with their values."""
        parts = []
        if "compute" in self.calibrated:
            parts.append(f"GEMM rate x{self.compute_scale:.3g}")
        if "hbm" in self.calibrated:
            parts.append(f"HBM rate x{self.hbm_scale:.3g}")
        if "intra_link" in self.calibrated:
            parts.append(f"in-node bus bandwidth {self.intra_busbw_gbps:.3g} GB/s")
        if "inter_link" in self.calibrated:
            parts.append(f"network bus bandwidth {self.inter_busbw_gbps:.3g} GB/s")
        rest = [p for p in PARTS if p not in self.calibrated]
        tail = f"; from the preset: {', '.join(rest)}" if rest else ""
        return f"calibrated ({self.source}): {', '.join(parts) or 'nothing'}{tail}"


_PROFILE_NUMBERS: dict[str, tuple[float, float]] = {
    "compute_scale": (1e-3, 1e3),
    "hbm_scale": (1e-3, 1e3),
    "intra_busbw_gbps": (1e-3, 1e6),
    "inter_busbw_gbps": (1e-3, 1e6),
}
"""A profile's numbers and the range each must lie in (a scale of 1e308 or 1e-300 is no measurement)."""


def _check_number(path: Path, key: str, value: Any, low: float, high: float) -> None:
    """`SpecError` naming the file and key unless `value` is absent (optional), or a finite number (not a
    boolean) in ``[low, high]``."""
    if value is None and key.endswith("_gbps"):
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        why = f"is {type(value).__name__}, not a number"
    elif not math.isfinite(value) or not low <= value <= high:
        why = f"is {value:.6g}, outside {low:g}..{high:g}"
    else:
        return
    msg = f"{shown(path)}: {key} {why}"
    raise SpecError(msg)


_PART_NUMBER = {"intra_link": "intra_busbw_gbps", "inter_link": "inter_busbw_gbps"}


def _check_parts(path: Path, data: dict[str, Any]) -> None:
    """`SpecError` naming the file unless `source` and `device` are strings and every calibrated part is a
    known one that has its number (a calibrated link without its bandwidth is no measurement)."""
    for key in ("source", "device"):
        if not isinstance(data.get(key), str):
            msg = f"{shown(path)}: {key} is {type(data.get(key)).__name__}, not a string"
            raise SpecError(msg)
    for part in data["calibrated"]:
        if part not in PARTS:
            msg = f"{shown(path)}: calibrated names {part!r}, not one of {', '.join(PARTS)}"
            raise SpecError(msg)
        if part in _PART_NUMBER and data.get(_PART_NUMBER[part]) is None:
            msg = f"{shown(path)}: {part} is calibrated but {_PART_NUMBER[part]} is missing"
            raise SpecError(msg)


@checked
def load_profile(path: str | Path) -> Profile:
    """Read a profile written by `Profile.save` (`tracediag calibrate -o`)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        msg = f"{shown(path)}: cannot read the profile ({e.strerror or e})"
        raise SpecError(msg) from None
    try:
        data = orjson.loads(raw)
        version = data.pop("profile_version")
        data["calibrated"] = tuple(data.get("calibrated", ()))
        data["notes"] = tuple(data.get("notes", ()))
        data["collectives"] = tuple(CollectiveFit(**c) for c in data.get("collectives", ()))
        data["gemms"] = tuple(GemmFit(**g) for g in data.get("gemms", ()))
        if version != PROFILE_VERSION:
            msg = f"{path}: profile_version {version}, expected {PROFILE_VERSION}"
            raise SpecError(msg)
        for key, (low, high) in _PROFILE_NUMBERS.items():
            _check_number(path, key, data.get(key), low, high)
        _check_parts(path, data)
        return Profile(**data)
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        msg = f"{shown(path)}: not a tracediag profile ({e})\n\nHint: write one with `tracediag calibrate -o`"
        raise SpecError(msg) from e


@checked
def apply_profile(device: DeviceSpec, profile: Profile) -> DeviceSpec:
    """`device` with the profile's calibrated parts applied (the others untouched)."""
    changes: dict[str, Any] = {}
    if "compute" in profile.calibrated:
        eff = device.gemm_efficiency * profile.compute_scale
        if eff > 1:
            msg = (
                f"profile {profile.source}: the measured GEMM rate is {eff:.2f}x the peak of {device.name} "
                f"({device.peak_flops / 1e12:g} TFLOP/s)\n\nHint: give the device's real peak with --peak-tflops"
            )
            raise SpecError(msg)
        changes["gemm_efficiency"] = eff
    if "hbm" in profile.calibrated:
        changes["hbm_bandwidth"] = device.hbm_bandwidth * profile.hbm_scale
    for part, field, gbps in (
        ("intra_link", "intra_link", profile.intra_busbw_gbps),
        ("inter_link", "inter_link", profile.inter_busbw_gbps),
    ):
        if part in profile.calibrated and gbps:
            link = getattr(device, field)
            changes[field] = dataclasses.replace(
                link, name=f"{link.name}(calibrated)", bandwidth_gbps=gbps, efficiency=1.0
            )
    if changes:
        # The name carries what is calibrated, so every rendering of a prediction (predict, plan, the
        # observed-vs-predicted check of analyze) says so.
        changes["name"] = f"{device.name} (calibrated: {', '.join(p for p in PARTS if p in profile.calibrated)})"
    return dataclasses.replace(device, **changes)


# ------------------------------------------------------------------------------------------- one number


def step_time_from_measure(
    measure: str,
    value: float,
    model: ModelSpec,
    device: DeviceSpec,
    split: Split,
    training: Training,
    engine: Engine,
    *,
    gpus: int | None = None,
) -> float:
    """The step time a measured MFU, HFU, tokens/s (whole job) or step time stands for."""
    if measure not in MEASURES or value <= 0:
        msg = f"measured {measure} must be one of {', '.join(MEASURES)} and > 0, got {value}"
        raise SpecError(msg)
    if measure == "step_time":
        return value
    if measure == "tokens_per_s":
        return training.global_batch * training.seq_len / value
    p = predict(model, device, split, training, engine, gpus=gpus)
    # mfu·step and hfu·step are fixed by the FLOPs, the peak and the GPU count.
    # A measured MFU is in the full-s² convention frameworks log (Megatron-LM, torchtitan, llm-foundry).
    return (p.mfu_full_s2 if measure == "mfu" else p.hfu) * p.step_time_s / value


@checked
def calibrate_from_step_time(
    model: ModelSpec,
    device: DeviceSpec,
    split: Split,
    training: Training,
    engine: Engine,
    *,
    step_time_s: float,
    gpus: int | None = None,
    source: str = "measured step time",
) -> Profile:
    """The compute scale that makes the prediction of this split take `step_time_s` (bisection).

    Step time falls monotonically as the GEMM rate rises; the scale is searched between a thousandth of
    the preset's rate and the device's peak.
    """

    def predicted(scale: float) -> float:
        dev = dataclasses.replace(device, gemm_efficiency=device.gemm_efficiency * scale)
        return predict(model, dev, split, training, engine, gpus=gpus).step_time_s

    lo, hi = 1e-3, 1.0 / device.gemm_efficiency
    fastest, slowest = predicted(hi), predicted(lo)
    if step_time_s < fastest:
        msg = (
            f"measured step time {step_time_s:.4g} s is shorter than the model predicts with GEMMs at 100% of "
            f"peak ({fastest:.4g} s): its communication, bubble or memory-bound time is too long for this run"
            "\n\nHint: calibrate from a trace of the run, which measures links and HBM too"
        )
        raise SpecError(msg)
    if step_time_s > slowest:
        msg = f"measured step time {step_time_s:.4g} s is beyond what any GEMM rate explains ({slowest:.4g} s)"
        raise SpecError(msg)
    for _ in range(200):
        mid = (lo * hi) ** 0.5
        if predicted(mid) > step_time_s:
            lo = mid
        else:
            hi = mid
        if hi / lo - 1 < 1e-12:
            break
    scale = (lo * hi) ** 0.5
    return Profile(
        source=source,
        device=device.name,
        compute_scale=scale,
        calibrated=("compute",),
        notes=(
            "one number calibrates one scalar: the GEMM rate; HBM and link bandwidths are the preset's, so "
            "the scale also absorbs whatever else the model gets wrong for this run",
        ),
    )


# ------------------------------------------------------------------------------------------- from a trace


def fit_gemms(table: pl.DataFrame, device: DeviceSpec, engine: Engine) -> tuple[float | None, tuple[GemmFit, ...]]:
    """(achieved / predicted GEMM rate over the 16-bit GEMMs (fp8 when there are none), per-shape rates with
    the most time first)."""
    if not table.height:
        return None, ()
    shapes = (
        table.with_columns(
            cls=pl.col("dtype").replace_strict(_DTYPE_CLASS, default="other"),
            flops=2.0 * pl.col("batch") * pl.col("m") * pl.col("k") * pl.col("n"),
        )
        .group_by("op", "batch", "m", "k", "n", "cls")
        .agg(count=pl.len(), flops=pl.col("flops").sum(), seconds=pl.col("seconds").sum())
        .sort("seconds", descending=True)
    )
    predicted = [
        gemm_time(f, min(m, k, n), device, engine, "fp8" if cls == "fp8" else "bf16")
        for f, m, k, n, cls in shapes.select("flops", "m", "k", "n", "cls").iter_rows()
    ]
    shapes = shapes.with_columns(predicted_s=pl.Series(predicted, dtype=pl.Float64))
    # The model's GEMM rate is the 16-bit one (fp8 runs scale from it): fit on bf16/fp16 GEMMs, else fp8.
    chosen = shapes.filter(pl.col("cls") == "bf16")
    if not chosen.height:
        chosen = shapes.filter(pl.col("cls") == "fp8")
    scale = float(chosen["predicted_s"].sum() / chosen["seconds"].sum()) if chosen.height else None
    fits = tuple(
        GemmFit(
            op=op,
            shape=f"{b}x{m}x{k}x{n}",
            dtype=cls,
            count=count,
            achieved_tflops=flops / sec / 1e12,
            predicted_tflops=flops / pred / 1e12,
        )
        for op, b, m, k, n, cls, count, flops, sec, pred in shapes.head(20).iter_rows()
    )
    return scale, fits


def fit_collectives(
    analysis: Analysis, gpus_per_node: int, groups: dict[str, int] | None = None
) -> tuple[CollectiveFit, ...]:
    """Bus bandwidth per collective kind and group size from the run's matched collectives.

    `groups` maps process-group names to sizes (`RunMeta.process_groups`). An instance's group size is
    its group's; for unnamed groups (gloo traces name none) it is the size every multi-rank group of
    the run shares, else the ranks that recorded it. Without host names in the traces, a group of at
    most `gpus_per_node` ranks is taken to sit in one node (ranks packed by node, as launchers place them).
    """
    coll = analysis.collectives.filter(
        pl.col("op").is_in([k for k in FACTOR if k != "p2p"])
        & pl.col("bytes").is_not_null()
        & (pl.col("transfer_ns") > 0)
        & (pl.col("n_ranks") > 1)
    )
    if not coll.height:
        return ()
    groups = groups or {}
    shared = {size for size in groups.values() if size > 1}
    unnamed = shared.pop() if len(shared) == 1 else None
    size = pl.col("group").replace_strict(groups, default=None, return_dtype=pl.Int64)
    if unnamed is not None:
        size = pl.when(pl.col("group") == "").then(pl.lit(unnamed, dtype=pl.Int64)).otherwise(size)
    coll = coll.with_columns(size=pl.coalesce(size, pl.col("n_ranks").cast(pl.Int64)))
    n = pl.col("size").cast(pl.Float64)
    factor = pl.when(pl.col("op") == "all_reduce").then(2 * (n - 1) / n).otherwise((n - 1) / n)
    rows = (
        coll.with_columns(bus_bytes=pl.col("bytes") * factor)
        .group_by("op", "size")
        .agg(
            instances=pl.len(),
            median_bytes=pl.col("bytes").median(),
            busbw_gbps=pl.col("bus_bytes").sum() / pl.col("transfer_ns").sum(),
        )
        .sort("op", "size")
    )
    return tuple(
        CollectiveFit(
            op=op,
            group_size=size,
            link="intra" if size <= gpus_per_node else "inter",
            instances=count,
            median_bytes=float(med),
            busbw_gbps=float(bw),
        )
        for op, size, count, med, bw in rows.iter_rows()
    )


def _link_busbw(fits: tuple[CollectiveFit, ...], link: str) -> float | None:
    """Byte-weighted bus bandwidth of one link class over its collective kinds."""
    chosen = [f for f in fits if f.link == link]
    if not chosen:
        return None
    weight = sum(f.median_bytes * f.instances for f in chosen)
    return sum(f.busbw_gbps * f.median_bytes * f.instances for f in chosen) / weight


def measured_step_time(analysis: Analysis) -> tuple[float, float]:
    """(median step seconds, median compute seconds per rank-step) of the run."""
    steps = analysis.steps
    per_step = steps.group_by("step").agg(pl.col("dur_ns").max())
    return float(per_step["dur_ns"].median()) / NS_PER_S, float(steps["compute_ns"].median()) / NS_PER_S


@checked
def calibrate_from_trace(
    gemms: GemmTable,
    analysis: Analysis,
    device: DeviceSpec,
    engine: Engine,
    *,
    groups: dict[str, int] | None = None,
    model: ModelSpec | None = None,
    split: Split | None = None,
    training: Training | None = None,
) -> Profile:
    """Calibrate compute, HBM and links from the traces of one run: `gemms` is their GEMM table
    (`ingest.gemms.gemm_table`), `analysis` is `analyze` of them.

    The GEMM scale needs recorded shapes (`record_shapes=True`); the link bandwidths need collective
    sizes; the HBM scale needs the run's model, split and training (the non-GEMM compute per step is
    compared with the model's memory-bound time for them).
    """
    calibrated: list[str] = []
    notes: list[str] = []
    files = gemms["path"].n_unique() if gemms.height else 0
    scale, fitted = fit_gemms(gemms, device, engine)
    if scale is None:
        notes.append(
            "no bf16/fp16 GEMM with a recorded shape (profile with record_shapes=True): compute not calibrated"
        )
        scale = 1.0
    else:
        calibrated.append("compute")
    fits = fit_collectives(analysis, device.gpus_per_node, groups)
    intra, inter = _link_busbw(fits, "intra"), _link_busbw(fits, "inter")
    calibrated += [name for name, bw in (("intra_link", intra), ("inter_link", inter)) if bw]
    if not fits:
        notes.append("no collective with a recorded size: links not calibrated")
    profile = Profile(
        source=f"trace of {files} file(s)",
        device=device.name,
        compute_scale=scale,
        intra_busbw_gbps=intra,
        inter_busbw_gbps=inter,
        calibrated=tuple(calibrated),
        collectives=fits,
        gemms=fitted,
    )
    step_s, compute_s = measured_step_time(analysis)
    if model is None or split is None or training is None:
        notes.append("no model and split given: HBM not calibrated")
        return dataclasses.replace(profile, notes=tuple(notes))
    gemm_per_step = _gemm_seconds_per_step(gemms)
    p = predict(model, apply_profile(device, profile), split, training, engine, gpus=analysis.world_size)
    memory_bound = p.time.elementwise_s + p.time.optimizer_s
    non_gemm = compute_s - gemm_per_step
    if non_gemm > 0 and memory_bound > 0:
        profile = dataclasses.replace(
            profile, hbm_scale=memory_bound / non_gemm, calibrated=(*profile.calibrated, "hbm")
        )
    else:
        notes.append("no compute outside GEMMs measured: HBM not calibrated")
    check = predict(model, apply_profile(device, profile), split, training, engine, gpus=analysis.world_size)
    notes.append(
        f"self-check on this run: predicted step {check.step_time_s:.4g} s, measured {step_s:.4g} s "
        f"({100 * (check.step_time_s / step_s - 1):+.1f}%)"
    )
    return dataclasses.replace(profile, notes=tuple(notes))


def _gemm_seconds_per_step(table: pl.DataFrame) -> float:
    """Median over files of GEMM seconds per recorded step."""
    per_file = table.group_by("path").agg(pl.col("seconds").sum() / pl.col("steps").first().clip(1))
    return float(per_file["seconds"].median()) if per_file.height else 0.0
