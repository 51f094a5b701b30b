"""`tracediag calibrate`: a profile of device and link efficiencies from a run's traces or one measured number."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import click
import orjson

from tracediag.cli.common import FilePath, Finite, InputError
from tracediag.cli.model import predict
from tracediag.cli.model_options import (
    device_from_options,
    engine_from_options,
    model_from_options,
    one_line_errors,
    split_from_options,
)
from tracediag.cli.traces import allow_missing_option, exit_if_missing, load_traces
from tracediag.errors import TracediagError
from tracediag.ingest.gemms import gemm_table
from tracediag.model.calibrate import (
    apply_profile,
    calibrate_from_step_time,
    calibrate_from_trace,
    step_time_from_measure,
)
from tracediag.model.predict import predict as run_predict
from tracediag.output import refuse_inputs, write_atomic
from tracediag.reduce import analyze, ignored_warning
from tracediag.report.model_text import calibration_text
from tracediag.run import resolve_paths

_NOT_SHARED = {"fmt", "output", "profile_path"}
_MEASURES = {
    "measured_step_time": "step_time",
    "measured_mfu": "mfu",
    "measured_hfu": "hfu",
    "measured_tokens_per_s": "tokens_per_s",
}


def _optional(param: click.Parameter) -> click.Parameter:
    p = copy.copy(param)
    p.required = False
    return p


def _with_predict_options(f: Any) -> Any:
    """`predict`'s model, device and split options, none required (a trace needs only --gpu)."""
    params = [_optional(p) for p in predict.params if p.name not in _NOT_SHARED]
    f.__click_params__ = [*getattr(f, "__click_params__", []), *reversed(params)]
    return f


@click.command()
@click.argument("paths", nargs=-1)
@click.option("--measured-step-time", type=Finite(min=0, min_open=True), help="Seconds per step the split reached.")
@click.option(
    "--measured-mfu", type=Finite(0, 1, min_open=True), help="MFU the split reached (0-1, Megatron's FLOP convention)."
)
@click.option(
    "--measured-hfu", type=Finite(0, 1, min_open=True), help="HFU the split reached (0-1, recomputation counted)."
)
@click.option("--measured-tokens-per-s", type=Finite(min=0, min_open=True), help="Tokens per second of the whole job.")
@click.option(
    "-o",
    "--output",
    type=FilePath(dir_okay=False, path_type=Path),
    required=True,
    help="Write the profile JSON here (then pass it to predict/plan/analyze with --profile).",
)
@allow_missing_option
@_with_predict_options
@one_line_errors
def calibrate(paths: tuple[str, ...], output: Path, allow_missing: bool, **kw: Any) -> None:
    """Measure GEMM, HBM and link efficiencies from a run's traces, or fit the GEMM rate to one measured number.

    From traces: the GEMM rate from ops with recorded shapes (record_shapes=True), bus bandwidth per
    collective kind and group size, and, with the run's --model and split options, the HBM rate. From one
    number (--measured-*, with the split's options as for `predict`): only the GEMM rate, by bisection.
    """
    measures = {name: kw[key] for key, name in _MEASURES.items() if kw[key] is not None}
    if bool(paths) == bool(measures) or len(measures) > 1:
        msg = "give either trace files or exactly one --measured-* number"
        raise InputError(msg)
    if kw["gpu"] is None:
        msg = "calibrate needs --gpu (the device preset the profile scales)"
        raise InputError(msg)
    engine = engine_from_options(kw)
    device = device_from_options(kw)
    failed: tuple[str, ...] = ()
    has_model = kw["model_name"] is not None or kw["layers"] is not None
    if paths:
        files = resolve_paths(paths)
        try:
            refuse_inputs(output, files, "-o")
        except TracediagError as e:
            raise InputError(str(e)) from None
        run = load_traces(paths, 0, None, ())
        failed = run.meta.errors
        # the GEMM table reads the files the run was read from: a manifest or README beside the
        # traces is skipped as analyze and ingest skip it, and said so
        read = {f.path for f in run.meta.files} | {w for f in run.meta.files for w in f.windows}
        files = [f for f in files if f in read]
        for line in ignored_warning(run.meta):
            click.echo(f"warning: {line}", err=True)
        try:
            result = analyze(run)
        except (TracediagError, ValueError) as e:
            raise InputError(str(e)) from None
        groups = {name: g.size for name, g in run.meta.process_groups.items() if g.size}
        extra: dict[str, Any] = {}
        if has_model:
            _needs(kw, "seq_len", "global_batch")
            kw = {**kw, "gpus": kw["gpus"] or result.world_size}
            split, train = split_from_options(kw)
            extra = {"model": model_from_options(kw), "split": split, "training": train}
        profile = calibrate_from_trace(gemm_table(files), result, device, engine, groups=groups, **extra)
        if not profile.calibrated:
            msg = f"nothing to calibrate in {len(files)} file(s): {'; '.join(profile.notes)}"
            raise InputError(msg)
    else:
        _needs(kw, "gpus", "seq_len", "global_batch")
        if not has_model:
            msg = "a measured number needs the run's --model (or --layers ...) and split options"
            raise InputError(msg)
        ((measure, value),) = measures.items()
        model, (split, train) = model_from_options(kw), split_from_options(kw)
        step = step_time_from_measure(measure, value, model, device, split, train, engine, gpus=kw["gpus"])
        profile = calibrate_from_step_time(
            model,
            device,
            split,
            train,
            engine,
            step_time_s=step,
            gpus=kw["gpus"],
            source=f"measured {measure.replace('_', ' ')} {value:g} on tp={split.tp} pp={split.pp} "
            f"dp={split.dp} cp={split.cp}",
        )
        check = run_predict(model, apply_profile(device, profile), split, train, engine, gpus=kw["gpus"])
        note = f"step time {step:.4g} s; calibrated prediction {check.step_time_s:.4g} s, MFU {100 * check.mfu:.1f}%"
        profile = dataclasses.replace(profile, notes=(*profile.notes, note))
    write_atomic(output, orjson.dumps(profile.to_dict(), option=orjson.OPT_INDENT_2) + b"\n")  # as Profile.save
    click.echo(calibration_text(profile, output))
    exit_if_missing(failed, allow_missing)


def _needs(kw: dict[str, Any], *names: str) -> None:
    missing = [n for n in names if kw[n] is None]
    if missing:
        msg = f"missing --{' --'.join(m.replace('_', '-') for m in missing)}"
        raise InputError(msg)
