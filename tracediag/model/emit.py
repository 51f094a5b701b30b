"""A split as the settings its engine runs it with, everything the prediction assumed stated.

Targets, checked against each engine's own parser (tests/model/test_emit_frameworks.py): torchtitan 0.3
(`--module/--config` config-registry function plus `--section.key` overrides, as `ConfigManager.parse_args`
reads them), torchtitan 0.2 (job-config TOML), Megatron-LM (`parse_args` + `validate_args`: arguments and the
environment its validation requires) and DeepSpeed (`DeepSpeedConfig` JSON, plus what DeepSpeed takes from
user code, printed as a note). Every output starts with comment lines: the split, the engine profile and the
predicted step time, MFU and memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

from tracediag.errors import SpecError
from tracediag.model.ceilings import moe_warning
from tracediag.model.specs import stage_layers

if TYPE_CHECKING:
    from tracediag.model.predict import Prediction
    from tracediag.model.specs import ModelSpec, Split

ENGINES = ("torchtitan", "torchtitan-0.2", "megatron", "deepspeed")
"""Emit targets: torchtitan is its current release (0.3); torchtitan-0.2 the 0.2.x TOML."""

STACK_OF = {"torchtitan-0.2": "torchtitan"}
"""The stack whose rules an emit target obeys, where its name differs."""


def unsupported_model(target: str, model: ModelSpec) -> str | None:
    """Why `target` can run no split of `model` at all (None if some split may do): torchtitan's emitted
    settings run its llama3 module, which has no experts."""
    if STACK_OF.get(target, target) == "torchtitan" and model.experts > 1:
        return "the emitted torchtitan settings run its llama3 module, which has no experts"
    return None


def unsupported(target: str, model: ModelSpec, split: Split) -> str | None:
    """Why `target` cannot run `split` with the sharding and stage layout the model predicted (None if it can).

    Megatron-LM: ZeRO-1 is `--use-distributed-optimizer`; ZeRO-3 is `--use-torch-fsdp2`, which does not
    work with pipeline parallelism (`use_torch_fsdp2` docstring); there is no ZeRO-2. Only the first and
    last stage's layers can differ, and with interleaving each stage's layers are split evenly over its
    virtual stages (`get_num_layers_to_build` divides them by vp_size).
    torchtitan: FSDP2 shards gradients with the optimizer state, so ZeRO-2 (no reshard after forward) or
    ZeRO-3, never ZeRO-1; its DDP is 1-D only ("DDP has not supported > 1D parallelism"); stages hold
    `pipeline_parallel_layers_per_stage` layers, the first and last fewer by
    `pipeline_parallel_first/last_stage_less_layers`.
    DeepSpeed: the pipeline engine takes ZeRO 0-1 and no interleaving, and partitions layers itself
    (only even stages are emitted); AutoTP training combines TP with data parallelism and ZeRO 0-2 (AutoTP
    training tutorial), not with the pipeline engine; its `sequence_parallel_size` is Ulysses all-to-all,
    not the ring context parallelism the model times; its JSON has no expert parallelism.
    fsdp (PyTorch FSDP1 as llm-foundry / Composer run it): data parallelism only, NO_SHARD (ZeRO-0),
    SHARD_GRAD_OP (ZeRO-2) or FULL_SHARD (ZeRO-3); no optimizer-only sharding (ZeRO-1).
    """
    target = STACK_OF.get(target, target)
    layers = stage_layers(model.layers, split.pp)
    middle = set(layers[1:-1])
    if target == "megatron":
        if split.zero == 2:
            return "Megatron-LM has no ZeRO-2 (its distributed optimizer is ZeRO-1, --use-torch-fsdp2 is ZeRO-3)"
        if split.zero == 3 and split.pp > 1:
            return "Megatron-LM's torch FSDP2 (ZeRO-3) does not work with pipeline parallelism"
        if len(middle) > 1:
            return f"stages of {layers}: Megatron-LM sets only the first and last stage's layer count"
        if split.vpp > 1 and any(n % split.vpp for n in {layers[0], layers[-1], *middle}):
            return f"stages of {layers} do not split evenly into {split.vpp} virtual stages, as Megatron-LM does"
    elif target == "torchtitan":
        if why := unsupported_model(target, model):
            return why
        if split.etp is not None and split.etp != split.tp:
            return "the emitted torchtitan settings fold no experts over tensor-parallel ranks (etp below tp)"
        if split.zero == 1:
            return "torchtitan's FSDP2 shards gradients with the optimizer state (ZeRO-2 or ZeRO-3), no ZeRO-1"
        if split.zero == 0 and split.dp * split.cp > 1 and split.tp * split.pp * split.cp * split.ep > 1:
            return "torchtitan's DDP (ZeRO-0) supports only 1-D data parallelism"
        if split.pp > 1:
            per = max(layers)
            chunk = per // split.vpp
            if len(middle) > 1 or per % split.vpp or max(per - layers[0], per - layers[-1]) >= chunk:
                return f"stages of {layers} are not {split.vpp} virtual stages of equal size with lighter ends"
    elif target == "deepspeed":
        if split.pp > 1 and split.zero >= 2:
            return f"DeepSpeed's pipeline engine supports ZeRO stage 0 or 1 only (zero={split.zero}, pp={split.pp})"
        if split.vpp > 1:
            return "DeepSpeed's pipeline engine has no interleaved schedule"
        if split.pp > 1 and model.layers % split.pp:
            return f"{model.layers} layers over {split.pp} stages: DeepSpeed partitions layers itself"
        if split.zero == 3 and split.tp > 1:
            return "DeepSpeed AutoTP training supports ZeRO stages 0-2"
        if split.tp > 1 and split.pp > 1:
            return "DeepSpeed AutoTP training combines TP with data parallelism, not with its pipeline engine"
        if split.cp > 1:
            return "DeepSpeed's sequence parallelism is Ulysses all-to-all, not the ring context parallelism timed"
        if split.ep > 1:
            return "DeepSpeed's JSON config has no expert parallelism"
    elif target == "fsdp":
        if split.tp * split.pp * split.cp * split.ep > 1:
            return "PyTorch FSDP (llm-foundry) runs data parallelism only"
        if split.zero == 1:
            return "PyTorch FSDP has no optimizer-only sharding (ZeRO-1): NO_SHARD, SHARD_GRAD_OP or FULL_SHARD"
    else:
        msg = f"unknown engine {target!r}\n\nHint: one of {', '.join(ENGINES)}"
        raise SpecError(msg)
    return None


_RECOMPUTE = {
    "torchtitan": ("none", "op", "full"),
    "megatron": ("none", "selective", "full"),
    "deepspeed": ("none", "full"),
    "fsdp": ("none", "full"),
}
"""Recompute modes each engine expresses: torchtitan per-op selective (`op`) and full; Megatron-LM selective
(attention core) and full; DeepSpeed full-layer checkpointing."""


def unsupported_recompute(target: str, mode: str) -> str | None:
    """Why `target` cannot run recompute `mode` (None if it can)."""
    target = STACK_OF.get(target, target)
    if mode in _RECOMPUTE.get(target, ()):
        return None
    return f"{target} has no recompute mode {mode!r} (it has {', '.join(_RECOMPUTE.get(target, ()))})"


def _check(p: Prediction, target: str) -> None:
    why = unsupported(target, p.model, p.split) or unsupported_recompute(target, p.training.recompute)
    if why:
        msg = f"{why}\n\nHint: `tracediag plan --emit {target}` proposes only splits {target} can run"
        raise SpecError(msg)


GIB = 2**30


def header(p: Prediction, target: str) -> list[str]:
    """Comment lines (without the comment mark) stating what was predicted for the emitted split."""
    s, t, m = p.split, p.training, p.memory
    return [
        f"tracediag plan for {target}: {p.model.name} on {p.gpus} x {p.device.name}, engine profile {p.engine.name}",
        f"split: tp={s.tp} pp={s.pp} vpp={s.vpp} dp={s.dp} cp={s.cp} ep={s.ep} zero={s.zero}"
        f" sequence_parallel={s.sequence_parallel}",
        f"training: seq_len={t.seq_len} global_batch={t.global_batch} micro_batch={t.micro_batch}"
        f" recompute={t.recompute} dtype={t.dtype} grad_bytes={t.grad_bytes}",
        f"assumed overlap: tp={p.engine.tp_overlap} dp={p.engine.dp_overlap} pp={p.engine.pp_overlap};"
        f" attention {p.engine.attention_kernel if p.engine.flash_attention else 'unfused'}",
        f"predicted: step {p.step_time_s:.3f} s, MFU {100 * p.mfu:.1f}% (causal count;"
        f" {100 * p.mfu_full_s2:.1f}% full-s2), HFU {100 * p.hfu:.1f}%, memory {m.total / GIB:.1f} of"
        f" {m.capacity / GIB:.1f} GiB per device",
        *([f"warning: {w}"] if (w := moe_warning(p)) else []),
    ]


def _comment(lines: list[str]) -> str:
    return "".join(f"# {line}\n" for line in lines)


def _bash_array(name: str, args: list[str]) -> str:
    """`NAME=( ... )`, one flag (and its value) per line; values are plain words, so no quoting is needed."""
    lines, i = [], 0
    while i < len(args):
        has_value = i + 1 < len(args) and not args[i + 1].startswith("-") and ":" not in args[i + 1]
        lines.append(f"    {args[i]} {args[i + 1]}" if has_value else f"    {args[i]}")
        i += 2 if has_value else 1
    return f"{name}=(\n" + "\n".join(lines) + "\n)\n"


# ---------------------------------------------------------------------------------------------- torchtitan

TORCHTITAN_CONFIGS = {
    "llama3-8b": ("llama3_8b", "8B"),
    "llama3.1-8b": ("llama3_8b", "8B"),
    "llama3-70b": ("llama3_70b", "70B"),
    "llama3.1-70b": ("llama3_70b", "70B"),
    "llama3.1-405b": ("llama3_405b", "405B"),
}
"""Model preset -> torchtitan's llama3 config-registry function (0.3) and flavor (0.2)."""


