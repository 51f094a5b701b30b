"""The names traces use, in one place: collectives, step markers, device categories, ranks, the host
and device rows each stage reads by name, and how a pattern is matched against them.

Every reader (Kineto, Nsight Systems, JAX) maps a name through these tables, so one NCCL kernel,
`nccl:*` annotation, `record_param_comms` name, gloo op or HLO collective means one `coll_op`
whichever profiler recorded it (trace-formats.md §2–4). Every regular expression over event names
lives here; `name_matches` runs one on the distinct names, not on every event, and `user_regex`
checks a user's pattern (`--step-regex`, `--rank-from-filename`).
"""

from __future__ import annotations

from dataclasses import dataclass

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
        msg = f"{shown(path)}: the file names several ranks ({says}); export one file per rank or {fix}"
        raise RankError(msg)
    if named:
        return named[0]
    if default is None:
        msg = f"{shown(path)}: the file names no rank ({missing}); {fix}"
        raise RankError(msg)
    warnings.append(f"the file names no rank; taken as rank {default}")
    return default


SEQUENCE_INPUT_OP = r"^aten::embedding$"
"""Host operators whose recorded input shapes (``record_shapes``) give the batch's sequences: an embedding
lookup's token ids ``[B, S]`` are B sequences of S tokens (its ``Input Dims``: the weight, then the ids)."""

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


# Host and device rows the derivations read by name.

INPUT_OP = r"(?i)dataloader"
"""Host rows that load input (``enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__``, ...); an
op-timeline data row whose name does not match is named ``DataLoader#<name>`` (`ingest.timeline`)."""
ATEN_OP = r"^aten::"
"""ATen operators: the work happens in their own bodies (`derive.breakdown`)."""
BLOCKING_CALL = r"(?i)synchronize|^(?:cuda|hip)Memcpy(?:WithStream)?$|^cuMemcpy(?:DtoH|HtoD)?(?:_v2)?$"
"""Runtime calls that block the host until the device is done (`derive.host`)."""
COPY_CALL = r"(?i)memcpy"
"""Runtime copy calls, blocking when they hold the host long (`derive.host.BLOCKING_COPY_NS`)."""
ITEM_OP = r"^aten::(?:item|_local_scalar_dense)$"
"""``.item()``: a tensor read back to the host, a synchronization the program asked for."""
KERNEL_LAUNCH = r"(?i)launchkernel|graphlaunch|modulelaunchkernel|cuLaunch"
"""Runtime calls whose time is launch overhead (`derive.host`: launches per step and their time)."""
ANY_LAUNCH = r"(?i)launch"
"""Runtime calls that put a kernel on the device (`derive.steps`): a launch with no kernel row was lost.
(Memsets and copies are left out: the runtime elides some, e.g. empty ones, in every step.)"""
PHASE_ANNOTATION = r"^(?i:forward|backward)"
"""Pipeline schedule annotations (`torch.distributed.pipelining`: ``Forward i``, ``Backward i``): a
send inside a forward goes to the next stage, a recv comes from the previous one; backward reverses."""
FORWARD_ANNOTATION = r"(?i)^forward"
"""The forward ones of `PHASE_ANNOTATION`."""

# JAX (XLA) names (`ingest.jax`).

DEVICE_PLANE = r"^/device:(?:GPU|TPU):(\d+)$"
"""Device planes whose number is the process-local device index."""
STREAM_LINE = r"^Stream #(\d+)"
"""GPU stream lines on a device plane (`Stream #14(Compute)`); the number is the stream."""
JAX_DONE_OP = r"[-_]done(?:\.\d+)?$"
"""The end of an asynchronous HLO op (``all-reduce-done.3``), lower case: the device waits there."""
JAX_MEMCPY = r"(?i)^memcpy"
"""Device copies."""
JAX_MEMSET = r"(?i)^memset"
"""Device memsets."""
RENDEZVOUS_HELPERS = r"^(?:Rendezvous|InvokeRendezvous|Wait for rendezvous callback|Wait: pending_threads=)"
"""CPU-runtime events inside a collective (its wait for the peers): kind "other", not counted twice."""
RUNTIME_CALL = r"^(?:cu|cuda|hip)[A-Z]"
"""Host-side CUDA/HIP driver and runtime calls (GPU traces)."""


def distinct_names(events: pl.DataFrame) -> pl.Series:
    """The distinct names of `events` (nulls dropped, the column's dtype, in order of first
    appearance), for a caller that runs several `name_matches` on the same events: finding them
    costs more than a pattern over them. (On the Categorical column, keeping the order costs about
    half the CPU of not keeping it: measured on 8 ranks of an A100 trace.)"""
    return events.get_column("name").unique(maintain_order=True).drop_nulls()


def name_matches(events: pl.DataFrame | pl.Series, pattern: str) -> pl.Expr:
    """An expression equal to ``pl.col("name").cast(pl.String).str.contains(pattern)`` on `events`
    (and on any frame whose names are among them): null where the name is null. `events` may be
    given as its `distinct_names`.

    The event table's ``name`` is Categorical: a run of 600k events has a few thousand distinct
    names, so a pattern evaluated on the distinct names and turned into a membership test costs
    about a tenth of the same pattern over every row (measured on 8 ranks of a 35 MB A100 trace).
    """
    names = events if isinstance(events, pl.Series) else distinct_names(events)
    return pl.col("name").is_in(names.filter(names.cast(pl.String).str.contains(pattern)).implode())


@dataclass(frozen=True, slots=True)
class UserRegex:
    """A user's pattern the linear-time engine accepts, and how many capture groups it has.

    Polars' engine (Rust `regex`) matches in linear time: no pattern can make a match run for minutes
    on a 30-character name, which Python's backtracking `re` can (``^(a+)+$``). The price is no
    look-around and no back-references; such a pattern is refused in one line naming the option.
    """

    pattern: str
    groups: int

    def first_group(self, texts: list[str]) -> list[str | None]:
        """For each text: its first group (the whole match without groups), None when no match."""
        s = pl.Series(texts, dtype=pl.String)
        return s.str.extract(self.pattern, 1 if self.groups else 0).to_list()


def user_regex(pattern: str, option: str) -> UserRegex:
    """`pattern` checked by the engine; a one-line `ValueError` naming `option` when it is refused."""
    try:
        found = pl.Series([""], dtype=pl.String).str.extract_groups(pattern)
    except pl.exceptions.PolarsError as e:
        lines = [ln.strip() for ln in str(e).splitlines()]
        why = next((ln.removeprefix("error: ") for ln in lines if ln.startswith("error:")), lines[0] if lines else "")
        msg = f"{option} {pattern!r} is not a valid regular expression ({why}; the engine matches in linear time)"
        raise ValueError(msg) from None
    return UserRegex(pattern, len(found.dtype.fields))  # type: ignore[union-attr]
