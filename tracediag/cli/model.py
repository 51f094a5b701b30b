"""`tracediag predict` and `tracediag plan`: the analytic model from the command line."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import orjson

from tracediag.cli.common import InputError
from tracediag.errors import TracediagError
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


def _options(*decorators: Callable) -> Callable:
    def wrap(f: Callable) -> Callable:
        for d in reversed(decorators):
            f = d(f)
        return f

    return wrap


model_options = _options(
    click.option("--model", "model_name", help="Preset name (gpt3-175b, llama3-8b, ...) or a HF config.json."),
    click.option("--layers", type=int, help="Layers (instead of --model)."),
    click.option("--hidden", type=int, help="Hidden size."),
    click.option("--heads", type=int, help="Attention heads."),
    click.option("--kv-heads", type=int, help="Key/value heads (GQA); default = heads."),
    click.option("--ffn", type=int, help="MLP inner size; default 4·hidden."),
    click.option("--swiglu/--gelu", default=False, help="Gated (SwiGLU) MLP or GeLU; with --layers."),
    click.option("--vocab", type=int, help="Vocabulary size."),
)
device_options = _options(
    click.option("--gpus", type=int, required=True, help="Total GPUs."),
    click.option("--gpu", "gpu", type=click.Choice(list(DEVICES)), required=True, help="Device preset."),
    click.option("--gpus-per-node", type=int, help="GPUs per node (default: the preset's 8)."),
    click.option("--intra-link", help="In-node link preset (nvlink4, ...) or measured GB/s."),
    click.option("--inter-link", help="Network link preset (ib-ndr, roce-400g, ...) or measured GB/s."),
    click.option("--peak-tflops", type=float, help="Override dense bf16 peak, TFLOP/s."),
    click.option("--memory-gb", type=float, help="Override device memory, GB."),
    click.option("--hbm-gbps", type=float, help="Override HBM bandwidth, GB/s."),
    click.option(
        "--engine",
        "engine_name",
        type=click.Choice(list(ENGINES)),
        default="megatron-core",
        show_default=True,
        help="Software profile: kernels and overlap.",
    ),
    click.option("--seq-len", type=int, required=True, help="Tokens per sequence."),
    click.option("--global-batch", type=int, required=True, help="Sequences per step."),
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


def _model(kw: dict) -> ModelSpec:
    if kw["model_name"]:
        return resolve_model(kw["model_name"])
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


def _device(kw: dict) -> Any:
    return resolve_device(
        kw["gpu"],
        gpus_per_node=kw["gpus_per_node"],
        intra_link=parse_link(kw["intra_link"]) if kw["intra_link"] else None,
        inter_link=parse_link(kw["inter_link"]) if kw["inter_link"] else None,
        peak_flops=kw["peak_tflops"] * TFLOPS if kw["peak_tflops"] else None,
        memory_bytes=kw["memory_gb"] * GB if kw["memory_gb"] else None,
        hbm_bandwidth=kw["hbm_gbps"] * GB if kw["hbm_gbps"] else None,
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
@click.option("--micro-batch", type=int, default=1, show_default=True, help="Sequences per micro-batch.")
@click.option("--tp", type=int, default=1, show_default=True)
@click.option("--pp", type=int, default=1, show_default=True)
@click.option("--dp", type=int, help="Data-parallel degree; default gpus/(tp·pp·cp).")
@click.option("--cp", type=int, default=1, show_default=True)
@click.option("--ep", type=int, default=1, show_default=True, help="Expert parallel (MoE).")
@click.option("--vpp", type=int, default=1, show_default=True, help="Virtual stages per GPU (interleaving).")
@click.option("--zero", type=click.IntRange(0, 3), default=1, show_default=True, help="ZeRO stage (3 = FSDP).")
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
@click.option("--top", type=int, default=5, show_default=True, help="Splits to show.")
@click.option("--emit", "emit_target", type=click.Choice(EMIT_TARGETS), help="Print the best split as settings.")
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
