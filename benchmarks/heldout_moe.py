"""Score `tracediag predict` on published MoE runs: Qwen3 MoE in Megatron-Bridge's performance tables (issue 28).

No row of the dev set or of `heldout_model.csv` is a mixture of experts, so the MoE terms (expert GEMMs at the
busiest expert's tokens, the router, the EP all-to-all) were never checked against a run. NVIDIA's
Megatron-Bridge publishes MoE pretraining throughput beside its dense rows (docs/performance-summary-archive.md,
the 25.09 and 25.11 NeMo containers; the recipes in scripts/performance). Each row here is one of those table
lines, with the split the table prints. Nothing is fitted to them.

What the rows say and the model takes from them: tokens are force-balanced among the experts (the tables'
footnote: "we force-balance the token distribution among experts", 25.09's "tokendrop" runs cap every expert at
its capacity), so `moe_imbalance` is 1; the distributed optimizer (ZeRO-1); sequence parallelism with tp > 1;
no recompute; Megatron-Bridge's perf recipes reduce bf16 gradients and skip the NaN check (one gradient-buffer
pass), as for the same tables' dense rows in `heldout_model.csv`. The 25.09 table names no precision; its
section is the FP8 one. An expert-parallel group larger than dp · cp folds over tensor-parallel ranks with
expert tensor parallelism 1, as Megatron-Core runs it (`Split.etp`).

Shapes: the models' Hugging Face configs (Qwen/Qwen3-30B-A3B, Qwen/Qwen3-235B-A22B): 48 / 94 layers, hidden
2048 / 4096, 32 / 64 query heads of 128 channels, 4 kv heads, 128 experts of 768 / 1536 (SwiGLU), top-8, vocab
151,936, untied output layer.

Run: `python benchmarks/heldout_moe.py [-o benchmarks/heldout_moe.md]`.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from tracediag.errors import SpecError
from tracediag.model.predict import predict
from tracediag.model.specs import ModelSpec, Split, Training, resolve_device
from tracediag.model.stack import resolve_engine, with_overrides

HERE = Path(__file__).resolve().parent
DEFAULT_MD = HERE / "heldout_moe.md"
SOURCE = (
    "https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/0a25f911b2ed6c6905a539504fdb8e5b40e3438b/"
    "docs/performance-summary-archive.md"
)

_QWEN3_30B = ModelSpec(
    name="Qwen3-30B-A3B",
    layers=48,
    hidden=2048,
    heads=32,
    kv_heads=4,
    attention_head_dim=128,
    ffn=768,
    swiglu=True,
    vocab=151936,
    experts=128,
    top_k=8,
)
QWEN3 = {
    "Qwen3-30B-A3B": _QWEN3_30B,
    "Qwen3-235B-A22B": dataclasses.replace(
        _QWEN3_30B, name="Qwen3-235B-A22B", layers=94, hidden=4096, heads=64, ffn=1536
    ),
}


@dataclass(frozen=True, slots=True)
class Row:
    """One table line: model, container, system, and the split and throughput it prints."""

    model: str
    release: str
    system: str
    gpus: int
    dtype: str
    global_batch: int
    micro_batch: int
    tp: int
    pp: int
    vpp: int
    ep: int
    tokens_per_s_per_gpu: float
    seq_len: int = 4096


ROWS = (
    Row("Qwen3-30B-A3B", "25.09", "gb200", 8, "fp8", 512, 4, 1, 1, 1, 8, 22775),
    Row("Qwen3-30B-A3B", "25.09", "b200", 8, "fp8", 512, 1, 1, 1, 1, 8, 18066),
    Row("Qwen3-30B-A3B", "25.09", "h100-sxm", 16, "fp8", 512, 2, 1, 2, 24, 8, 10494),
    Row("Qwen3-235B-A22B", "25.09", "gb200", 64, "fp8", 1024, 1, 2, 1, 1, 64, 4452),
    Row("Qwen3-235B-A22B", "25.09", "b200", 64, "fp8", 1024, 1, 1, 8, 2, 8, 4104),
    Row("Qwen3-235B-A22B", "25.09", "h100-sxm", 256, "fp8", 2048, 1, 2, 8, 4, 32, 1204),
    Row("Qwen3-30B-A3B", "25.11", "gb200", 8, "fp8", 512, 4, 1, 1, 1, 8, 23766),
    Row("Qwen3-30B-A3B", "25.11", "b200", 8, "fp8", 512, 1, 1, 1, 1, 8, 9299),
    Row("Qwen3-30B-A3B", "25.11", "h100-sxm", 16, "fp8", 512, 2, 1, 2, 24, 8, 5275),
    Row("Qwen3-235B-A22B", "25.11", "gb200", 256, "bf16", 8192, 1, 1, 8, 3, 32, 4916),
    Row("Qwen3-235B-A22B", "25.11", "b200", 64, "fp8", 1024, 1, 1, 8, 2, 8, 3269),
    Row("Qwen3-235B-A22B", "25.11", "h100-sxm", 256, "fp8", 2048, 1, 2, 8, 4, 32, 1575),
)
"""The 25.09 and 25.11 sections' Qwen3 MoE lines on DGX-GB200, DGX-B200 and DGX-H100 (GB300 and B300 have no
preset); the 25.09 lines' main numbers (the parentheses are another quantisation)."""