def _torchtitan_settings(p: Prediction) -> dict[str, dict[str, object]]:
    """Section -> key -> value, the fields both torchtitan releases share."""
    s, t = p.split, p.training
    # ZeRO-0 is DDP (replicate). FSDP2 shards gradients and optimizer state always; ZeRO-2 keeps the
    # gathered weights after forward (reshard "never"), ZeRO-3 frees them (reshard "always").
    shard, replicate = (1, s.dp) if s.zero == 0 else (s.dp, 1)
    parallelism: dict[str, object] = {
        "data_parallel_replicate_degree": replicate,
        "data_parallel_shard_degree": shard,
        "tensor_parallel_degree": s.tp,
        "context_parallel_degree": s.cp,
        "pipeline_parallel_degree": s.pp,
        "expert_parallel_degree": s.ep,
    }
    if s.zero > 0 and s.dp * s.cp > 1:
        parallelism["fsdp_reshard_after_forward"] = "always" if s.zero == 3 else "never"
    if s.pp > 1:
        layers = stage_layers(p.model.layers, s.pp)
        per = max(layers)
        parallelism["pipeline_parallel_schedule"] = "Interleaved1F1B" if s.vpp > 1 else "1F1B"
        parallelism["pipeline_parallel_microbatch_size"] = t.micro_batch
        # The embedding and the output layer count as the layers the first and last stage lack, so every
        # (virtual) stage holds layers_per_stage units and the stages are exactly `stage_layers`.
        parallelism["pipeline_parallel_layers_per_stage"] = per // s.vpp
        parallelism["pipeline_parallel_first_stage_less_layers"] = per - layers[0]
        parallelism["pipeline_parallel_last_stage_less_layers"] = per - layers[-1]
    # Without PP, local_batch_size is the micro-batch and torchtitan accumulates up to global_batch_size;
    # with PP the local batch is split into micro-batches of pipeline_parallel_microbatch_size.
    training: dict[str, object] = {
        "local_batch_size": t.global_batch // s.dp if s.pp > 1 else t.micro_batch,
        "global_batch_size": t.global_batch,
        "seq_len": t.seq_len,
        "mixed_precision_param": "bfloat16",
        "mixed_precision_reduce": "float32",
    }
    compiled = p.engine.name.endswith("compile") or p.engine.tp_overlap
    compile_: dict[str, object] = {"enable": compiled}
    if s.tp > 1:
        compile_["enable_async_tensor_parallel"] = p.engine.tp_overlap
    return {"parallelism": parallelism, "training": training, "compile": compile_}


