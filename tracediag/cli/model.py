"""`tracediag predict` and `tracediag plan`: the analytic model from the command line."""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import orjson

from tracediag.cli.common import InputError
from tracediag.errors import TracediagError, one_line, shown
from tracediag.model.emit import ENGINES as EMIT_TARGETS
from tracediag.model.emit import emit
from tracediag.model.engine import ENGINES, resolve_engine
from tracediag.model.plan import plan as run_plan
from tracediag.model.predict import predict as run_predict
from tracediag.model.specs import (
    DEVICES,
    GB,
    RECOMPUTE_MODES,
    TFLOPS,
    ModelSpec,
    Split,
    Training,
    parse_link,
    resolve_device,
    resolve_model,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from tracediag.model.plan import Plan
    from tracediag.model.predict import Prediction

GIB = 2**30


class _Positive(click.ParamType):
    """A finite number above 0 (no nan, no inf, no 0): never silently replaced or propagated."""

    name = "number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not (math.isfinite(number) and number > 0):
            self.fail(f"{value!r} must be a finite number above 0", param, ctx)
        return number


POSITIVE = _Positive()
COUNT = click.IntRange(1, 2**31 - 1)
"""Sizes, degrees and counts: a whole number of at least 1 (and within Int32)."""


def _options(*decorators: Callable) -> Callable:
    def wrap(f: Callable) -> Callable:
        for d in reversed(decorators):
            f = d(f)
        return f

    return wrap


model_options = _options(
    click.option(
        "--model", "model_name", help="Preset name (gpt3-175b, llama3-8b, ...) or a HF config.json."
    ),
    click.option("--layers", type=COUNT, help="Layers (instead of --model)."),
    click.option("--hidden", type=COUNT, help="Hidden size."),
    click.option("--heads", type=COUNT, help="Attention heads."),
    click.option("--kv-heads", type=COUNT, help="Key/value heads (GQA); default = heads."),
    click.option("--ffn", type=COUNT, help="MLP inner size; default 4·hidden."),
    click.option("--swiglu/--gelu", default=False, help="Gated (SwiGLU) MLP or GeLU; with --layers."),
    click.option("--vocab", type=COUNT, help="Vocabulary size."),
)
device_options = _options(
    click.option("--gpus", type=COUNT, required=True, help="Total GPUs."),
    click.option("--gpu", "gpu", type=click.Choice(list(DEVICES)), required=True, help="Device preset."),
    click.option("--gpus-per-node", type=COUNT, help="GPUs per node (default: the preset's 8)."),
    click.option("--intra-link", help="In-node link preset (nvlink4, ...) or measured GB/s."),
    click.option("--inter-link", help="Network link preset (ib-ndr, roce-400g, ...) or measured GB/s."),
    click.option("--peak-tflops", type=POSITIVE, help="Override dense bf16 peak, TFLOP/s."),
    click.option("--memory-gb", type=POSITIVE, help="Override device memory, GB."),
    click.option("--hbm-gbps", type=POSITIVE, help="Override HBM bandwidth, GB/s."),
    click.option(
        "--engine",
        "engine_name",
        type=click.Choice(list(ENGINES)),
        default="modern",
        show_default=True,
        help="Software profile: kernels and overlap.",
    ),
    click.option("--seq-len", type=COUNT, required=True, help="Tokens per sequence."),
    click.option("--global-batch", type=COUNT, required=True, help="Sequences per step."),
    click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True),
)


def _errors(f: Callable) -> Callable:
    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return f(*args, **kwargs)
        except TracediagError as e:
            raise InputError(str(e).replace("\n\n", " ")) from e

    return wrapper


FILE_ERRORS = (KeyError, TypeError, ValueError, AttributeError, OverflowError, RecursionError)
"""What a JSON file with a wrong-typed value (a string or a list where a number belongs, 1e400)
raises in the code that reads it; at the command line it is one line naming the file."""


