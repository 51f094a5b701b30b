"""`tracediag predict` and `tracediag plan`: the analytic model from the command line."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import orjson

from tracediag.cli.model_options import (
    COUNT,
    device_from_options,
    device_options,
    engine_from_options,
    model_from_options,
    model_options,
    one_line_errors,
    prediction_from_options,
    profile_from_options,
    split_options,
)
from tracediag.model.emit import ENGINES as EMIT_TARGETS
from tracediag.model.emit import emit
from tracediag.model.plan import DEFAULT_HEADROOM, ceiling_warning, mfu_ceiling
from tracediag.model.plan import plan as run_plan
from tracediag.model.specs import (
    DTYPES,
)
from tracediag.output import write_atomic
from tracediag.units import of_peak

if TYPE_CHECKING:
    from tracediag.model.calibrate import Profile
    from tracediag.model.plan import Plan
    from tracediag.model.predict import Prediction

GIB = 2**30


def _gib(x: float) -> str:
    return f"{x / GIB:7.1f} GiB"


def render_prediction(p: Prediction) -> str:
    """Terminal text for one prediction."""
    s, t, mem = p.split, p.time, p.memory
    head = (
        f"{p.model.name} on {p.gpus} x {p.device.name}: tp={s.tp} pp={s.pp} dp={s.dp} cp={s.cp}"
        f"{f' ep={s.ep}' if s.ep > 1 else ''}{f' vpp={s.vpp}' if s.vpp > 1 else ''} zero={s.zero}"
        f"{' sp' if s.sequence_parallel else ''}, micro-batch {p.training.micro_batch}, "
        f"recompute {p.training.recompute}, engine {p.engine.name}"
    )
    lines = [head, "", f"memory per device (stage {mem.stage}): {'fits' if mem.fits else 'DOES NOT FIT'}"]
    for name in ("weights", "gradients", "optimizer", "activations", "temporary", "reserved"):
        lines.append(f"  {name:<12}{_gib(getattr(mem, name))}")
    lines += [
        f"  {'total':<12}{_gib(mem.total)} of {_gib(mem.capacity).strip()} "
        f"(headroom {_gib(mem.headroom).strip()}; {mem.in_flight_micro_batches:.1f} micro-batches in flight)",
        "",
        f"step time {t.step_time_s:.3f} s ({t.micro_batches} micro-batches per pipeline)",
    ]
    parts = (
        "compute_s",
        "exposed_tp_s",
        "exposed_pp_s",
        "exposed_dp_s",
        "exposed_cp_s",
        "exposed_ep_s",
        "bubble_s",
        "optimizer_s",
    )
    for name in parts:
        value = getattr(t, name)
        lines.append(f"  {name.removesuffix('_s'):<12}{value:9.3f} s  {100 * value / t.step_time_s:5.1f}%")
    lines += [
        "",
        f"{of_peak('MFU', p.mfu)}  {of_peak('HFU', p.hfu)}  {p.tokens_per_s:,.0f} tokens/s "
        f"({p.tokens_per_s / p.gpus:,.0f} per GPU)",
    ]
    return "\n".join(lines)


def render_plan(result: Plan) -> str:
    """Terminal text for a plan."""
    lines = [
        f"{result.explored} settings sized, {result.fitting} splits fit with {100 * result.headroom:.0f}% "
        f"memory headroom{f' and are expressible in {result.target}' if result.target else ''}; fastest first:",
        "",
    ]
    for r in result.ranked:
        p, s = r.prediction, r.prediction.split
        lines.append(
            f"#{r.rank} tp={s.tp} pp={s.pp} dp={s.dp} cp={s.cp}{f' ep={s.ep}' if s.ep > 1 else ''} "
            f"vpp={s.vpp} zero={s.zero} mb={p.training.micro_batch} recompute={p.training.recompute}: "
            f"{of_peak('MFU', p.mfu)}, {p.step_time_s:.3f} s/step, {p.tokens_per_s:,.0f} tokens/s"
        )
        lines.append(f"    {r.reason}")
        if r.warning:
            lines.append(f"    warning: {r.warning}")
    return "\n".join(lines)


def _dump(data: dict) -> str:
    return orjson.dumps(data, option=orjson.OPT_INDENT_2).decode()


EMIT_ENGINE = {"megatron": "megatron-core", "torchtitan": "torchtitan", "deepspeed": "deepspeed"}
"""Engine profile `plan --emit TARGET` uses unless --engine is given."""


def _calibration_line(profile: Profile | None) -> str:
    return f"{profile.describe()}\n" if profile is not None else ""


@click.command()
@model_options
@device_options
@split_options
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Save the prediction (inputs + outputs) as JSON for `analyze --plan`.",
)
@one_line_errors
def predict(**kw: Any) -> None:
    """Predict memory per device, step time by part, MFU and tokens/s of one split."""
    profile = profile_from_options(kw)
    p = prediction_from_options(kw, profile)
    if kw["output"]:
        write_atomic(kw["output"], orjson.dumps(p.to_dict(), option=orjson.OPT_INDENT_2))  # as Prediction.save
    if kw["fmt"] == "json":
        data = p.to_dict()
        if profile is not None:
            data["calibration"] = profile.to_dict()
        ceiling = mfu_ceiling(p.device)
        if ceiling is not None:
            data["published_mfu_ceiling"] = {"mfu": ceiling.mfu, "run": ceiling.run, "source": ceiling.source}
            data["warning"] = ceiling_warning(p)
        click.echo(_dump(data))
    else:
        warning = ceiling_warning(p)
        click.echo(_calibration_line(profile) + render_prediction(p) + (f"\nwarning: {warning}" if warning else ""))


@click.command()
@model_options
@device_options
@click.option("--top", type=COUNT, default=5, show_default=True, help="Splits to show.")
@click.option(
    "--emit",
    "emit_target",
    type=click.Choice(EMIT_TARGETS),
    help="Search only splits this engine can run as predicted (timed with its engine profile unless "
    "--engine is given), and print the best as its settings.",
)
@click.option(
    "--headroom",
    type=click.FloatRange(0, 0.9),
    default=DEFAULT_HEADROOM,
    show_default=True,
    help="Share of device memory a plan keeps free (allocator spikes, NCCL buffers).",
)
@click.option(
    "--grad-dtype",
    type=click.Choice(["fp32", "bf16"]),
    default="fp32",
    show_default=True,
    help="Gradient dtype kept and reduced.",
)
@click.option("--dtype", type=click.Choice(list(DTYPES)), default="bf16", show_default=True, help="GEMM precision.")
@one_line_errors
def plan(**kw: Any) -> None:
    """Search every split that fits, rank by predicted throughput, say why each wins or loses."""
    profile = profile_from_options(kw)
    engine_name = kw["engine_name"]
    source = click.get_current_context().get_parameter_source("engine_name")
    if kw["emit_target"] and source == click.core.ParameterSource.DEFAULT:
        # Time and size the splits with the profile of the stack that will run them.
        engine_name = EMIT_ENGINE[kw["emit_target"]]
    result = run_plan(
        model_from_options(kw),
        device_from_options(kw, profile),
        engine_from_options(kw, engine_name),
        gpus=kw["gpus"],
        seq_len=kw["seq_len"],
        global_batch=kw["global_batch"],
        top=kw["top"],
        headroom=kw["headroom"],
        target=kw["emit_target"],
        grad_bytes=2 if kw["grad_dtype"] == "bf16" else 4,
        dtype=kw["dtype"],
    )
    if kw["emit_target"]:
        click.echo(emit(result.ranked[0].prediction, kw["emit_target"]), nl=False)
    elif kw["fmt"] == "json":
        data = result.to_dict()
        if profile is not None:
            data["calibration"] = profile.to_dict()
        click.echo(_dump(data))
    else:
        click.echo(_calibration_line(profile) + render_plan(result))


def register(group: click.Group) -> None:
    """Add `predict` and `plan` to the command group."""
    group.add_command(predict)
    group.add_command(plan)
