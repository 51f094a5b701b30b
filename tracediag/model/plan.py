"""Enumerate splits, keep those that fit with memory headroom and that the target engine runs, rank them.

Notes
-----
Searched: tp (powers of two up to the node, dividing heads), cp (powers of two, seq_len divisible by 2·cp),
pp (powers of two up to the layer count; uneven stages as in `stage_layers`), dp = gpus/(tp·cp·pp), ZeRO
stage 0-3, micro-batch (powers of two dividing the per-replica batch), interleaving depth 2-8 (dividing the
largest stage, every stage at least that deep; only where the engine interleaves), recompute, sequence
parallelism whenever tp > 1, and ep for MoE (within dp·cp, and with tp > 1 folded over the tp ranks too,
etp 1). With `target`, only what that engine runs (`emit.unsupported`).
Memory is checked first (cheap) against (1 − headroom) of capacity; step time is computed only for splits
that fit, with the per-layer cost memoised across pp, dp and ZeRO. Splits within `NEAR_TIE` of the fastest
remaining one are ties, broken towards the simpler split (`complexity`); splits above the published ceiling all
rank at its MFU, and among them the step time without the engine's optimistic assumptions orders them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from tracediag.api_types import checked
from tracediag.errors import SpecError
from tracediag.model.ceilings import above_ceiling, ceiling_for, describe, moe_warning
from tracediag.model.emit import unsupported, unsupported_model, unsupported_recompute
from tracediag.model.flops import model_flops
from tracediag.model.memory import memory_per_device
from tracediag.model.predict import Prediction, predict
from tracediag.model.specs import RECOMPUTE_MODES, DeviceSpec, ModelSpec, Split, Training, check_split, stage_layers
from tracediag.model.stack import Engine, assumptions, conservative
from tracediag.model.time import step_time

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


MAX_VPP = 8
"""Largest interleaving depth searched."""

DEFAULT_HEADROOM = 0.10
"""Share of device memory a plan keeps free: allocator fragmentation spikes, NCCL and cuBLAS workspaces
and the first step's transients exceed the formulas' steady state (PyTorch's caching allocator commonly
reports 5-10% more reserved than allocated memory)."""

NEAR_TIE = 0.01
"""Splits within this share of the fastest step time are ties; the simplest of them is ranked first."""


def _without_assumptions(p: Prediction) -> tuple[dict[str, float], float]:
    """MFU of the prediction's split without each optimistic assumption of its engine, and without all."""
    m, d, sp, t = p.model, p.device, p.split, p.training
    each = {name: predict(m, d, sp, t, e, gpus=p.gpus).mfu for name, e in assumptions(p.engine).items()}
    return each, predict(m, d, sp, t, conservative(p.engine), gpus=p.gpus).mfu if each else p.mfu


def ceiling_warning(p: Prediction, *, ranked: bool = False) -> str:
    """A warning when the prediction's MFU exceeds the best published run of its device class and size
    ('' if not), naming the assumption that carries it and the conservative estimate without them."""
    ceiling = above_ceiling(p)
    if ceiling is None:
        return ""
    text = (
        f"MFU {100 * p.mfu:.1f}% is above the best published {ceiling.device_class} run of its size "
        f"({ceiling.size_class}: {describe(ceiling)})"
    )
    each, floor = _without_assumptions(p)
    if each:
        name = min(each, key=each.__getitem__)
        text += (
            f"; it rests most on {name} (without it {100 * each[name]:.1f}%); without "
            f"{', '.join(each)}: {100 * floor:.1f}%"
        )
    if ranked:
        return text + (
            f"; ranked as {100 * ceiling.mfu_causal:.1f}% (no split is credited above the published run), "
            "ties going to the split that keeps most without those assumptions"
        )
    if floor >= ceiling.mfu_causal:
        return text + f"; expect at most {100 * ceiling.mfu_causal:.1f}%"
    return text + f"; expect {100 * floor:.1f}-{100 * ceiling.mfu_causal:.1f}%"


