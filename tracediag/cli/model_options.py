"""The options `predict`, `plan`, `calibrate` and `analyze --model` share, and the specs they describe
(model, device, engine profile, split): each command reads them through the same functions."""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from tracediag.cli.common import FilePath, Finite, InputError, LazyChoice, read_user_file
from tracediag.errors import TracediagError, shown

if TYPE_CHECKING:
    from collections.abc import Callable

    from tracediag.model.calibrate import Profile
    from tracediag.model.predict import Prediction
    from tracediag.model.specs import DeviceSpec, ModelSpec, Split, Training
    from tracediag.model.stack import Engine


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


def _devices() -> list[str]:
    from tracediag.model.specs import DEVICES

    return list(DEVICES)


def _engines() -> list[str]:
    from tracediag.model.stack import ENGINES

    return list(ENGINES)


def _dtypes() -> tuple[str, ...]:
    from tracediag.model.specs import DTYPES

    return DTYPES


def _recompute_modes() -> tuple[str, ...]:
    from tracediag.model.specs import RECOMPUTE_MODES

    return RECOMPUTE_MODES


class _DeviceName(LazyChoice):
    """A `--gpu` preset (any case); a name that is none is one line naming the closest presets, then all."""

    def __init__(self) -> None:
        super().__init__(_devices, case_sensitive=False)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            from tracediag.model.devices import unknown_device

            self.fail(unknown_device(str(value)), param, ctx)


DEVICE_NAME = _DeviceName()
COUNT = click.IntRange(1, 2**31 - 1)
"""Sizes, degrees and counts: a whole number of at least 1 (and within Int32)."""


def _options(*decorators: Callable) -> Callable:
    def wrap(f: Callable) -> Callable:
        for d in reversed(decorators):
            f = d(f)
        return f

    return wrap


model_options = _options(
    click.option("--model", "model_name", help="Preset name (gpt3-175b, llama3-8b, ...) or a HF config.json."),
    click.option("--layers", type=COUNT, help="Layers (instead of --model)."),
    click.option("--hidden", type=COUNT, help="Hidden size."),
    click.option("--heads", type=COUNT, help="Attention heads."),
    click.option("--kv-heads", type=COUNT, help="Key/value heads (GQA); default = heads."),
    click.option("--head-dim", type=COUNT, help="Channels per attention head (Qwen3, Gemma); default hidden / heads."),
    click.option("--ffn", type=COUNT, help="MLP inner size; default 4·hidden."),
    click.option("--swiglu/--gelu", default=False, help="Gated (SwiGLU) MLP or GeLU; with --layers."),
    click.option("--vocab", type=COUNT, help="Vocabulary size."),
    click.option("--experts", type=COUNT, help="MoE experts per MLP layer (overrides the preset)."),
    click.option("--top-k", type=COUNT, help="Experts each token is routed to (MoE)."),
    click.option(
        "--tied-embeddings/--untied-embeddings",
        "tied_embeddings",
        default=None,
        help="Output layer shares the input embedding (default: the preset's; untied for --layers).",
    ),
)
device_options = _options(
    click.option("--gpus", type=COUNT, required=True, help="Total GPUs."),
    click.option(
        "--gpu",
        "gpu",
        type=DEVICE_NAME,
        required=True,
        help="Device preset (datasheet numbers and sources: docs/model.md, Devices).",
    ),
    click.option("--gpus-per-node", type=COUNT, help="GPUs per node (default: the preset's; 8, h100-nvl 2)."),
    click.option("--intra-link", help="In-node link preset (nvlink4, ...) or measured GB/s."),
    click.option("--inter-link", help="Network link preset (ib-ndr, roce-400g, ...) or measured GB/s."),
    click.option("--peak-tflops", type=POSITIVE, help="Override dense bf16 peak, TFLOP/s."),
    click.option(
        "--memory-gb",
        type=POSITIVE,
        help="Override device memory, GiB, as HBM is labelled (an '80GB' part holds 80 GiB).",
    ),
    click.option("--hbm-gbps", type=POSITIVE, help="Override HBM bandwidth, GB/s."),
    click.option(
        "--oversubscription",
        type=Finite(min=1.0),
        help="Network oversubscription: injection over bisection bandwidth (default 1, non-blocking).",
    ),
    click.option(
        "--profile",
        "profile_path",
        type=FilePath(exists=True, dir_okay=False, path_type=Path),
        help="Apply a calibration profile written by `tracediag calibrate`.",
    ),
    click.option(
        "--engine",
        "engine_name",
        type=LazyChoice(_engines),
        default="megatron-core",
        show_default=True,
        help="Software profile: kernels and overlap.",
    ),
    click.option("--tp-overlap/--no-tp-overlap", default=None, help="TP collectives hidden behind GEMMs."),
    click.option("--dp-overlap/--no-dp-overlap", default=None, help="DP/FSDP traffic hidden behind compute."),
    click.option("--pp-overlap/--no-pp-overlap", default=None, help="Pipeline send/recv hidden behind compute."),
    click.option(
        "--attention",
        type=click.Choice(["fa1", "fa2", "fa3", "cudnn", "triton", "unfused"]),
        help="Attention kernel (default: the engine's): FlashAttention v1, -2, -3, cuDNN as Transformer Engine runs "
        "it, FlashAttention in Triton (llm-foundry's attn_impl triton), or materialised softmax.",
    ),
    click.option("--cp-all-gather/--cp-ring", default=None, help="Context parallelism by all-gather or ring."),
    click.option("--seq-len", type=COUNT, required=True, help="Tokens per sequence."),
    click.option("--global-batch", type=COUNT, required=True, help="Sequences per step."),
    click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True),
)


