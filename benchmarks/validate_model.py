"""Compare `tracediag predict` with published measured runs (../shared/validation/published_runs_dev.csv).

Each row is predicted from its own shape, split and hardware, with the engine profile of its software
era (`megatron-2022` for PTD-P and Korthikanti et al., `pytorch-fsdp` for llm-foundry), and scored in the
row's own convention (`flops_convention`):

- PTD-P Table 1: TFLOP/s per GPU counted with Eq. 3 (full recompute included), from the predicted step time.
- Korthikanti Table 5: the published iteration time.
- llm-foundry: MFU with (6N + 12·L·h·s) FLOPs per token against 312 TFLOP/s.

Knobs a row does not state (PTD-P gives no micro-batch size or interleaving): interleaving is off (Megatron's
default) and the micro-batch size is the fastest that fits, as the authors tuned it and as `tracediag plan`
would choose. Nothing is fitted per row.

Run: `python benchmarks/validate_model.py [CSV] [--format text|json]`.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import orjson
import polars as pl

from tracediag.errors import SpecError
from tracediag.model.engine import resolve_engine
from tracediag.model.flops import flops_6n
from tracediag.model.predict import Prediction, predict
from tracediag.model.specs import LINKS, ModelSpec, Split, Training, resolve_device

DEFAULT_CSV = Path(__file__).resolve().parents[2] / "shared" / "validation" / "published_runs_dev.csv"


@dataclass(frozen=True, slots=True)
class Score:
    """One row: what was measured, what we predict, in the row's convention."""

    model: str
    source: str
    split: str
    metric: str
    measured: float
    predicted: float

    @property
    def error(self) -> float:
        """Relative error of the prediction."""
        return self.predicted / self.measured - 1


def _row_inputs(row: dict) -> tuple[ModelSpec, str, dict, Training, str]:
    src = row["source"]
    foundry = "llm-foundry" in src
    model = ModelSpec(
        name=row["model_name"],
        layers=int(row["layers"]),
        hidden=int(row["hidden"]),
        heads=int(row["heads"]),
        kv_heads=int(row["kv_heads"]) if row["kv_heads"] else None,
        ffn=int(row["ffn_hidden"]),
        vocab=int(row["vocab"]),
        tied_embeddings=True,
        # Megatron GPT: learned positions, biases, dropout 0.1; MPT: ALiBi, no biases, no dropout.
        learned_positions=0 if foundry else int(row["seq_len"]),
        bias=not foundry,
        dropout=not foundry,
    )
    gpu = row["gpu_type"]
    device = "a100-40gb" if "40GB" in gpu else "a100-80gb"
    overrides = {"inter_link": LINKS["roce-200g"]()} if "RoCE" in gpu else {}
    rec_text = row["recompute"]
    recompute = (
        "full" if rec_text.startswith("full") else "selective" if rec_text.startswith("selective") else "none"
    )
    zero = 3 if "FSDP" in row["zero_or_fsdp"] or "ZeRO-3" in row["zero_or_fsdp"] else 0
    split = {
        "tp": int(row["tp"]),
        "pp": int(row["pp"]),
        "dp": int(row["dp"]),
        "cp": int(row["cp"] or 1),
        "zero": zero,
        "sequence_parallel": "sequence parallel" in rec_text,
    }
    if row["interleave/virtual_stages"]:
        split["vpp"] = int(row["interleave/virtual_stages"])
    # llm-foundry trains with FSDP mixed_precision PURE (bf16 gradient reduction); Megatron keeps fp32 grads.
    train = Training(
        seq_len=int(row["seq_len"]),
        global_batch=int(row["global_batch_seqs"]),
        micro_batch=int(row["micro_batch"]) if row["micro_batch"] else 1,
        recompute=recompute,
        grad_bytes=2 if foundry else 4,
    )
    dev = resolve_device(device, **overrides)
    return model, dev, split, train, "pytorch-fsdp" if foundry else "megatron-2022"