def prediction_warnings(p: Prediction, *, ranked: bool = False) -> str:
    """Every warning that applies to a prediction, joined ('' if none); `ranked` as `ceiling_warning`'s."""
    return "; ".join(w for w in (ceiling_warning(p, ranked=ranked), moe_warning(p)) if w)


@dataclass(frozen=True, kw_only=True, slots=True)
class Ranked:
    """One split of the plan with the one-line reason it wins or loses."""

    rank: int
    prediction: Prediction
    reason: str
    warning: str = ""
    """Set when the predicted MFU exceeds the published ceiling of the device class and size."""
    rank_time_s: float = 0.0
    """Step time the split was ranked by: the prediction's, or for a split predicted above the published
    ceiling the step time at the ceiling's MFU (such splits tie; their step time without the engine's
    optimistic assumptions orders them)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """The ranked splits and what the search saw."""

    ranked: tuple[Ranked, ...]
    explored: int
    """(split, recompute) settings that respect the rules (divisibility, TP within a node) and were sized."""
    fitting: int
    """Splits that fit in memory with some recompute mode (each timed once, with the lightest that fits)."""
    headroom: float = DEFAULT_HEADROOM
    """Share of device memory every shown split leaves free."""
    target: str | None = None
    """Engine the search was restricted to (`--emit`), None for every split."""

    def to_dict(self) -> dict:
        """Plain data: search counts and each shown split's prediction."""
        return {
            "explored": self.explored,
            "fitting": self.fitting,
            "headroom": self.headroom,
            "target": self.target,
            "splits": [
                {"rank": r.rank, "reason": r.reason, "warning": r.warning, **r.prediction.to_dict()}
                for r in self.ranked
            ],
        }


def _powers_of_two(limit: int) -> list[int]:
    out, n = [], 1
    while n <= limit:
        out.append(n)
        n *= 2
    return out