def one_line_errors(f: Callable) -> Callable:
    """Decorator: a `TracediagError` of the command becomes one `InputError` line (exit 2)."""

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return f(*args, **kwargs)
        except TracediagError as e:
            raise InputError(str(e).replace("\n\n", " ")) from e

    return wrapper


def checked_numbers(obj: Any, source: str) -> None:
    """`InputError` unless every number field of the dataclass `obj` is finite, and every int in 0..2^31-1."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if (isinstance(value, int) and not 0 <= value < 2**31) or not math.isfinite(value):
            msg = f"{shown(source)}: {f.name} = {value!r} is out of range"
            raise InputError(msg)


def model_from_options(kw: dict) -> ModelSpec:
    """The model `--model` (a preset or a HF config.json) or `--layers ...` describe."""
    from tracediag.model.specs import ModelSpec, resolve_model

    overrides = {k: kw[k] for k in ("experts", "top_k", "tied_embeddings") if kw.get(k) is not None}
    if kw.get("head_dim") is not None:
        overrides["attention_head_dim"] = kw["head_dim"]
    if kw["model_name"]:
        model = read_user_file(kw["model_name"], "--model", resolve_model, "model config")
        checked_numbers(model, kw["model_name"])
        return dataclasses.replace(model, **overrides) if overrides else model
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
        **overrides,
    )


def profile_from_options(kw: dict) -> Profile | None:
    """The calibration profile `--profile` names, or None."""
    if not kw.get("profile_path"):
        return None
    from tracediag.model.calibrate import load_profile

    return read_user_file(kw["profile_path"], "--profile", load_profile, "calibration profile")


def _link(text: str | None, option: str) -> Any:
    if text is None:
        return None
    from tracediag.model.specs import parse_link

    link = parse_link(text)
    if not (math.isfinite(link.bandwidth_gbps) and link.bandwidth_gbps > 0):
        msg = f"{option} {text!r}: a bandwidth is a finite number of GB/s above 0"
        raise InputError(msg)
    return link


def device_from_options(kw: dict, profile: Profile | None = None) -> DeviceSpec:
    """The device the options describe, with the calibration profile (if any) applied."""
    from tracediag.model.calibrate import apply_profile
    from tracediag.model.specs import GB, GIB, TFLOPS, resolve_device

    device = resolve_device(
        kw["gpu"],
        gpus_per_node=kw["gpus_per_node"],
        intra_link=_link(kw["intra_link"], "--intra-link"),
        inter_link=_link(kw["inter_link"], "--inter-link"),
        peak_flops=kw["peak_tflops"] * TFLOPS if kw["peak_tflops"] is not None else None,
        memory_bytes=kw["memory_gb"] * GIB if kw["memory_gb"] is not None else None,
        hbm_bandwidth=kw["hbm_gbps"] * GB if kw["hbm_gbps"] is not None else None,
        network_oversubscription=kw.get("oversubscription"),
    )
    return apply_profile(device, profile) if profile is not None else device


def engine_from_options(kw: dict, name: str | None = None) -> Engine:
    """The engine profile named by `--engine` (or `name`), with the switches the options set."""
    from tracediag.model.stack import ATTENTION_KERNELS, resolve_engine, with_overrides

    attention = kw.get("attention")
    switches = {
        "tp_overlap": kw.get("tp_overlap"),
        "dp_overlap": kw.get("dp_overlap"),
        "pp_overlap": kw.get("pp_overlap"),
        "cp_all_gather": kw.get("cp_all_gather"),
        "flash_attention": None if attention is None else attention != "unfused",
        "attention_kernel": attention if attention in ATTENTION_KERNELS else None,
    }
    engine = resolve_engine(name or kw["engine_name"])
    changed = [f"{k}={v}" for k, v in switches.items() if v is not None and getattr(engine, k) != v]
    if changed:
        switches["name"] = f"{engine.name} ({', '.join(changed)})"
    return with_overrides(engine, **switches)


def split_from_options(kw: dict) -> tuple[Split, Training]:
    """The split and training `predict`'s options describe."""
    from tracediag.model.specs import Split, Training

    cp, tp, pp = kw["cp"], kw["tp"], kw["pp"]
    dp = kw["dp"] if kw["dp"] is not None else max(kw["gpus"] // (tp * pp * cp), 1)
    split = Split(
        tp=tp,
        pp=pp,
        dp=dp,
        cp=cp,
        ep=kw["ep"],
        etp=kw.get("etp"),
        vpp=kw["vpp"],
        zero=kw["zero"],
        sequence_parallel=kw["sequence_parallel"],
    )
    train = Training(
        seq_len=kw["seq_len"],
        global_batch=kw["global_batch"],
        micro_batch=kw["micro_batch"],
        recompute=kw["recompute"],
        grad_bytes=grad_bytes(kw),
        dtype=kw.get("dtype") or "bf16",
    )
    return split, train


def prediction_from_options(kw: dict, profile: Profile | None = None) -> Prediction:
    """The prediction `predict`'s options describe (also used by `analyze --model ...`).

    `--profile` is read here when no profile is passed, so `analyze --model ... --profile FILE` applies it.
    """
    from tracediag.model.predict import predict as run_predict

    if profile is None:
        profile = profile_from_options(kw)
    model, device = model_from_options(kw), device_from_options(kw, profile)
    split, train = split_from_options(kw)
    return run_predict(model, device, split, train, engine_from_options(kw), gpus=kw["gpus"])


precision_options = _options(
    click.option(
        "--grad-dtype",
        type=click.Choice(["fp32", "bf16"]),
        default="fp32",
        show_default=True,
        help="Gradient dtype kept and reduced (fp32 main grads, as Megatron; bf16 as FSDP mixed precision).",
    ),
    click.option(
        "--dtype",
        type=LazyChoice(_dtypes),
        default="bf16",
        show_default=True,
        help="GEMM precision (fp8: Transformer Engine style, bf16 weights and activations kept).",
    ),
)
"""`--grad-dtype` and `--dtype`: `predict`'s (through `split_options`) and `plan`'s."""


def grad_bytes(kw: dict) -> int:
    """Bytes per gradient element `--grad-dtype` gives (4 when the command has no such option)."""
    return 2 if kw.get("grad_dtype") == "bf16" else 4


split_options = _options(
    click.option("--micro-batch", type=COUNT, default=1, show_default=True, help="Sequences per micro-batch."),
    click.option("--tp", type=COUNT, default=1, show_default=True),
    click.option("--pp", type=COUNT, default=1, show_default=True),
    click.option("--dp", type=COUNT, help="Data-parallel degree; default gpus/(tp·pp·cp)."),
    click.option("--cp", type=COUNT, default=1, show_default=True),
    click.option("--ep", type=COUNT, default=1, show_default=True, help="Expert parallel (MoE)."),
    click.option(
        "--etp",
        type=COUNT,
        help="Expert tensor parallel (Megatron-Core); below --tp the experts fold over tensor-parallel ranks.",
    ),
    click.option("--vpp", type=COUNT, default=1, show_default=True, help="Virtual stages per GPU (interleaving)."),
    click.option("--zero", type=click.IntRange(0, 3), default=1, show_default=True, help="ZeRO stage (3 = FSDP)."),
    click.option(
        "--recompute",
        type=LazyChoice(_recompute_modes),
        default="none",
        show_default=True,
        help="Activation recomputation.",
    ),
    precision_options,
    click.option("--sequence-parallel", is_flag=True, help="Megatron sequence parallelism (tp > 1)."),
)