def _predict_row(row: dict) -> Prediction:
    model, device, split_kw, train, engine_name = _row_inputs(row)
    engine = resolve_engine(engine_name)
    micro = [train.micro_batch] if row["micro_batch"] else [1, 2, 4, 8]
    best = None
    for b in micro:
        try:
            p = predict(model, device, Split(**split_kw), dataclasses.replace(train, micro_batch=b), engine)
        except SpecError:
            continue
        if p.fits and (best is None or p.step_time_s < best.step_time_s):
            best = p
    if best is None:
        msg = f"{row['model_name']}: no micro-batch/interleaving fits"
        raise SpecError(msg)
    return best


def _eq3_flops(row: dict) -> float:
    """PTD-P Eq. 3: 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))."""
    b, s, n, h, v = (float(row[k]) for k in ("global_batch_seqs", "seq_len", "layers", "hidden", "vocab"))
    return 96 * b * s * n * h * h * (1 + s / (6 * h) + v / (16 * n * h))


def score_row(row: dict) -> Score:
    """Predict one CSV row and score it in its own convention."""
    p = _predict_row(row)
    sp = p.split
    split = (
        f"tp{sp.tp} pp{sp.pp} dp{sp.dp} cp{sp.cp} v{sp.vpp} b{p.training.micro_batch} "
        f"z{sp.zero} {p.training.recompute}{' sp' if sp.sequence_parallel else ''}"
    )
    common = {"model": row["model_name"], "source": row["source"].split(" ")[0], "split": split}
    if row["step_time_s"]:
        return Score(
            **common, metric="step time s", measured=float(row["step_time_s"]), predicted=p.step_time_s
        )
    if row["measured_tflops_per_gpu"]:
        predicted = _eq3_flops(row) / (p.step_time_s * p.gpus) / 1e12
        return Score(
            **common,
            metric="TFLOP/s/GPU (Eq.3)",
            measured=float(row["measured_tflops_per_gpu"]),
            predicted=predicted,
        )
    mfu = float(row["measured_mfu_or_hfu"].split("MFU:")[1].split(";")[0])
    predicted = flops_6n(p.model, p.training.seq_len, p.training.global_batch) / (
        p.step_time_s * p.gpus * p.device.peak_flops
    )
    return Score(**common, metric="MFU (6N+12Lhs)", measured=mfu, predicted=predicted)


def known_rows(csv: Path) -> list[dict]:
    """Rows whose split (tp, pp, dp) is known."""
    df = pl.read_csv(csv, infer_schema=False).fill_null("")
    return [r for r in df.iter_rows(named=True) if r["tp"] and r["pp"] and r["dp"]]


def validate(csv: Path = DEFAULT_CSV) -> list[Score]:
    """Score every row whose split is known."""
    return [score_row(r) for r in known_rows(csv)]


def render(scores: list[Score]) -> str:
    """Markdown table plus median and max |error|."""
    lines = [
        "| model | source | split | metric | measured | predicted | error |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in scores:
        lines.append(
            f"| {s.model} | {s.source} | {s.split} | {s.metric} | {s.measured:.4g} | "
            f"{s.predicted:.4g} | {100 * s.error:+.1f}% |"
        )
    errs = [abs(s.error) for s in scores]
    lines.append(
        f"\nrows: {len(errs)}  median |error|: {100 * statistics.median(errs):.2f}%  "
        f"mean: {100 * statistics.fmean(errs):.2f}%  max: {100 * max(errs):.2f}%"
    )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    """Print the table (or JSON with --format json)."""
    args = [a for a in argv if not a.startswith("--")]
    csv = Path(args[0]) if args else DEFAULT_CSV
    scores = validate(csv)
    if "--format" in argv and argv[argv.index("--format") + 1] == "json":
        sys.stdout.write(orjson.dumps([{**dataclasses.asdict(s), "error": s.error} for s in scores]).decode())
    else:
        print(render(scores))


if __name__ == "__main__":
    main(sys.argv[1:])
