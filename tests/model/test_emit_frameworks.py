"""Issue 28 item 4: emitted settings load in each framework's own parser and read back as the plan.

The parsers run in a subprocess of a Python that has the frameworks (`.ci/run` builds one against torch 2.13):
TRACEDIAG_FRAMEWORK_PYTHON (torchtitan 0.3, DeepSpeed), TRACEDIAG_TORCHTITAN_02 (a folder holding torchtitan
0.2.x, put first on its path) and TRACEDIAG_MEGATRON_LM (a Megatron-LM checkout: `megatron.training` ships in
its repository only, not in the megatron-core wheel). Each test skips, saying which, where one is missing.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import orjson
import pytest

from tracediag.cli.model import EMIT_ENGINE
from tracediag.model.emit import emit, megatron_environment
from tracediag.model.plan import plan
from tracediag.model.predict import Prediction, predict
from tracediag.model.specs import MODELS, Split, Training, resolve_device
from tracediag.model.stack import resolve_engine


def _python() -> str:
    python = os.environ.get("TRACEDIAG_FRAMEWORK_PYTHON", "")
    if not python or not Path(python).exists():
        pytest.skip("TRACEDIAG_FRAMEWORK_PYTHON (a Python with torchtitan 0.3 and DeepSpeed) is not set")
    return python


def _folder(var: str, what: str) -> str:
    folder = os.environ.get(var, "")
    if not folder or not Path(folder).is_dir():
        pytest.skip(f"{var} ({what}) is not set")
    return folder


def _planned(target: str, model: str, gpus: int, global_batch: int) -> Prediction:
    """The split `plan --emit target` prints: the best one the target runs, timed with its profile."""
    engine = resolve_engine(EMIT_ENGINE[target])
    found = plan(
        MODELS[model](),
        resolve_device("h100-sxm"),
        engine,
        gpus=gpus,
        seq_len=8192,
        global_batch=global_batch,
        target=target,
    )
    return found.ranked[0].prediction


def _fixed(target: str, split: Split, recompute: str, micro_batch: int = 1) -> Prediction:
    train = Training(seq_len=4096, global_batch=256, micro_batch=micro_batch, recompute=recompute)
    engine = resolve_engine(EMIT_ENGINE[target])
    return predict(MODELS["llama3.1-70b"](), resolve_device("h100-sxm"), split, train, engine)


CASES = {
    "8b-8gpu": lambda t: _planned(t, "llama3.1-8b", 8, 32),
    "70b-64gpu": lambda t: _planned(t, "llama3.1-70b", 64, 256),
}
"""Dev-set models as `plan --emit` chooses their split on H100s."""


def _run(args: list[str], *, env: dict[str, str] | None = None) -> dict:
    done = subprocess.run(
        args, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})}, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return orjson.loads(done.stdout.strip().splitlines()[-1])


TORCHTITAN_03 = """
import json, sys
from torchtitan.config.manager import ConfigManager
c = ConfigManager().parse_args(sys.argv[1:])
p, t = c.parallelism, c.training
print(json.dumps({
    "dp": p.data_parallel_shard_degree * p.data_parallel_replicate_degree, "tp": p.tensor_parallel_degree,
    "pp": p.pipeline_parallel_degree, "cp": p.context_parallel_degree, "ep": p.expert_parallel_degree,
    "replicate": p.data_parallel_replicate_degree, "reshard": p.fsdp_reshard_after_forward,
    "schedule": p.pipeline_parallel_schedule, "pp_micro_batch": p.pipeline_parallel_microbatch_size,
    "local_batch": t.local_batch_size, "global_batch": t.global_batch_size, "seq_len": t.seq_len,
    "param_dtype": t.mixed_precision_param, "sequence_parallel": p.enable_sequence_parallel,
    "async_tp": c.compile.enable_async_tensor_parallel, "compile": c.compile.enable,
    "recompute": type(c.activation_checkpoint).__qualname__,
}))
"""


def _torchtitan_expected(p: Prediction) -> dict:
    s, t = p.split, p.training
    return {
        "dp": s.dp,
        "tp": s.tp,
        "pp": s.pp,
        "cp": s.cp,
        "ep": s.ep,
        "replicate": s.dp if s.zero == 0 else 1,
        "local_batch": t.global_batch // s.dp if s.pp > 1 else t.micro_batch,
        "global_batch": t.global_batch,
        "seq_len": t.seq_len,
        "param_dtype": "bfloat16",
        "async_tp": p.engine.tp_overlap,
    }


@pytest.mark.parametrize("case", list(CASES))
def test_torchtitan_03_config_manager_reads_the_plan(case, tmp_path):
    python = _python()
    p = CASES[case]("torchtitan")
    script = tmp_path / "args.sh"
    script.write_text(emit(p, "torchtitan"))
    probe = tmp_path / "probe.py"
    probe.write_text(TORCHTITAN_03)
    got = _run(["bash", "-c", f'source {script} && exec {python} {probe} "${{TORCHTITAN_ARGS[@]}}"'])
    assert {k: got[k] for k in _torchtitan_expected(p)} == _torchtitan_expected(p)
    assert (
        got["recompute"]
        == {"none": "NoneType", "full": "FullAC.Config", "op": "SelectiveAC.Config"}[p.training.recompute]
    )
    if p.split.zero in (2, 3) and p.split.dp * p.split.cp > 1:
        assert got["reshard"] == ("always" if p.split.zero == 3 else "never")
    if p.split.pp > 1:
        assert got["pp_micro_batch"] == p.training.micro_batch
        assert got["schedule"] == ("Interleaved1F1B" if p.split.vpp > 1 else "1F1B")
    assert got["sequence_parallel"] is p.split.sequence_parallel


TORCHTITAN_02 = """
import json, sys
from torchtitan.config.manager import ConfigManager
c = ConfigManager().parse_args(["--job.config_file", sys.argv[1]])
p, t = c.parallelism, c.training
print(json.dumps({
    "dp": p.data_parallel_shard_degree * p.data_parallel_replicate_degree, "tp": p.tensor_parallel_degree,
    "pp": p.pipeline_parallel_degree, "cp": p.context_parallel_degree, "ep": p.expert_parallel_degree,
    "replicate": p.data_parallel_replicate_degree, "local_batch": t.local_batch_size,
    "global_batch": t.global_batch_size, "seq_len": t.seq_len, "param_dtype": t.mixed_precision_param,
    "async_tp": p.enable_async_tensor_parallel, "flavor": c.model.flavor, "recompute": c.activation_checkpoint.mode,
}))
"""


@pytest.mark.parametrize("case", list(CASES))
def test_torchtitan_02_toml_reads_the_plan(case, tmp_path):
    python = _python()
    folder = _folder("TRACEDIAG_TORCHTITAN_02", "a folder holding torchtitan 0.2.x")
    p = CASES[case]("torchtitan-0.2")
    toml = tmp_path / "job.toml"
    toml.write_text(emit(p, "torchtitan-0.2"))
    probe = tmp_path / "probe.py"
    probe.write_text(TORCHTITAN_02)
    got = _run([python, str(probe), str(toml)], env={"PYTHONPATH": folder})
    assert {k: got[k] for k in _torchtitan_expected(p)} == _torchtitan_expected(p)
    assert got["flavor"] == {"llama3.1-8b": "8B", "llama3.1-70b": "70B"}[p.model.name]
    assert got["recompute"] == p.training.recompute


MEGATRON = """
import json, os, sys
import megatron.training.arguments as arguments
arguments.get_device_arch_version = lambda: int(os.environ["PLAN_ARCH"])  # the plan's GPU; this host has none
sys.argv = ["pretrain_gpt.py", *sys.argv[1:]]
a = arguments.parse_args()
arguments.validate_args(a)
keys = ["tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
        "data_parallel_size", "micro_batch_size", "global_batch_size", "seq_length", "bf16", "tp_comm_overlap",
        "sequence_parallel", "use_distributed_optimizer", "overlap_grad_reduce", "overlap_param_gather",
        "recompute_granularity", "virtual_pipeline_model_parallel_size", "num_layers", "num_query_groups"]