def candidate_splits(
    model: ModelSpec,
    device: DeviceSpec,
    engine: Engine,
    gpus: int,
    seq_len: int,
    global_batch: int,
    target: str | None = None,
    grad_bytes: int = 4,
    dtype: str = "bf16",
) -> Iterator[tuple[Split, tuple[Training, ...]]]:
    """Every split the search considers, each with its trainings from least to most recompute.

    With FlashAttention, selective recompute (of the attention core) is what the kernel already does, so
    only none, per-op selective (`op`, where the model has it) and full are searched. ZeRO-0 is searched
    only without data parallelism: with it, ZeRO-1 moves the same bytes and shards the optimizer step.
    With a `target` engine, only the splits it runs exactly as predicted (`emit.unsupported`).
    """
    if engine.flash_attention:
        modes = tuple(m for m in ("none", "op", "full") if m in RECOMPUTE_MODES)
    else:
        modes = ("none", "selective", "full")
    rules = target or engine.stack
    modes = tuple(m for m in modes if unsupported_recompute(rules, m) is None)
    for tp in _powers_of_two(device.gpus_per_node):
        if model.heads % tp or (model.groups % tp and tp % model.groups):
            continue
        for cp in _powers_of_two(gpus // tp):
            if cp > 1 and seq_len % (2 * cp):
                continue
            for pp in _powers_of_two(min(gpus // (tp * cp), model.layers)):
                if gpus % (tp * cp * pp):
                    continue
                dp = gpus // (tp * cp * pp)
                if global_batch % dp:
                    continue
                inner = _inner(
                    model, tp, cp, pp, dp, seq_len, global_batch, modes, grad_bytes, dtype, engine.interleaving
                )
                for split, trainings in inner:
                    if unsupported(rules, model, split) is None:
                        yield split, trainings


def interleavings(layers: tuple[int, ...]) -> list[int]:
    """Interleaving depths (v > 1) a stage layout allows: v divides the largest stage and every stage has
    at least v layers. Lighter first/last stages (uneven, Llama 3 style) keep one layer fewer in a chunk."""
    if len(layers) == 1:
        return []
    return [v for v in range(2, MAX_VPP + 1) if max(layers) % v == 0 and min(layers) >= v]


def _inner(
    model: ModelSpec,
    tp: int,
    cp: int,
    pp: int,
    dp: int,
    seq_len: int,
    global_batch: int,
    modes: tuple[str, ...],
    grad_bytes: int,
    dtype: str,
    interleaving: bool,
) -> Iterator[tuple[Split, tuple[Training, ...]]]:
    per_replica = global_batch // dp
    vpps = [1, *interleavings(stage_layers(model.layers, pp))] if interleaving else [1]
    # (ep, etp): expert parallelism within dp·cp, and (tp > 1) folded over the tp ranks too with whole experts
    # (etp 1, Megatron-Core's MoE parallel folding); `unsupported` drops what the target does not run.
    experts = _powers_of_two(model.experts)[1:] if model.experts > 1 else []
    eps: list[tuple[int, int | None]] = [(1, None)] + [(e, None) for e in experts if (dp * cp) % e == 0]
    if tp > 1:
        eps += [(e, 1) for e in experts if (tp * dp * cp) % e == 0]
    for b in _powers_of_two(per_replica):
        if per_replica % b:
            continue
        m = per_replica // b
        trainings = tuple(
            Training(
                seq_len=seq_len,
                global_batch=global_batch,
                micro_batch=b,
                recompute=r,
                grad_bytes=grad_bytes,
                dtype=dtype,
            )
            for r in modes
        )
        for v in vpps:
            if v > 1 and m % pp:
                continue
            for ep, etp in eps:
                for zero in (1, 2, 3) if dp * cp > 1 else (0,):
                    sp = tp > 1
                    yield (
                        Split(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, vpp=v, zero=zero, sequence_parallel=sp),
                        trainings,
                    )


_RECOMPUTE_ORDER = {"none": 0, "op": 1, "selective": 1, "full": 2}


def complexity(split: Split, train: Training) -> tuple[int, ...]:
    """Sort key towards the simpler split: fewer parallel dimensions, lower pp, no interleaving, lower
    ZeRO stage, lower tp and cp, less recompute, larger micro-batches (fewer, simpler steps); experts folded
    over tp count as one dimension more."""
    dims = sum(d > 1 for d in (split.tp, split.pp, split.cp, split.ep)) + (split.expert_tp < split.tp)
    return (
        dims,
        split.pp,
        split.vpp,
        split.zero,
        split.tp,
        split.cp,
        split.ep,
        _RECOMPUTE_ORDER.get(train.recompute, 3),
        -train.micro_batch,
    )


_PARTS = (
    ("compute", lambda t: t.compute_s - t.recompute_s - t.interference_s),
    ("recompute", lambda t: t.recompute_s),
    ("interference of overlapped comm", lambda t: t.interference_s),
    ("bubble", lambda t: t.bubble_s),
    ("exposed TP comm", lambda t: t.exposed_tp_s),
    ("exposed DP comm", lambda t: t.exposed_dp_s),
    ("exposed PP comm", lambda t: t.exposed_pp_s),
    ("exposed CP comm", lambda t: t.exposed_cp_s),
    ("exposed EP comm", lambda t: t.exposed_ep_s),
    ("optimizer", lambda t: t.optimizer_s),
)
"""Parts of a step that add up to `step_time_s`."""


def _setting_diff(p: Prediction, best: Prediction) -> str:
    s, b = p.split, best.split
    attrs = (("tp", "tp"), ("pp", "pp"), ("dp", "dp"), ("cp", "cp"), ("ep", "ep"), ("etp", "expert_tp"))
    attrs += (("vpp", "vpp"), ("zero", "zero"))
    pairs = [(label, getattr(b, attr), getattr(s, attr)) for label, attr in attrs]
    pairs += [
        ("mb", best.training.micro_batch, p.training.micro_batch),
        ("recompute", best.training.recompute, p.training.recompute),
    ]
    return ", ".join(f"{name} {x}->{y}" for name, x, y in pairs if x != y)


def _mem(p: Prediction) -> str:
    return f"memory {p.memory.total / 2**30:.0f}/{p.memory.capacity / 2**30:.0f} GiB"


_AS_RANKED = " as ranked, MFU capped at the published ceiling"


def _reason(
    p: Prediction,
    best: Prediction | None,
    fastest: Prediction | None = None,
    *,
    rank_s: float,
    other_rank_s: float,
    careful_s: float = 0.0,
    other_careful_s: float = 0.0,
) -> str:
    """Why this split ranks where it does, from what actually differs (never a difference of zero).

    `rank_s` is the time this split was ranked by, `other_rank_s` that of #1 (or of the fastest split found,
    for #1): the step time at the published ceiling's MFU for splits above it. `careful_s` and
    `other_careful_s` are their step times without the engine's optimistic assumptions, which order splits
    tied at the ceiling.
    """
    t = p.time
    if best is None:
        name, worst = max(((n, f(t)) for n, f in _PARTS if n != "compute"), key=lambda x: x[1])
        head = "fastest"
        if fastest is not None and fastest is not p:
            tied = rank_s == other_rank_s and careful_s != other_careful_s
            gap = 100 * ((careful_s / other_careful_s) if tied else (rank_s / other_rank_s)) - 100
            basis = " without the engine's optimistic assumptions (both capped)" if tied else ""
            head = (
                f"{gap:.1f}% slower than the fastest split found ({_setting_diff(fastest, p)}){basis}, "
                f"within {100 * NEAR_TIE:.0f}%: the simpler split is preferred"
            )
        overhead = (
            f"largest overhead is {name} ({100 * worst / t.step_time_s:.0f}% of the step)"
            if worst > 0
            else ("no overhead beyond compute")
        )
        return f"{head}; {overhead}, {_mem(p)}"
    b = best.time
    slower = 100 * (rank_s / other_rank_s - 1)
    floor = 0.005 * b.step_time_s
    deltas = sorted(((f(t) - f(b), n) for n, f in _PARTS), key=lambda x: -abs(x[0]))
    shown = [f"{d:+.3g} s {n}" for d, n in deltas if abs(d) >= floor][:3]
    what = "; ".join(shown) if shown else "no part differs by more than 0.5% of the step"
    diff = _setting_diff(p, best)
    capped = rank_s != t.step_time_s or other_rank_s != b.step_time_s
    if slower < 100 * NEAR_TIE:
        simpler = complexity(best.split, best.training) < complexity(p.split, p.training)
        careful = 100 * (careful_s / other_careful_s - 1) if capped and other_careful_s else 0.0
        if capped and not (simpler and careful < 100 * NEAR_TIE):
            times = f"{other_careful_s:.3g} s against {careful_s:.3g}"
            why = f"faster without the engine's optimistic assumptions ({times})"
        else:
            why = "simpler" if simpler else "faster"
        head = f"within {100 * NEAR_TIE:.0f}% of #1 ({slower:+.1f}%{_AS_RANKED if capped else ''}), #1 is {why}"
    else:
        head = f"{slower:.1f}% slower than #1" + (f" ({_AS_RANKED.removeprefix(' ')})" if capped else "")
    return f"{head} ({diff}): {what}; {_mem(p)}"


Row = tuple[float, float, Split, Training]
"""(rank time, memory, split, training) of one fitting split."""


class NoFit(SpecError):
    """No split (that the target engine runs) fits in memory."""


def _pick(results: list[Row], top: int, careful: Callable[[Split, Training], float]) -> list[Row]:
    """The `top` splits in rank order: repeatedly, among the remaining splits within `NEAR_TIE` of the
    fastest remaining one, those within `NEAR_TIE` of the best conservative time (`careful`) among them
    (splits capped at the published ceiling tie on their rank time; the one that keeps the most without the
    engine's optimistic assumptions goes first), then the simplest (`complexity`), the faster, the lighter."""
    remaining = sorted(results, key=lambda r: (r[0], r[1]))
    chosen = []
    while remaining and len(chosen) < top:
        limit = remaining[0][0] * (1 + NEAR_TIE)
        end = next((i for i, r in enumerate(remaining) if r[0] > limit), len(remaining))
        times = [careful(remaining[j][2], remaining[j][3]) for j in range(end)]
        steady = min(times) * (1 + NEAR_TIE)
        i = min(
            (j for j in range(end) if times[j] <= steady),
            key=lambda j: (complexity(remaining[j][2], remaining[j][3]), remaining[j][0], remaining[j][1]),
        )
        chosen.append(remaining.pop(i))
    return chosen


def _rank_time(
    model: ModelSpec, device: DeviceSpec, engine: Engine, gpus: int, seq_len: int, global_batch: int, dtype: str
) -> Callable[[Split, Training], float]:
    """The time a split is ranked by: its predicted step time, but never less than the step time at the MFU
    of the best published run of the device class and size (bf16): no split is credited with more than a
    published run reached. Capped splits tie; `_pick` breaks the tie on the conservative time."""
    ceiling = ceiling_for(device.name, model)
    floor = (
        model_flops(model, seq_len, global_batch, causal=True) / (ceiling.mfu_causal * gpus * device.peak_flops)
        if ceiling is not None and dtype == "bf16"
        else 0.0
    )
    return lambda split, train: max(floor, step_time(model, device, split, train, engine).step_time_s)


@checked
def plan(
    model: ModelSpec,
    device: DeviceSpec,
    engine: Engine,
    *,
    gpus: int,
    seq_len: int,
    global_batch: int,
    top: int = 5,
    headroom: float = DEFAULT_HEADROOM,
    target: str | None = None,
    grad_bytes: int = 4,
    dtype: str = "bf16",
) -> Plan:
    """Search every split; return the `top` fastest that fit with `headroom` of memory to spare.

    For each split only the lightest recompute mode that fits is timed: more recompute is never faster.
    With `target` (an `emit` engine) only the splits that engine runs exactly as predicted are searched.
    Near-ties (within `NEAR_TIE`) go to the simpler split.
    """
    if not 0 <= headroom < 1:
        msg = f"headroom must be in [0, 1), got {headroom}"
        raise SpecError(msg)
    budget = (1 - headroom) * device.memory_bytes
    rank_time = _rank_time(model, device, engine, gpus, seq_len, global_batch, dtype)
    explored = fitting = 0
    results: list[Row] = []
    for split, trainings in candidate_splits(
        model, device, engine, gpus, seq_len, global_batch, target, grad_bytes, dtype
    ):
        for train in trainings:
            try:
                check_split(model, device, split, train, gpus)
            except SpecError:
                break
            explored += 1
            memory = memory_per_device(model, device, split, train, engine)
            if memory.total <= budget:
                fitting += 1
                results.append((rank_time(split, train), memory.total, split, train))
                break
    if not results:
        within = f" with {100 * headroom:.0f}% headroom" if headroom else ""
        by = f" that {target or engine.stack} can run" if target or engine.stack else ""
        msg = (
            f"no split{by} of {model.name} over {gpus} x {device.name} fits in memory{within} ({explored} tried)"
            "\n\nHint: more GPUs, a device with more memory, a smaller global batch, or a lower --headroom"
        )
        raise NoFit(msg)
    careful_engine = conservative(engine)

    @cache
    def careful(split: Split, train: Training) -> float:
        return step_time(model, device, split, train, careful_engine).step_time_s

    chosen = _pick(results, top, careful)
    first = min(r[0] for r in results)
    # Among splits tied at the ceiling, the fastest is the fastest without the optimistic assumptions.
    fastest_row = min(results, key=lambda r: (r[0], careful(r[2], r[3]) if r[0] == first else 0.0, r[1]))
    shown = [predict(model, device, split, train, engine, gpus=gpus) for _, _, split, train in chosen]
    fastest = (
        shown[0]
        if chosen[0] is fastest_row
        else predict(model, device, fastest_row[2], fastest_row[3], engine, gpus=gpus)
    )
    ranked = tuple(
        Ranked(
            rank=i + 1,
            prediction=p,
            reason=_reason(
                p,
                shown[0],
                rank_s=row[0],
                other_rank_s=chosen[0][0],
                careful_s=careful(row[2], row[3]),
                other_careful_s=careful(chosen[0][2], chosen[0][3]),
            )
            if i
            else _reason(
                p,
                None,
                fastest,
                rank_s=row[0],
                other_rank_s=fastest_row[0],
                careful_s=careful(row[2], row[3]),
                other_careful_s=careful(fastest_row[2], fastest_row[3]),
            ),
            warning=prediction_warnings(p, ranked=True),
            rank_time_s=row[0],
        )
        for i, (p, row) in enumerate(zip(shown, chosen, strict=True))
    )
    return Plan(ranked=ranked, explored=explored, fitting=fitting, headroom=headroom, target=target)


EMIT_FLOOR = 0.10
"""An emitted split below this share of the best plan's MFU is refused: it wastes nine GPUs in ten."""


def emit_refusal(
    model: ModelSpec,
    device: DeviceSpec,
    engine: Engine,
    target: str,
    emitted: Plan | NoFit,
    *,
    gpus: int,
    seq_len: int,
    global_batch: int,
    headroom: float = DEFAULT_HEADROOM,
    grad_bytes: int = 4,
    dtype: str = "bf16",
) -> str:
    """Why the best split `target` runs (`emitted`: its plan, or the `NoFit` its search raised) should not be
    emitted, in one line ('' when it should): it does not fit, or it reaches less than `EMIT_FLOOR` of the MFU
    of the best split any stack runs (searched with `engine` under its own stack's rules)."""
    try:
        best = (
            plan(
                model,
                device,
                engine,
                gpus=gpus,
                seq_len=seq_len,
                global_batch=global_batch,
                top=1,
                headroom=headroom,
                grad_bytes=grad_bytes,
                dtype=dtype,
            )
            .ranked[0]
            .prediction
        )
    except NoFit:
        best = None
    where = f"{model.name} over {gpus} x {device.name}"
    if isinstance(emitted, NoFit):
        if why := unsupported_model(target, model):
            return f"refused: {why}"
        other = f"; {_brief(best)} ({engine.stack}) fits" if best is not None else ""
        return f"refused: no split {target} can run of {where} fits in memory{other}"
    chosen = emitted.ranked[0].prediction
    if best is None or chosen.mfu >= EMIT_FLOOR * best.mfu:
        return ""
    return (
        f"refused: the best split {target} can run of {where}, {_brief(chosen)}, reaches {100 * chosen.mfu:.1f}% "
        f"MFU ({chosen.step_time_s:.3g} s/step), below {100 * EMIT_FLOOR:.0f}% of the best plan's "
        f"{100 * best.mfu:.1f}% ({_brief(best)}, {engine.stack}); its largest cost: {_largest_part(chosen)}"
    )


def _brief(p: Prediction) -> str:
    s = p.split
    return f"tp{s.tp} pp{s.pp} dp{s.dp} cp{s.cp} zero{s.zero} recompute {p.training.recompute}"


def _largest_part(p: Prediction) -> str:
    t = p.time
    name, value = max(((n, f(t)) for n, f in _PARTS), key=lambda x: x[1])
    return f"{name}, {100 * value / t.step_time_s:.0f}% of the step"
