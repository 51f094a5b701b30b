"""`tracediag predict` and `tracediag plan`: the analytic model from the command line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import orjson

from tracediag.cli.common import EXIT_FINDING, FilePath, Finite
from tracediag.cli.model_options import (
    COUNT,
    device_from_options,
    device_options,
    engine_from_options,
    grad_bytes,
    model_from_options,
    model_options,
    one_line_errors,
    precision_options,
    prediction_from_options,
    profile_from_options,
    split_options,
)
from tracediag.model.emit import ENGINES as EMIT_TARGETS
from tracediag.model.emit import emit
from tracediag.model.plan import DEFAULT_HEADROOM, NoFit, emit_refusal
from tracediag.model.plan import plan as run_plan
from tracediag.output import write_atomic
from tracediag.report.model_text import plan_json, plan_text, prediction_json, prediction_text


class Refused(click.ClickException):
    """A split the target should not run (it does not fit, or it wastes most of the GPUs): exit status 3."""

    exit_code = EXIT_FINDING


EMIT_ENGINE = {
    "megatron": "megatron-core",
    "torchtitan": "torchtitan",
    "torchtitan-0.2": "torchtitan",
    "deepspeed": "deepspeed",
}
"""Engine profile `plan --emit TARGET` uses unless --engine is given."""


@click.command()
@model_options
@device_options
@split_options
@click.option(
    "-o",
    "--output",
    type=FilePath(dir_okay=False, path_type=Path),
    help="Save the prediction (inputs + outputs) as JSON for `analyze --plan`.",
)
@one_line_errors
def predict(**kw: Any) -> None:
    """Predict memory per device, step time by part, MFU and tokens/s of one split.

    Exits 3 (as a failed check) when the split does not fit in device memory; the prediction is still
    printed and saved."""
    profile = profile_from_options(kw)
    p = prediction_from_options(kw, profile)
    if kw["output"]:
        write_atomic(kw["output"], orjson.dumps(p.to_dict(), option=orjson.OPT_INDENT_2))  # as Prediction.save
    click.echo(prediction_json(p, profile) if kw["fmt"] == "json" else prediction_text(p, profile))
    if not p.fits:
        raise SystemExit(EXIT_FINDING)


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
    type=Finite(0, 0.9),
    default=DEFAULT_HEADROOM,
    show_default=True,
    help="Share of device memory a plan keeps free (allocator spikes, NCCL buffers).",
)
@precision_options
@one_line_errors
def plan(**kw: Any) -> None:
    """Search every split that fits, rank by predicted throughput, say why each wins or loses."""
    profile = profile_from_options(kw)
    engine_name = kw["engine_name"]
    source = click.get_current_context().get_parameter_source("engine_name")
    if kw["emit_target"] and source == click.core.ParameterSource.DEFAULT:
        # Time and size the splits with the profile of the stack that will run them.
        engine_name = EMIT_ENGINE[kw["emit_target"]]
    model, device, engine = (
        model_from_options(kw),
        device_from_options(kw, profile),
        engine_from_options(kw, engine_name),
    )
    sizes = {
        "gpus": kw["gpus"],
        "seq_len": kw["seq_len"],
        "global_batch": kw["global_batch"],
        "headroom": kw["headroom"],
        "grad_bytes": grad_bytes(kw),
        "dtype": kw["dtype"],
    }
    try:
        result = run_plan(model, device, engine, top=kw["top"], target=kw["emit_target"], **sizes)
    except NoFit as e:
        if not kw["emit_target"]:
            raise
        result = e
    if kw["emit_target"]:
        why = emit_refusal(model, device, engine_from_options(kw), kw["emit_target"], result, **sizes)
        if why:
            raise Refused(why)
        click.echo(emit(result.ranked[0].prediction, kw["emit_target"]), nl=False)
    else:
        click.echo(plan_json(result, profile) if kw["fmt"] == "json" else plan_text(result, profile))
