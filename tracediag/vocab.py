"""The names traces use, in one place: collectives, step markers, device categories and ranks.

Every reader (Kineto, Nsight Systems, JAX) maps a name through these tables, so one NCCL kernel,
`nccl:*` annotation, `record_param_comms` name, gloo op or HLO collective means one `coll_op`
whichever profiler recorded it (trace-formats.md §2–4).
"""

from __future__ import annotations

import polars as pl

from tracediag.errors import RankError, shown

COMM_KERNEL = (
    r"(?i)^(?:void\s+)?(?:nccl|rccl)"  # NCCL/RCCL kernels and API ranges
    r"|(?:^|[\s:<(])(?:deep_?ep|dpsk::ep)::"  # DeepEP: `deep_ep::internode::dispatch`, `dpsk::ep::intranode::combine`
    r"|nvshmem"  # NVSHMEM kernels (`nvshmemi_*`, `nvshmem_*_on_stream_kernel`)
    r"|cross_device_reduce|custom_?all_?reduce|(?:one|two)_?shot_?all_?reduce|multimem_?all_?reduce"
    r"|lamport_?all_?reduce|all_?reduce_?fusion"  # custom all-reduce (vLLM, SGLang, TRT-LLM, symmetric memory)
    r"|userbuffers|\bmscclpp"  # Transformer Engine userbuffers, MSCCL++
)
"""Communication kernels (and NCCL/RCCL API ranges) by name: NCCL/RCCL of every naming generation
(`ncclKernel_AllReduce_…`, `ncclDevKernel_SendRecv`, `ncclAllReduceRingLLKernel_sum_f32`, `ncclAllGather`) and
the libraries that move data without NCCL: DeepEP's expert-parallel `dispatch`/`combine` (intranode, internode,
low-latency `internode_ll`), NVSHMEM, the custom all-reduce kernels of vLLM/SGLang (`cross_device_reduce_1stage`),
TensorRT-LLM (`oneShotAllReduceKernel`, `allreduce_fusion_kernel…`) and PyTorch symmetric memory
(`one_shot_all_reduce_kernel`, `multimem_all_reduce_kernel`), Transformer Engine userbuffers, MSCCL++.
`--comm-kernel REGEX` adds what this does not know (`comm_kernel_rule`)."""
COLLECTIVE_PREFIX = r"^(?:gloo:|nccl:|c10d::)"
"""Host rows named after the collective they run: gloo/nccl annotations and c10d ops."""
HOST_COLLECTIVE = r"^(?:gloo:|nccl:|c10d::|record_param_comms$)"
"""Host rows of the PyTorch profiler that describe one collective call: the above and
`record_param_comms` (whose `Collective name` arg names the collective)."""
COLLECTIVE_ROW = r"^(?:gloo:|c10d::|nccl:|record_param_comms|(?i:nccl|rccl))"
"""Any row whose `args` may describe a collective (host rows above and communication kernels)."""
HOST_COMM_OP = (
    r"^(?:c10d::|c10d_functional::|_c10d_functional::|record_param_comms|nccl:|gloo:)|^(?:aten::)?wait(?:_tensor)?$"
)
"""Host operators that communicate or wait for communication (never compute)."""

STEP_MARKER = r"^ProfilerStep#\d+$"
"""Host annotations (Kineto) and NVTX ranges (Nsight) that mark one training step."""
STEP_NUMBER = r"^(?:ProfilerStep|train)#(\d+)$"
"""Step rows and their number: `ProfilerStep#N` (Kineto, Nsight) or `train#N` (JAX `step_num`)."""

DEVICE_CATS: tuple[str, ...] = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync")
"""Chrome-trace categories of rows on a device timeline (pid = device, tid = stream)."""
KINETO_CATS: tuple[str, ...] = (
    "cpu_op", "user_annotation", "gpu_user_annotation", "kernel", "cuda_runtime", "cuda_driver",
    "gpu_memcpy", "gpu_memset", "cuda_sync", "python_function",
)  # fmt: skip
"""The Kineto categories tracediag reads, as Kineto has written them since PyTorch 1.10."""
CATEGORY_ALIASES: dict[str, str] = {
    "operator": "cpu_op",
    "runtime": "cuda_runtime",
    "driver": "cuda_driver",
    "memcpy": "gpu_memcpy",
    "memset": "gpu_memset",
    "python": "python_function",
}
"""Older spellings (lower-cased) of `KINETO_CATS`: the 2021 layout (PyTorch 1.8-1.9) writes `Operator`
(host operators, `ProfilerStep#N` included), `Kernel`, `Runtime`, `Memcpy`, `Memset`."""