def _torchtitan_notes(p: Prediction) -> list[str]:
    notes = []
    if p.training.dtype == "fp8":
        notes.append("fp8 linear layers: add torchtitan's Float8 converter to the model (timed as fp8 GEMMs)")
    if p.model.name not in TORCHTITAN_CONFIGS:
        notes.append(f"{p.model.name}: no torchtitan config of this shape; write one and name it in --config")
    return notes


def torchtitan_args(p: Prediction) -> list[str]:
    """The torchtitan 0.3 command-line arguments: the config-registry function and `--section.key` overrides."""
    _check(p, "torchtitan")
    config = TORCHTITAN_CONFIGS.get(p.model.name, ("YOUR_CONFIG", ""))[0]
    args = ["--module", "llama3", "--config", config]
    for section, body in _torchtitan_settings(p).items():
        for key, value in body.items():
            if isinstance(value, bool):
                args.append(f"--{section}.{key}" if value else f"--{section}.no_{key}")
            else:
                args += [f"--{section}.{key}", str(value)]
    args.append(f"--parallelism.{'' if p.split.sequence_parallel else 'no_'}enable_sequence_parallel")
    if p.split.pp > 1:  # 0.3's validation: CUDA graphs do not support pipeline parallelism
        args.append("--training.disable_cuda_graphs")
    recompute = {"none": "none", "op": "selective", "full": "full"}[p.training.recompute]
    args.append(f"activation-checkpoint:{recompute}")  # a tyro subcommand, so last
    return args


