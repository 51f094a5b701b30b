"""A split as the engine settings that run it: torchtitan TOML, Megatron-LM arguments, DeepSpeed JSON.

Key names were checked against each engine's sources: torchtitan `config/job_config.py` (`[parallelism]`,
`[training]`, `[activation_checkpoint]`), Megatron-LM `megatron/training/arguments.py`, DeepSpeed
`runtime/config.py` (`get_pipeline_config`), `runtime/zero/config.py` and the AutoTP training docs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

from tracediag.errors import SpecError
from tracediag.model.specs import stage_layers

if TYPE_CHECKING:
    from tracediag.model.predict import Prediction

ENGINES = ("torchtitan", "megatron", "deepspeed")


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


def emit_torchtitan(p: Prediction) -> str:
    """torchtitan job-config TOML: `[parallelism]`, `[training]`, `[activation_checkpoint]`."""
    s, t = p.split, p.training
    per_replica = t.global_batch // s.dp
    # ZeRO-0 is DDP (replicate). FSDP2 shards gradients and optimizer state always; ZeRO-1/2 keep the
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
    if s.zero > 0 and s.dp > 1:
        parallelism["fsdp_reshard_after_forward"] = "always" if s.zero == 3 else "never"
    if s.pp > 1:
        parallelism["pipeline_parallel_schedule"] = "Interleaved1F1B" if s.vpp > 1 else "1F1B"
        parallelism["pipeline_parallel_microbatch_size"] = t.micro_batch
        if s.vpp > 1:
            parallelism["pipeline_parallel_layers_per_stage"] = -(-p.model.layers // (s.pp * s.vpp))
    # Without PP, local_batch_size is the micro-batch and torchtitan accumulates up to global_batch_size.
    training = {
        "local_batch_size": per_replica if s.pp > 1 else t.micro_batch,
        "global_batch_size": t.global_batch,
        "seq_len": t.seq_len,
    }
    checkpoint: dict[str, object] = {"mode": t.recompute}
    if t.recompute == "selective":
        checkpoint["selective_ac_option"] = "op"
    sections = {"parallelism": parallelism, "training": training, "activation_checkpoint": checkpoint}
    lines = []
    for name, body in sections.items():
        lines.append(f"[{name}]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in body.items())
        lines.append("")
    return "\n".join(lines)


def megatron_args(p: Prediction) -> list[str]:
    """Megatron-LM command-line arguments for the split (model-shape arguments are left to the user)."""
    s, t = p.split, p.training
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
    ]
    if s.ep > 1:
        args += ["--expert-model-parallel-size", str(s.ep)]
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
    if s.zero == 3:
        args.append("--use-torch-fsdp2")
    elif s.zero >= 1:
        args += ["--use-distributed-optimizer", "--overlap-param-gather"]
    if s.dp * s.cp > 1:
        args.append("--overlap-grad-reduce")
    if t.recompute == "selective":
        args += ["--recompute-granularity", "selective"]
    elif t.recompute == "full":
        args += [
            "--recompute-granularity",
            "full",
            "--recompute-method",
            "uniform",
            "--recompute-num-layers",
            "1",
        ]
    return args


def emit_megatron(p: Prediction) -> str:
    """Megatron-LM arguments, one `--flag value` per line, ready to paste into a launch script."""
    args = megatron_args(p)
    lines, i = [], 0
    while i < len(args):
        has_value = i + 1 < len(args) and not args[i + 1].startswith("--")
        lines.append(f"{args[i]} {args[i + 1]}" if has_value else args[i])
        i += 2 if has_value else 1
    return " \\\n".join(lines) + "\n"


def deepspeed_config(p: Prediction) -> dict:
    """DeepSpeed config: batch sizes, ZeRO stage, AutoTP, pipeline stages, Ulysses sequence parallel."""
    s, t = p.split, p.training
    if s.pp > 1 and s.zero >= 2:
        msg = (
            f"DeepSpeed's pipeline engine supports ZeRO stage 0 or 1 only, the split has pp={s.pp} and "
            f"zero={s.zero}\n\nHint: emit this split for torchtitan or megatron"
        )
        raise SpecError(msg)
    m = t.global_batch // (t.micro_batch * s.dp)
    config: dict = {
        "train_batch_size": t.global_batch,
        "train_micro_batch_size_per_gpu": t.micro_batch,
        "gradient_accumulation_steps": m,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": s.zero, "overlap_comm": True},
    }
    if s.tp > 1:
        config["tensor_parallel"] = {"autotp_size": s.tp}
    if s.cp > 1:
        config["sequence_parallel_size"] = s.cp
    if s.pp > 1:
        config["pipeline"] = {
            "stages": s.pp,
            "partition": "uniform",
            "activation_checkpoint_interval": 1 if t.recompute == "full" else 0,
        }
    if t.recompute != "none":
        config["activation_checkpointing"] = {
            "partition_activations": s.tp > 1,
            "contiguous_memory_optimization": False,
        }
    return config


def emit_deepspeed(p: Prediction) -> str:
    """DeepSpeed JSON config text."""
    return orjson.dumps(deepspeed_config(p), option=orjson.OPT_INDENT_2).decode() + "\n"


def emit(p: Prediction, engine: str) -> str:
    """The split as `engine`'s settings (torchtitan, megatron or deepspeed)."""
    emitters = {"torchtitan": emit_torchtitan, "megatron": emit_megatron, "deepspeed": emit_deepspeed}
    if engine not in emitters:
        msg = f"unknown engine {engine!r}\n\nHint: one of {', '.join(ENGINES)}"
        raise SpecError(msg)
    return emitters[engine](p)
