"""Calculon's own validation points, scored by tracediag side by side with Calculon's numbers (issue 28).

Calculon (Isaev et al., SC'23; github.com/calculon-ai/calculon at caa4b11, `calculon llm-validation`,
calculon/llm/validation.py) validates on Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", arXiv 2205.05198): Megatron 22B, GPT-3 175B, MT-NLG 530B and Megatron 1T on Selene
A100-80GB, with the splits of its `validation/seqsel/*/*.json` files. Three sets of points:

- Table 5 step times, full recompute and sequence parallelism + selective recompute (measured);
- Figure 1 memory per GPU: parameters + optimizer state, and activations, without recompute and with
  sequence parallelism + selective recompute (the paper's equations: 18 bytes per parameter, Table 2);
- Figure 7 activation memory per layer relative to tensor parallelism alone, for sequence parallelism,
  selective recompute, both, and full recompute (same).

Calculon's errors below are what `calculon llm-validation` prints at caa4b11 (run locally, 2026-12-03): step
time 3.65% mean / 8.87% max, parameters + optimizer 8.49% mean / 10.84% max, activations 2.08% / 8.74%.
Errors here are (predicted − published) / published: + means a longer time or more memory than published.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from tracediag.model.memory import MemoryBreakdown, stage_memory, stored_bytes_per_layer
from tracediag.model.predict import predict
from tracediag.model.specs import ModelSpec, Split, Training, resolve_device

if TYPE_CHECKING:
    from tracediag.model.predict import Prediction
    from tracediag.model.stack import Engine

SHAPES = {
    # name: (layers, hidden, heads, tp, pp, vpp, global batch, micro-batch); seq 2048, vocab 51200, ffn 4h
    # (Calculon models/*.json and validation/seqsel/tab5/*.json; Korthikanti Table 3).
    "Megatron 22B": (48, 6144, 64, 8, 1, 1, 4, 4),
    "GPT-3 175B": (96, 12288, 96, 8, 8, 3, 64, 1),
    "MT-NLG 530B": (105, 20480, 128, 8, 35, 3, 280, 1),
    "Megatron 1T": (128, 25600, 160, 8, 64, 1, 512, 1),
}

STEP_TIME = {
    # model: {mode: (Korthikanti Table 5 seconds, Calculon's printed delta %)}
    "Megatron 22B": {"full": (1.42, 1.72), "seqsel": (1.10, -3.33)},
    "GPT-3 175B": {"full": (18.13, 0.56), "seqsel": (13.75, 0.81)},
    "MT-NLG 530B": {"full": (49.05, -1.72), "seqsel": (37.83, 8.87)},
    "Megatron 1T": {"full": (94.42, 4.60), "seqsel": (71.49, 7.62)},
}
"""Calculon prints `1 − calc/profile` in percent (to two decimals); `Point` turns it back into its value."""

PARAMS_OPTIMIZER_GIB = {
    # model: (Korthikanti Figure 1 GiB per GPU, Calculon's delta %); the same with and without recompute.
    "Megatron 22B": (45.5625, 10.84),
    "GPT-3 175B": (45.5625, 10.17),
    "MT-NLG 530B": (31.640625, 7.40),
    "Megatron 1T": (32.958984375, 5.55),
}

ACTIVATIONS_GIB = {
    # model: {mode: (Korthikanti Figure 1 GiB per GPU, Calculon's delta %)}
    "Megatron 22B": {"none": (59.25, -0.32), "seqsel": (9.5625, -8.74)},
    "GPT-3 175B": {"none": (66.84375, -0.14), "seqsel": (12.3515625, -2.75)},
    "MT-NLG 530B": {"none": (114.0234375, -0.14), "seqsel": (23.076171875, -2.12)},
    "Megatron 1T": {"none": (131.25, -0.15), "seqsel": (26.5625, -2.30)},
}

ACTIVATIONS_RELATIVE = {
    # model: {mode: (Korthikanti Figure 7 % of tensor parallelism alone, Calculon's delta %)}
    "Megatron 22B": {"seq": (66.84, -0.11), "sel": (49.42, 12.66), "seqsel": (16.18, -8.13), "full": (7.64, -30.41)},
    "GPT-3 175B": {"seq": (62.04, 0.02), "sel": (56.53, 14.52), "seqsel": (18.49, -2.54), "full": (8.71, -10.55)},
    "MT-NLG 530B": {"seq": (58.31, -0.17), "sel": (62.04, 14.91), "seqsel": (20.27, -1.82), "full": (9.42, -10.04)},
    "Megatron 1T": {"seq": (58.31, -0.18), "sel": (62.04, 14.86), "seqsel": (20.27, -1.99), "full": (9.42, -10.81)},
}

MODES = {
    # mode: (recompute, sequence parallelism)
    "none": ("none", False),
    "seq": ("none", True),
    "sel": ("selective", False),
    "seqsel": ("selective", True),
    "full": ("full", False),
}


@dataclass(frozen=True, slots=True)
class Point:
    """One validation point: what was published, what tracediag predicts, what Calculon predicts."""

    quantity: str
    model: str
    mode: str
    published: float
    ours: float
    calculon_delta: float
    """Calculon's printed `100 · (1 − calc/published)`."""

    @property
    def calculon(self) -> float:
        """Calculon's prediction."""
        return self.published * (1 - self.calculon_delta / 100)

    @property
    def error(self) -> float:
        """Relative error of tracediag's prediction, + = more than published."""
        return self.ours / self.published - 1

    @property
    def calculon_error(self) -> float:
        """Calculon's relative error, same sign."""
        return self.calculon / self.published - 1