def emit_torchtitan(p: Prediction) -> str:
    """For torchtitan 0.3: a bash array of `torchtitan.train` arguments, `ConfigManager.parse_args` reads them."""
    args = torchtitan_args(p)
    return (
        _comment([*header(p, "torchtitan 0.3"), *_torchtitan_notes(p)])
        + _bash_array("TORCHTITAN_ARGS", args)
        + '# torchrun --nproc-per-node 8 ... -m torchtitan.train "${TORCHTITAN_ARGS[@]}"\n'
    )


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


def emit_torchtitan_02(p: Prediction) -> str:
    """The torchtitan 0.2.x job-config TOML (`--job.config_file`)."""
    _check(p, "torchtitan")
    sections = _torchtitan_settings(p)
    compile_ = sections.pop("compile")
    if "enable_async_tensor_parallel" in compile_:  # a [parallelism] key in 0.2
        sections["parallelism"]["enable_async_tensor_parallel"] = compile_.pop("enable_async_tensor_parallel")
    if p.split.cp > 1:  # 0.2 chooses how K/V travel: gathered whole, or passed round the ring
        sections["parallelism"]["context_parallel_rotate_method"] = (
            "allgather" if p.engine.cp_all_gather else "alltoall"
        )
    flavor = TORCHTITAN_CONFIGS.get(p.model.name, ("", "YOUR_FLAVOR"))[1]
    checkpoint: dict[str, object] = {"mode": "selective" if p.training.recompute == "op" else p.training.recompute}
    if p.training.recompute == "op":
        checkpoint["selective_ac_option"] = "op"
    body = {"model": {"name": "llama3", "flavor": flavor}, **sections}
    body["compile"] = compile_
    body["activation_checkpoint"] = checkpoint
    lines = []
    for name, values in body.items():
        lines.append(f"[{name}]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in values.items())
        lines.append("")
    return _comment([*header(p, "torchtitan 0.2"), *_torchtitan_notes(p)]) + "\n".join(lines)


# ------------------------------------------------------------------------------------------------ megatron


def _megatron_model_args(model: ModelSpec, seq_len: int) -> list[str]:
    """The model's shape as Megatron-LM arguments (the tokenizer, and so the vocabulary, is the user's)."""
    args = [
        "--num-layers",
        str(model.layers),
        "--hidden-size",
        str(model.hidden),
        "--ffn-hidden-size",
        str(model.ffn),
        "--num-attention-heads",
        str(model.heads),
        "--max-position-embeddings",
        str(max(seq_len, model.learned_positions)),
    ]
    if model.attention_head_dim is not None:
        args += ["--kv-channels", str(model.attention_head_dim)]
    if model.groups != model.heads:
        args += ["--group-query-attention", "--num-query-groups", str(model.groups)]
    if model.swiglu:
        args.append("--swiglu")
    if not model.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if not model.learned_positions:
        args += ["--position-embedding-type", "rope"]
    if not model.bias:
        args += ["--disable-bias-linear", "--normalization", "RMSNorm"]
    if not model.dropout:
        args += ["--attention-dropout", "0", "--hidden-dropout", "0"]
    if model.experts > 1:
        # timed as the all-to-all dispatcher (its bytes and collectives) and one grouped GEMM of the local experts
        args += ["--num-experts", str(model.experts), "--moe-router-topk", str(model.top_k)]
        args += ["--moe-token-dispatcher-type", "alltoall", "--moe-grouped-gemm"]
    return args


def megatron_args(p: Prediction) -> list[str]:
    """Megatron-LM command-line arguments for the split, its precision, overlaps and the model's shape."""
    _check(p, "megatron")
    s, t, e = p.split, p.training, p.engine
    args = [
        "--tensor-model-parallel-size",
        str(s.tp),
        "--pipeline-model-parallel-size",
        str(s.pp),
        "--context-parallel-size",
        str(s.cp),
        "--micro-batch-size",
        str(t.micro_batch),
        "--global-batch-size",
        str(t.global_batch),
        "--seq-length",
        str(t.seq_len),
        "--bf16",
    ]
    if t.dtype == "fp8":
        args += ["--fp8-format", "hybrid"]
    if t.grad_bytes == 2:
        args.append("--grad-reduce-in-bf16")
    if s.ep > 1:
        args += ["--expert-model-parallel-size", str(s.ep)]
    if s.etp is not None:
        args += ["--expert-tensor-parallel-size", str(s.etp)]
    if s.vpp > 1:
        args += ["--num-virtual-stages-per-pipeline-rank", str(s.vpp)]
    layers = stage_layers(p.model.layers, s.pp)
    if len(set(layers)) > 1:
        args += [
            "--decoder-first-pipeline-num-layers",
            str(layers[0]),
            "--decoder-last-pipeline-num-layers",
            str(layers[-1]),
        ]
    if s.sequence_parallel:
        args.append("--sequence-parallel")
    if e.tp_overlap and s.tp > 1:
        args.append("--tp-comm-overlap")
    if e.pp_overlap and s.vpp > 1:
        args.append("--overlap-p2p-communication")
    if s.zero == 3:
        args.append("--use-torch-fsdp2")
    elif s.zero == 1 and s.dp * s.cp > 1:
        args.append("--use-distributed-optimizer")
        if e.dp_overlap:
            args.append("--overlap-param-gather")
    if s.dp * s.cp > 1 and e.dp_overlap:
        args.append("--overlap-grad-reduce")
    if not e.flash_attention:
        args += ["--attention-backend", "unfused"]
    else:
        args += ["--attention-backend", "fused" if e.attention_kernel in ("fa3", "cudnn") else "flash"]
    if t.recompute == "selective":
        args += ["--recompute-granularity", "selective"]
    elif t.recompute == "full":
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    return args + _megatron_model_args(p.model, t.seq_len)


def megatron_environment(p: Prediction) -> dict[str, str | None]:
    """Environment Megatron-LM's `validate_args` requires of the split (None: must be unset).

    Before Blackwell, TP or CP needs CUDA_DEVICE_MAX_CONNECTIONS=1 (kernels queued in issue order, so the
    communication overlaps as timed); torch FSDP2 needs it unset or above 1.
    """
    s = p.split
    if s.zero == 3:
        return {"CUDA_DEVICE_MAX_CONNECTIONS": None}
    if (s.tp > 1 or s.cp > 1) and p.device.arch != "blackwell":
        return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    return {}


def emit_megatron(p: Prediction) -> str:
    """Megatron-LM: the environment it needs and a bash array of its arguments, for `pretrain_gpt.py`."""
    args = megatron_args(p)
    env = "".join(f"export {k}={v}\n" if v is not None else f"unset {k}\n" for k, v in megatron_environment(p).items())
    return (
        _comment(header(p, "Megatron-LM"))
        + env
        + _bash_array("MEGATRON_ARGS", args)
        + f'# WORLD_SIZE={p.gpus}: torchrun ... pretrain_gpt.py "${{MEGATRON_ARGS[@]}}" plus tokenizer and data\n'
    )


# ----------------------------------------------------------------------------------------------- deepspeed


def deepspeed_config(p: Prediction) -> dict:
    """DeepSpeed config: batch sizes over the data-parallel ranks, precision, ZeRO stage and overlap, AutoTP."""
    _check(p, "deepspeed")
    s, t = p.split, p.training
    m = t.global_batch // (t.micro_batch * s.dp)
    config: dict = {
        "train_batch_size": t.global_batch,
        "train_micro_batch_size_per_gpu": t.micro_batch,
        "gradient_accumulation_steps": m,
        "bf16": {"enabled": True},
        "data_types": {"grad_accum_dtype": "fp32" if t.grad_bytes == 4 else "bf16"},
        "zero_optimization": {"stage": s.zero, "overlap_comm": p.engine.dp_overlap},
    }
    if s.tp > 1:
        config["tensor_parallel"] = {"autotp_size": s.tp}
    if t.recompute != "none":
        config["activation_checkpointing"] = {
            "partition_activations": s.tp > 1,
            "contiguous_memory_optimization": False,
        }
    return config


def deepspeed_notes(p: Prediction) -> list[str]:
    """What DeepSpeed takes from user code, not from its JSON, that the prediction assumed."""
    s, t = p.split, p.training
    notes = [
        f"DeepSpeedConfig's world size is the data-parallel degree, {s.dp}: "
        f"{t.global_batch} = {t.micro_batch} x {t.global_batch // (t.micro_batch * s.dp)} x {s.dp}",
    ]
    if s.pp > 1:
        interval = 1 if t.recompute == "full" else 0
        notes.append(
            f"code: PipelineModule(layers, num_stages={s.pp}, partition_method='uniform',"
            f" activation_checkpoint_interval={interval}) (the JSON's pipeline section sets no stages)"
        )
    elif t.recompute == "full":
        notes.append("code: checkpoint every transformer block (deepspeed.checkpointing.checkpoint per layer)")
    if s.tp > 1:
        notes.append(f"code: deepspeed.initialize builds the AutoTP groups from tensor_parallel.autotp_size={s.tp}")
    if t.dtype == "fp8":
        notes.append("fp8 linear layers: Transformer Engine modules in the model code (timed as fp8 GEMMs)")
    return notes


def emit_deepspeed(p: Prediction) -> str:
    """DeepSpeed JSON with comment lines first (DeepSpeed reads config files as hjson, which allows them)."""
    body = orjson.dumps(deepspeed_config(p), option=orjson.OPT_INDENT_2).decode()
    return _comment([*header(p, "DeepSpeed"), *deepspeed_notes(p)]) + body + "\n"


def emit(p: Prediction, engine: str) -> str:
    """The split as `engine`'s settings (one of `ENGINES`)."""
    emitters = {
        "torchtitan": emit_torchtitan,
        "torchtitan-0.2": emit_torchtitan_02,
        "megatron": emit_megatron,
        "deepspeed": emit_deepspeed,
    }
    if engine not in emitters:
        msg = f"unknown engine {engine!r}\n\nHint: one of {', '.join(ENGINES)}"
        raise SpecError(msg)
    return emitters[engine](p)