def category(cat: pl.Expr) -> pl.Expr:
    """`canonical_category` as an expression (on the few distinct categories or (category, name) pairs,
    never per row where that can be avoided: it is a string operation)."""
    low = cat.cast(pl.String).str.to_lowercase()
    known = low.is_in(KINETO_CATS) | low.is_in(list(CATEGORY_ALIASES))
    return pl.when(known).then(low.replace(CATEGORY_ALIASES)).otherwise(cat.cast(pl.String))


def canonical_category(cat: str) -> str:
    """A Kineto category as `KINETO_CATS` spells it: matched without regard to case, older names by
    `CATEGORY_ALIASES`; any other category unchanged (`Kernel` -> `kernel`, `Operator` -> `cpu_op`,
    `Trace` -> `Trace`)."""
    low = cat.lower()
    if low in KINETO_CATS:
        return low
    return CATEGORY_ALIASES.get(low, cat)


OP_RULES: tuple[tuple[str, str], ...] = (
    ("sendrecv", "other"),  # one kernel moving both ways: no single direction
    ("allreduce", "all_reduce"),
    ("crossdevicereduce", "all_reduce"),  # vLLM/SGLang custom all-reduce
    ("allgather", "all_gather"),
    ("reducescatter", "reduce_scatter"),
    ("alltoall", "all_to_all"),
    ("dispatch", "all_to_all"),  # DeepEP (MoE expert parallelism): tokens to their experts' ranks
    ("combine", "all_to_all"),  # and back
    ("broadcast", "broadcast"),
    ("bcast", "broadcast"),
    ("barrier", "barrier"),
    ("send", "send"),
    ("recv", "recv"),
    ("reduce", "reduce"),
    ("gather", "gather"),
    ("scatter", "scatter"),
    ("coalesced", "coalesced"),
)
"""Collective text normalised (lower case, letters only) -> `coll_op`; the first rule whose text
the name contains wins, so `allreduce` comes before `reduce`."""

HLO_COLLECTIVES: dict[str, str] = {
    "all-reduce": "all_reduce", "psum": "all_reduce", "pmean": "all_reduce", "pmax": "all_reduce",
    "pmin": "all_reduce", "cross-replica-sum": "all_reduce",
    "all-gather": "all_gather",
    "reduce-scatter": "reduce_scatter", "psum-scatter": "reduce_scatter",
    "all-to-all": "all_to_all",
    "collective-broadcast": "broadcast",
    "collective-permute": "other", "ppermute": "other",
    "send": "send", "recv": "recv",
}  # fmt: skip
"""HLO op stem (lower case, `_` as `-`, no `.N`, no `-start`/`-done`) -> coll_op. Exact stems only:
`broadcast_multiply_fusion` or `wrapped_reduce` are compute, not collectives."""


def coll_op(text: pl.Expr, *, default: str | None = "other") -> pl.Expr:
    """The `coll_op` of collective text (`ncclDevKernel_AllReduce_Sum_f32`, `nccl:_reduce_scatter_base`,
    `allreduce`, `gloo:broadcast`); `default` when no rule matches, null when the text is null.

    All rule texts are found in one pass (Aho-Corasick, overlapping so `reduce` inside `allreduce`
    counts too) and the lowest rule wins: one normalisation, not one per rule.
    """
    norm = text.str.to_lowercase().str.replace_all(r"[^a-z]", "")
    needles = [needle for needle, _ in OP_RULES]
    first = (
        norm.str.extract_many(needles, overlapping=True)
        .list.eval(pl.element().replace_strict(needles, range(len(needles)), return_dtype=pl.UInt32))
        .list.min()
    )
    op = first.replace_strict(range(len(OP_RULES)), [op for _, op in OP_RULES], default=None, return_dtype=pl.String)
    return pl.when(text.is_null()).then(None).otherwise(op.fill_null(pl.lit(default, pl.String)))