def predicted_tokens_per_s_per_gpu(row: Row) -> float:
    """The model's throughput for the row's split, as the module docstring sets it up (SpecError if the split
    cannot be expressed or does not fit)."""
    dp = row.gpus // (row.tp * row.pp)
    etp = 1 if row.ep > dp else None
    split = Split(tp=row.tp, pp=row.pp, dp=dp, vpp=row.vpp, ep=row.ep, etp=etp, zero=1, sequence_parallel=row.tp > 1)
    train = Training(
        seq_len=row.seq_len,
        global_batch=row.global_batch,
        micro_batch=row.micro_batch,
        recompute="none",
        grad_bytes=2,
        dtype=row.dtype,
    )
    engine = with_overrides(resolve_engine("megatron-core"), moe_imbalance=1.0, grad_buffer_passes=1.0)
    p = predict(QWEN3[row.model], resolve_device(row.system), split, train, engine)
    if not p.fits:
        msg = f"does not fit: {p.memory.total / 2**30:.1f} of {p.memory.capacity / 2**30:.1f} GiB"
        raise SpecError(msg)
    return p.tokens_per_s / row.gpus


def scores() -> tuple[list[tuple[Row, float]], list[tuple[Row, str]]]:
    """(row, predicted tokens/s per GPU) for the rows the model can time, (row, why) for the others."""
    scored, skipped = [], []
    for row in ROWS:
        try:
            scored.append((row, predicted_tokens_per_s_per_gpu(row)))
        except SpecError as e:
            skipped.append((row, str(e).split("\n")[0]))
    return scored, skipped


def optimism_range() -> tuple[float, float]:
    """Smallest and largest predicted / measured throughput over the scored rows."""
    ratios = [p / r.tokens_per_s_per_gpu for r, p in scores()[0]]
    return min(ratios), max(ratios)


def render() -> str:
    scored, skipped = scores()
    lines = [
        "# Held-out MoE runs: Megatron-Bridge's Qwen3 MoE pretraining tables",
        "",
        f"Generated by `python benchmarks/heldout_moe.py` from the table lines in that script ({SOURCE}). Error: "
        "predicted / measured tokens per second per GPU − 1 (+ = optimistic). Nothing is fitted to these rows.",
        "",
        "| model | container | system | GPUs | dtype | GBS | MBS | split | measured tok/s/GPU | predicted | error |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r, p in scored:
        split = f"tp{r.tp} pp{r.pp} vp{r.vpp} ep{r.ep}"
        lines.append(
            f"| {r.model} | {r.release} | {r.system} | {r.gpus} | {r.dtype} | {r.global_batch} | {r.micro_batch} | "
            f"{split} | {r.tokens_per_s_per_gpu:,.0f} | {p:,.0f} | {100 * (p / r.tokens_per_s_per_gpu - 1):+.1f}% |"
        )
    errs = [p / r.tokens_per_s_per_gpu - 1 for r, p in scored]
    lo, hi = optimism_range()
    lines += [
        "",
        f"{len(errs)} rows: median |error| {100 * statistics.median(abs(e) for e in errs):.1f}%, max "
        f"{100 * max(abs(e) for e in errs):.1f}%, signed mean {100 * statistics.fmean(errs):+.1f}%; predicted "
        f"{lo:.2f}-{hi:.2f}x the measured throughput.",
    ]
    if skipped:
        lines += ["", "Not scored:", ""]
        lines += [f"- {r.model} {r.release} {r.system} tp{r.tp} pp{r.pp} ep{r.ep}: {why}" for r, why in skipped]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--out", type=Path, default=DEFAULT_MD)
    args = parser.parse_args(argv)
    text = render()
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main(sys.argv[1:])