print(json.dumps({k: getattr(a, k, None) for k in keys} | {"params_dtype": str(a.params_dtype)}))
"""

ARCH = {"ampere": 8, "hopper": 9, "blackwell": 10}


@pytest.mark.parametrize("case", [*CASES, "full-recompute-vpp"])
def test_megatron_parse_and_validate_args_read_the_plan(case, tmp_path):
    python = _python()
    checkout = _folder("TRACEDIAG_MEGATRON_LM", "a Megatron-LM checkout; not on the package index")
    if case in CASES:
        p = CASES[case]("megatron")
    else:
        p = _fixed("megatron", Split(tp=4, pp=4, vpp=2, dp=4, zero=1, sequence_parallel=True), "full")
    script = tmp_path / "megatron.sh"
    script.write_text(emit(p, "megatron"))
    probe = tmp_path / "probe.py"
    probe.write_text(MEGATRON)
    env = {"PYTHONPATH": checkout, "WORLD_SIZE": str(p.gpus), "PLAN_ARCH": str(ARCH[p.device.arch])}
    # Only what the emitted file exports reaches validate_args.
    run = f'source {script} && exec {python} {probe} "${{MEGATRON_ARGS[@]}}"'
    got = _run(["env", "-u", "CUDA_DEVICE_MAX_CONNECTIONS", "bash", "-c", run], env=env)
    s, t = p.split, p.training
    assert got == {
        "tensor_model_parallel_size": s.tp,
        "pipeline_model_parallel_size": s.pp,
        "context_parallel_size": s.cp,
        "data_parallel_size": s.dp,
        "micro_batch_size": t.micro_batch,
        "global_batch_size": t.global_batch,
        "seq_length": t.seq_len,
        "bf16": True,
        "params_dtype": "torch.bfloat16",
        "tp_comm_overlap": p.engine.tp_overlap and s.tp > 1,
        "sequence_parallel": s.sequence_parallel,
        "use_distributed_optimizer": s.zero == 1 and s.dp * s.cp > 1,
        "overlap_grad_reduce": s.dp * s.cp > 1 and p.engine.dp_overlap,
        "overlap_param_gather": s.zero == 1 and s.dp * s.cp > 1 and p.engine.dp_overlap,
        "recompute_granularity": None if t.recompute == "none" else t.recompute,
        "virtual_pipeline_model_parallel_size": s.vpp if s.vpp > 1 else None,
        "num_layers": p.model.layers,
        "num_query_groups": p.model.groups,
    }


def test_megatron_environment_is_what_its_validation_requires():
    tp = _fixed("megatron", Split(tp=8, pp=2, dp=4, zero=1, sequence_parallel=True), "none")
    assert megatron_environment(tp) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1\n" in emit(tp, "megatron")
    fsdp = _fixed("megatron", Split(tp=1, pp=1, dp=64, zero=3), "full")
    assert megatron_environment(fsdp) == {"CUDA_DEVICE_MAX_CONNECTIONS": None}
    assert megatron_environment(_fixed("megatron", Split(dp=64, zero=1), "full")) == {}


DEEPSPEED = """
import json, os, socket, sys
import deepspeed.comm
from deepspeed.runtime.config import DeepSpeedConfig
with socket.socket() as s:  # one process on loopback: DeepSpeed reads the world size only once it has one
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
deepspeed.comm.init_distributed("gloo", auto_mpi_discovery=False)
class Mesh:  # the data-parallel group DeepSpeed's engine hands its config (pipeline grid or AutoTP groups)
    def get_data_parallel_world_size(self):
        return int(sys.argv[2])