def checked_numbers(obj: Any, source: str) -> None:
    """`InputError` unless every number field of the dataclass `obj` is finite, and every int in 0..2^31-1."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if (isinstance(value, int) and not 0 <= value < 2**31) or not math.isfinite(value):
            raise InputError(f"{shown(source)}: {f.name} = {value!r} is out of range")


def _model(kw: dict) -> ModelSpec:
    if kw["model_name"]:
        try:
            spec = resolve_model(kw["model_name"])
        except FILE_ERRORS as e:
            why = one_line(f"{type(e).__name__}: {e}")
            raise InputError(f"{shown(kw['model_name'])}: not a usable model config ({why})") from None
        checked_numbers(spec, kw["model_name"])
        return spec
    missing = [n for n in ("layers", "hidden", "heads", "vocab") if kw[n] is None]
    if missing:
        msg = f"missing --model or --{' --'.join(missing)}"
        raise InputError(msg)
    return ModelSpec(
        layers=kw["layers"],
        hidden=kw["hidden"],
        heads=kw["heads"],
        kv_heads=kw["kv_heads"],
        ffn=kw["ffn"] or 4 * kw["hidden"],
        swiglu=kw["swiglu"],
        vocab=kw["vocab"],
    )


def _link(text: str | None, option: str) -> Any:
    if text is None:
        return None
    link = parse_link(text)
    if not (math.isfinite(link.bandwidth_gbps) and link.bandwidth_gbps > 0):
        raise InputError(f"{option} {text!r}: a bandwidth is a finite number of GB/s above 0")
    return link


def _device(kw: dict) -> Any:
    return resolve_device(
        kw["gpu"],
        gpus_per_node=kw["gpus_per_node"],
        intra_link=_link(kw["intra_link"], "--intra-link"),
        inter_link=_link(kw["inter_link"], "--inter-link"),
        peak_flops=kw["peak_tflops"] * TFLOPS if kw["peak_tflops"] is not None else None,
        memory_bytes=kw["memory_gb"] * GB if kw["memory_gb"] is not None else None,
        hbm_bandwidth=kw["hbm_gbps"] * GB if kw["hbm_gbps"] is not None else None,
    )


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
        f"MFU {100 * p.mfu:.1f}%  HFU {100 * p.hfu:.1f}%  {p.tokens_per_s:,.0f} tokens/s "
        f"({p.tokens_per_s / p.gpus:,.0f} per GPU)",
    ]
    return "\n".join(lines)


def render_plan(result: Plan) -> str:
    """Terminal text for a plan."""
    lines = [f"{result.explored} settings sized, {result.fitting} splits fit; fastest first:", ""]
    for r in result.ranked:
        p, s = r.prediction, r.prediction.split
        lines.append(
            f"#{r.rank} tp={s.tp} pp={s.pp} dp={s.dp} cp={s.cp}{f' ep={s.ep}' if s.ep > 1 else ''} "
            f"vpp={s.vpp} zero={s.zero} mb={p.training.micro_batch} recompute={p.training.recompute}: "
            f"MFU {100 * p.mfu:.1f}%, {p.step_time_s:.3f} s/step, {p.tokens_per_s:,.0f} tokens/s"
        )
        lines.append(f"    {r.reason}")
    return "\n".join(lines)


def _dump(data: dict) -> str:
    return orjson.dumps(data, option=orjson.OPT_INDENT_2).decode()


@click.command()
@model_options
@device_options
@click.option("--micro-batch", type=COUNT, default=1, show_default=True, help="Sequences per micro-batch.")
@click.option("--tp", type=COUNT, default=1, show_default=True)
@click.option("--pp", type=COUNT, default=1, show_default=True)
@click.option("--dp", type=COUNT, help="Data-parallel degree; default gpus/(tp·pp·cp).")
@click.option("--cp", type=COUNT, default=1, show_default=True)
@click.option("--ep", type=COUNT, default=1, show_default=True, help="Expert parallel (MoE).")
@click.option("--vpp", type=COUNT, default=1, show_default=True, help="Virtual stages per GPU (interleaving).")
@click.option(
    "--zero", type=click.IntRange(0, 3), default=1, show_default=True, help="ZeRO stage (3 = FSDP)."
)
@click.option("--recompute", type=click.Choice(RECOMPUTE_MODES), default="none", show_default=True)
@click.option("--sequence-parallel", is_flag=True, help="Megatron sequence parallelism (tp > 1).")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Save the prediction (inputs + outputs) as JSON for `analyze --plan`.",
)
@_errors
def predict(**kw: Any) -> None:
    """Predict memory per device, step time by part, MFU and tokens/s of one split."""
    p = prediction_from_options(kw)
    if kw["output"]:
        p.save(kw["output"])
    click.echo(_dump(p.to_dict()) if kw["fmt"] == "json" else render_prediction(p))


def prediction_from_options(kw: dict) -> Prediction:
    """The prediction `predict`'s options describe (also used by `analyze --model ...`)."""
    model, device = _model(kw), _device(kw)
    cp, tp, pp = kw["cp"], kw["tp"], kw["pp"]
    dp = kw["dp"] if kw["dp"] is not None else max(kw["gpus"] // (tp * pp * cp), 1)
    split = Split(
        tp=tp,
        pp=pp,
        dp=dp,
        cp=cp,
        ep=kw["ep"],
        vpp=kw["vpp"],
        zero=kw["zero"],
        sequence_parallel=kw["sequence_parallel"],
    )
    train = Training(
        seq_len=kw["seq_len"],
        global_batch=kw["global_batch"],
        micro_batch=kw["micro_batch"],
        recompute=kw["recompute"],
    )
    return run_predict(model, device, split, train, resolve_engine(kw["engine_name"]), gpus=kw["gpus"])


@click.command()
@model_options
@device_options
@click.option("--top", type=COUNT, default=5, show_default=True, help="Splits to show.")
@click.option(
    "--emit", "emit_target", type=click.Choice(EMIT_TARGETS), help="Print the best split as settings."
)
@_errors
def plan(**kw: Any) -> None:
    """Search every split that fits, rank by predicted throughput, say why each wins or loses."""
    result = run_plan(
        _model(kw),
        _device(kw),
        resolve_engine(kw["engine_name"]),
        gpus=kw["gpus"],
        seq_len=kw["seq_len"],
        global_batch=kw["global_batch"],
        top=kw["top"],
    )
    if kw["emit_target"]:
        click.echo(emit(result.ranked[0].prediction, kw["emit_target"]), nl=False)
    elif kw["fmt"] == "json":
        click.echo(_dump(result.to_dict()))
    else:
        click.echo(render_plan(result))


def register(group: click.Group) -> None:
    """Add `predict` and `plan` to the command group."""
    group.add_command(predict)
    group.add_command(plan)