def hlo_stem(text: pl.Expr) -> pl.Expr:
    """`all-reduce-start.3` / `all_gather.7` / `psum.2` -> `all-reduce` / `all-gather` / `psum`."""
    base = text.str.to_lowercase().str.replace(r"\.\d+$", "").str.replace_all("_", "-")
    return base.str.replace(r"-(?:start|done)$", "")


def hlo_coll_op(text: pl.Expr) -> pl.Expr:
    """The `coll_op` of an HLO op name by its exact stem (null when it is not a collective)."""
    return hlo_stem(text).replace_strict(HLO_COLLECTIVES, default=None, return_dtype=pl.String)


def resolve_rank(
    path: str,
    *,
    given: int | None,
    named: tuple[int, ...],
    source: str,
    default: int | None,
    missing: str,
    warnings: list[str],
) -> int:
    """The rank of one file, decided the same way for every format.

    `given` (from the user) wins, with a warning when the file names another; else the one rank
    the file `named` (`source`: where, e.g. ``RANK``); else `default` (a single-file run) with a
    warning. No rank, or several, is a `RankError` naming the file, the problem (`missing` says
    where the rank was looked for) and the options that fix it.
    """
    fix = "give it with --rank-from-filename REGEX or --rank FILE=N"
    says = ", ".join(f"{source}={r}" for r in named)
    if given is not None:
        if named and named != (given,):
            warnings.append(f"the file says {says}; using rank {given} as given")
        return given
    if len(named) > 1:
        raise RankError(f"{shown(path)}: the file names several ranks ({says}); export one file per rank or {fix}")
    if named:
        return named[0]
    if default is None:
        raise RankError(f"{shown(path)}: the file names no rank ({missing}); {fix}")
    warnings.append(f"the file names no rank; taken as rank {default}")
    return default


GC_OP = r"(?i)^python gc|\bgc\b|gc\.collect|gc_collect|gc[_ ]pause|garbage.?collect"
"""Host rows of a garbage-collection pause: the profiler's ``Python GC`` events
(``record_python_gc_info``), ``gc.collect`` annotations, a framework's ``gc``/``garbage_collect`` ranges."""
SYNC_OP = r"(?i)synchronize"
"""Host rows that block until a device catches up: ``cudaDeviceSynchronize``, ``cudaStreamSynchronize``,
``cudaEventSynchronize``, ``torch.cuda.synchronize`` annotations, the HIP equivalents."""
CHECKPOINT_OP = (
    r"(?i)^checkpoint$|torch\.save|save_checkpoint|checkpoint(?:ing)?[._: ]?(?:save|write)"
    r"|(?:save|write)[._ ]?checkpoint|\bdcp[._]|log_metrics|wandb|summarywriter|tensorboard"
)
"""Host rows of a checkpoint or logging write (``torch.save``, ``save_checkpoint``, ``dcp.save``, metric
loggers). Activation checkpointing (``CheckpointFunction``, recompute) is compute and does not match."""

TIMELINE_COMM = (
    r"(?i)^(?:nccl|rccl|gloo:|nccl:|c10d::)"
    r"|(?:^|[^a-z])(?:all[-_ ]?reduce|all[-_ ]?gather|reduce[-_ ]?scatter|all[-_ ]?to[-_ ]?allv?|broadcast"
    r"|i?send|i?recv)(?:$|[^a-z])"
)
"""Op-timeline rows (`ingest.timeline`) named as communication when the table gives no `kind`: the
kernels and host ranges above, or a name with a collective or point-to-point word of its own
(`forward-send`, `backward-recv`, `grads-all-reduce`, `allgather_params`); its `coll_op` comes
from `coll_op`."""
TIMELINE_DATA = r"(?i)dataloader|data[-_ ]?load|batch[-_ ]?generator|get[-_ ]?batch"
"""Op-timeline rows named as data loading when the table gives no `kind` (`DataLoader.__next__`,
Megatron's `batch-generator`, `get_batch`)."""