c = DeepSpeedConfig(sys.argv[1], mpu=Mesh())
print(json.dumps({
    "world_size": c.world_size, "train_batch_size": c.train_batch_size,
    "micro_batch": c.train_micro_batch_size_per_gpu, "accumulation": c.gradient_accumulation_steps,
    "bf16": c.bfloat16_config.enabled if hasattr(c, "bfloat16_config") else c.bfloat16_enabled,
    "zero": c.zero_optimization_stage, "overlap_comm": c.zero_config.overlap_comm,
    "autotp": c.tensor_parallel_config.autotp_size, "grad_accum_dtype": str(c.grad_accum_dtype),
    "checkpointing": c.activation_checkpointing_config.partition_activations,
}))
"""


@pytest.mark.parametrize("case", [*CASES, "pipeline-full-recompute"])
def test_deepspeed_config_reads_the_plan(case, tmp_path):
    python = _python()
    p = CASES[case]("deepspeed") if case in CASES else _fixed("deepspeed", Split(pp=4, dp=16, zero=1), "full", 2)
    path = tmp_path / "ds_config.json"
    path.write_text(emit(p, "deepspeed"))  # comment lines first: DeepSpeed reads the file as hjson
    probe = tmp_path / "probe.py"
    probe.write_text(DEEPSPEED)
    got = _run([python, str(probe), str(path), str(p.split.dp)])
    s, t = p.split, p.training
    assert got == {
        "world_size": s.dp,
        "train_batch_size": t.global_batch,
        "micro_batch": t.micro_batch,
        "accumulation": t.global_batch // (t.micro_batch * s.dp),
        "bf16": True,
        "zero": s.zero,
        "overlap_comm": p.engine.dp_overlap,
        "autotp": s.tp if s.tp > 1 else got["autotp"],
        "grad_accum_dtype": "fp32" if t.grad_bytes == 4 else "bf16",
        "checkpointing": t.recompute != "none" and s.tp > 1,
    }
    if s.pp > 1:
        assert f"num_stages={s.pp}" in emit(p, "deepspeed")
