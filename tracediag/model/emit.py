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
    from tracediag.model.specs import ModelSpec, Split

ENGINES = ("torchtitan", "megatron", "deepspeed")


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
    if mode in _RECOMPUTE.get(target, ()):
        return None
    return f"{target} has no recompute mode {mode!r} (it has {', '.join(_RECOMPUTE.get(target, ()))})"


def _check(p: Prediction, target: str) -> None:
    why = unsupported(target, p.model, p.split) or unsupported_recompute(target, p.training.recompute)
    if why:
        msg = f"{why}\n\nHint: `tracediag plan --emit {target}` proposes only splits {target} can run"
        raise SpecError(msg)


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


def emit_torchtitan(p: Prediction) -> str:
    """Torchtitan job-config TOML: `[parallelism]`, `[training]`, `[activation_checkpoint]`."""
    _check(p, "torchtitan")
    s, t = p.split, p.training
    per_replica = t.global_batch // s.dp
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
    # Without PP, local_batch_size is the micro-batch and torchtitan accumulates up to global_batch_size.
    training = {
        "local_batch_size": per_replica if s.pp > 1 else t.micro_batch,
        "global_batch_size": t.global_batch,
        "seq_len": t.seq_len,
    }
    checkpoint: dict[str, object] = {"mode": "selective" if t.recompute == "op" else t.recompute}
    if t.recompute == "op":
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
    _check(p, "megatron")
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
    elif s.zero == 1 and s.dp * s.cp > 1:
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
    _check(p, "deepspeed")
    s, t = p.split, p.training
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
