"""Enumerate splits, keep those that fit and respect the rules, rank them by predicted throughput.

Notes
-----
Searched: tp (powers of two up to the node, dividing heads), cp (powers of two, seq_len divisible by 2·cp),
pp (powers of two up to the layer count; uneven stages allowed as in `stage_layers`), dp = gpus/(tp·cp·pp),
ZeRO stage 0-3, micro-batch (powers of two dividing the per-replica batch), interleaving depth 1-8
(dividing every stage's layers),
recompute, sequence parallelism whenever tp > 1, and ep for MoE models. Ties in step time go to the split
needing less memory.
Memory is checked first (cheap); step time is computed only for splits that fit, with the per-layer cost
memoised across pp, dp and ZeRO, which makes a 405B model on 16,384 GPUs a few seconds of work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tracediag.errors import SpecError
from tracediag.model.memory import memory_per_device
from tracediag.model.predict import Prediction, predict
from tracediag.model.specs import RECOMPUTE_MODES, Split, Training, check_split, stage_layers
from tracediag.model.time import step_time

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tracediag.model.engine import Engine
    from tracediag.model.specs import DeviceSpec, ModelSpec

MAX_VPP = 8
"""Largest interleaving depth searched."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Ranked:
    """One split of the plan with the one-line reason it wins or loses."""

    rank: int
    prediction: Prediction
    reason: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """The ranked splits and what the search saw."""

    ranked: tuple[Ranked, ...]
    explored: int
    """(split, recompute) settings that respect the rules (divisibility, TP within a node) and were sized."""
    fitting: int
    """Splits that fit in memory with some recompute mode (each timed once, with the lightest that fits)."""

    def to_dict(self) -> dict:
        """Plain data: search counts and each shown split's prediction."""
        return {
            "explored": self.explored,
            "fitting": self.fitting,
            "splits": [{"rank": r.rank, "reason": r.reason, **r.prediction.to_dict()} for r in self.ranked],
        }


def _powers_of_two(limit: int) -> list[int]:
    out, n = [], 1
    while n <= limit:
        out.append(n)
        n *= 2
    return out


def candidate_splits(
    model: ModelSpec, device: DeviceSpec, engine: Engine, gpus: int, seq_len: int, global_batch: int
) -> Iterator[tuple[Training, ...]]:
    """Every split the search considers, each with its trainings from least to most recompute.

    With FlashAttention, selective recompute (of the attention core) is what the kernel already does, so
    only none and full are searched. ZeRO-0 is searched only without data parallelism: with it, ZeRO-1 moves
    the same bytes and shards the optimizer step.
    """
    modes = ("none", "full") if engine.flash_attention else RECOMPUTE_MODES
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
                yield from _inner(model, tp, cp, pp, dp, seq_len, global_batch, modes)


def _inner(
    model: ModelSpec,
    tp: int,
    cp: int,
    pp: int,
    dp: int,
    seq_len: int,
    global_batch: int,
    modes: tuple[str, ...],
) -> Iterator[tuple[Split, tuple[Training, ...]]]:
    per_replica = global_batch // dp
    layers = stage_layers(model.layers, pp)
    vpps = [1] + [v for v in range(2, MAX_VPP + 1) if pp > 1 and all(n % v == 0 for n in layers)]
    eps = [1] + [e for e in _powers_of_two(model.experts)[1:] if (dp * cp) % e == 0] if model.experts > 1 else [1]
    for b in _powers_of_two(per_replica):
        if per_replica % b:
            continue
        m = per_replica // b
        trainings = tuple(
            Training(seq_len=seq_len, global_batch=global_batch, micro_batch=b, recompute=r) for r in modes
        )
        for v in vpps:
            if v > 1 and m % pp:
                continue
            for ep in eps:
                for zero in (1, 2, 3) if dp * cp > 1 else (0,):
                    yield (
                        Split(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, vpp=v, zero=zero, sequence_parallel=tp > 1),
                        trainings,
                    )


def _reason(p: Prediction, best: Prediction | None) -> str:
    t = p.time
    parts = {
        "bubble": t.bubble_s,
        "exposed TP comm": t.exposed_tp_s,
        "exposed DP comm": t.exposed_dp_s,
        "exposed PP comm": t.exposed_pp_s,
        "exposed CP comm": t.exposed_cp_s,
        "exposed EP comm": t.exposed_ep_s,
        "recompute": t.recompute_s,
        "optimizer": t.optimizer_s,
    }
    mem = f"memory {p.memory.total / 2**30:.0f}/{p.memory.capacity / 2**30:.0f} GiB"
    if best is None:
        worst = max(parts, key=parts.__getitem__)
        return f"fastest; largest overhead is {worst} ({100 * parts[worst] / t.step_time_s:.0f}% of the step), {mem}"
    b = best.time
    base = {
        "bubble": b.bubble_s,
        "exposed TP comm": b.exposed_tp_s,
        "exposed DP comm": b.exposed_dp_s,
        "exposed PP comm": b.exposed_pp_s,
        "exposed CP comm": b.exposed_cp_s,
        "exposed EP comm": b.exposed_ep_s,
        "recompute": b.recompute_s,
        "optimizer": b.optimizer_s,
    }
    extra = {k: parts[k] - base[k] for k in parts}
    extra["compute"] = (t.compute_s - t.recompute_s) - (b.compute_s - b.recompute_s)
    cause = max(extra, key=extra.__getitem__)
    slower = 100 * (t.step_time_s / b.step_time_s - 1)
    return f"{slower:.1f}% slower than #1: more {cause} (+{extra[cause]:.3g} s per step), {mem}"


def plan(
    model: ModelSpec,
    device: DeviceSpec,
    engine: Engine,
    *,
    gpus: int,
    seq_len: int,
    global_batch: int,
    top: int = 5,
) -> Plan:
    """Search every split; return the `top` fastest that fit, with a reason for each.

    For each split only the lightest recompute mode that fits is timed: more recompute is never faster.
    """
    explored = fitting = 0
    results: list[tuple[float, float, Split, Training]] = []
    for split, trainings in candidate_splits(model, device, engine, gpus, seq_len, global_batch):
        for train in trainings:
            try:
                check_split(model, device, split, train, gpus)
            except SpecError:
                break
            explored += 1
            memory = memory_per_device(model, device, split, train, engine)
            if memory.fits:
                fitting += 1
                results.append((step_time(model, device, split, train, engine).step_time_s, memory.total, split, train))
                break
    if not results:
        msg = (
            f"no split of {model.name} over {gpus} x {device.name} fits in memory ({explored} tried)\n\n"
            "Hint: more GPUs, a device with more memory, or a smaller global batch"
        )
        raise SpecError(msg)
    results.sort(key=lambda r: (round(r[0], 6), r[1]))
    shown = [predict(model, device, split, train, engine, gpus=gpus) for _, _, split, train in results[:top]]
    ranked = tuple(
        Ranked(rank=i + 1, prediction=p, reason=_reason(p, shown[0] if i else None)) for i, p in enumerate(shown)
    )
    return Plan(ranked=ranked, explored=explored, fitting=fitting)