def _model(name: str) -> ModelSpec:
    layers, hidden, heads, *_ = SHAPES[name]
    # Megatron GPT of 2022: learned positions, biases, dropout 0.1, tied embeddings (as the CSV's Korthikanti rows).
    return ModelSpec(
        name=name,
        layers=layers,
        hidden=hidden,
        heads=heads,
        ffn=4 * hidden,
        vocab=51200,
        tied_embeddings=True,
        learned_positions=2048,
        bias=True,
        dropout=True,
    )


@cache
def _predict(name: str, mode: str, engine: Engine) -> Prediction:
    _, _, _, tp, pp, vpp, batch, micro = SHAPES[name]
    recompute, sp = MODES[mode]
    split = Split(tp=tp, pp=pp, dp=1, vpp=vpp, sequence_parallel=sp)
    train = Training(seq_len=2048, global_batch=batch, micro_batch=micro, recompute=recompute, grad_bytes=4)
    return predict(_model(name), resolve_device("a100-80gb"), split, train, engine)


def _stage_memory(name: str, mode: str, engine: Engine, stage: int) -> MemoryBreakdown:
    p = _predict(name, mode, engine)
    return stage_memory(p.model, p.device, p.split, p.training, p.engine, min(stage, p.split.pp - 1))


def _layer_activations(name: str, mode: str, engine: Engine) -> float:
    p = _predict(name, mode, engine)
    return stored_bytes_per_layer(p.model, p.split, p.training, p.engine)


def points(engine: Engine) -> list[Point]:
    """Every point, predicted with `engine` (Korthikanti's Megatron-LM: the `megatron-2022` profile)."""
    out = []
    for name, modes in STEP_TIME.items():
        for mode, (published, delta) in modes.items():
            out.append(Point("step time s", name, mode, published, _predict(name, mode, engine).step_time_s, delta))
    gib = 2**30
    for name, (published, delta) in PARAMS_OPTIMIZER_GIB.items():
        # Figure 1 counts the transformer layers of a stage (18 bytes per parameter): a middle stage's devices;
        # with pp = 1 the only stage, which also holds the embedding.
        mb = _stage_memory(name, "none", engine, 1)
        out.append(
            Point(
                "params+optimizer GiB", name, "any", published, (mb.weights + mb.gradients + mb.optimizer) / gib, delta
            )
        )
    for name, modes in ACTIVATIONS_GIB.items():
        for mode, (published, delta) in modes.items():
            # Figure 1's activations are the first stage's: p in-flight micro-batches of its layers.
            ours = _stage_memory(name, mode, engine, 0).activations / gib
            out.append(Point("activations GiB", name, mode, published, ours, delta))
    for name, modes in ACTIVATIONS_RELATIVE.items():
        # Figure 7 compares Table 2's per-layer activations (stage and interleaving factors cancel).
        base = _layer_activations(name, "none", engine)
        for mode, (published, delta) in modes.items():
            ours = 100 * _layer_activations(name, mode, engine) / base
            out.append(Point("activations per layer, % of TP alone", name, mode, published, ours, delta))
    return out


def summary(group: list[Point]) -> dict[str, float]:
    """Mean and max |error| of tracediag and of Calculon over `group`, and tracediag's signed mean."""
    return {
        "points": len(group),
        "mean_abs": statistics.fmean(abs(p.error) for p in group),
        "max_abs": max(abs(p.error) for p in group),
        "signed_mean": statistics.fmean(p.error for p in group),
        "calculon_mean_abs": statistics.fmean(abs(p.calculon_error) for p in group),
        "calculon_max_abs": max(abs(p.calculon_error) for p in group),
    }


def by_quantity(pts: list[Point]) -> dict[str, dict[str, float]]:
    """`summary` per quantity (step time, parameters + optimizer, activations, relative activations)."""
    quantities = dict.fromkeys(p.quantity for p in pts)
    return {q: summary([p for p in pts if p.quantity == q]) for q in quantities}


def render(pts: list[Point], params: dict[str, float]) -> str:
    """Markdown: every point side by side, then mean / max per quantity."""
    chosen = ", ".join(f"{k}={v:g}" for k, v in params.items())
    lines = [
        "",
        "Calculon's validation points (Korthikanti et al. 2022 Table 5, Figures 1 and 7; Calculon caa4b11), "
        f"`megatron-2022` with the parameters chosen without Korthikanti ({chosen}); + = more than published:",
        "",
        "| quantity | model | mode | published | tracediag | error | Calculon | Calculon error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in pts:
        lines.append(
            f"| {p.quantity} | {p.model} | {p.mode} | {p.published:.4g} | {p.ours:.4g} | {100 * p.error:+.1f}% | "
            f"{p.calculon:.4g} | {100 * p.calculon_error:+.1f}% |"
        )
    lines += [
        "",
        "| quantity | points | tracediag mean abs | max abs | signed mean | Calculon mean abs | max abs |",
        "|---|---|---|---|---|---|---|",
    ]
    for q, s in by_quantity(pts).items():
        lines.append(
            f"| {q} | {s['points']} | {100 * s['mean_abs']:.2f}% | {100 * s['max_abs']:.2f}% | "
            f"{100 * s['signed_mean']:+.2f}% | {100 * s['calculon_mean_abs']:.2f}% | "
            f"{100 * s['calculon_max_abs']:.2f}% |"
        )
    return "\n".join(lines)
