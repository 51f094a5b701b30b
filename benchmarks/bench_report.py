"""Size and render time of the HTML report at 1,024 ranks × 100 steps.

The tables are synthesised from a real analysis (fixtures/runs/straggler_persistent, 4 ranks × 8 steps,
with the check against a 4-GPU DP plan): rank r copies rank r mod 4's rows and step s copies step
2 + (s − 2) mod 8, collectives are copied per step, so the straggler (rank 2) repeats every 4 ranks.
Baseline in the same run: plotly's own `fig.to_html(include_plotlyjs=True)` of one heat-map of the step
times with every cell (1,024 × 100), i.e. the smallest self-contained page with one of the report's plots.

Run: `python benchmarks/bench_report.py`.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

import tracediag
from tracediag.model.predict import predict
from tracediag.model.specs import Split, Training, resolve_device, resolve_model
from tracediag.model.stack import resolve_engine
from tracediag.observed_vs_predicted import check
from tracediag.report.html import render_html

if TYPE_CHECKING:
    from tracediag.analysis import Analysis

RANKS, STEPS = 1024, 100
RUN = Path(__file__).parent.parent / "fixtures" / "runs" / "straggler_persistent"


def replicate(analysis: Analysis, ranks: int, steps: int) -> Analysis:
    """`analysis` grown to `ranks` × `steps` by copying its per-rank rows and per-step collectives."""
    src, colls = analysis.steps, analysis.collectives
    n, first, count = src["rank"].n_unique(), int(src["step"].min()), src["step"].n_unique()
    span = int(src["dur_ns"].max()) * 2
    grid = pl.DataFrame({"rank": range(ranks)}).join(pl.DataFrame({"step": range(first, first + steps)}), how="cross")
    keyed = grid.with_columns(
        src_rank=(pl.col("rank") % n).cast(pl.Int32),
        src_step=((pl.col("step") - first) % count + first).cast(pl.Int32),
        shift=(pl.col("step") - first) // count * count * span,
    )
    rows = keyed.join(src.rename({"rank": "src_rank", "step": "src_step"}), on=["src_rank", "src_step"])
    rows = rows.with_columns(pl.col("start_ns") + pl.col("shift")).select(src.columns).cast(dict(src.schema))
    step_map = keyed.select("step", "src_step", "shift").unique()
    new_colls = (
        step_map.join(colls.rename({"step": "src_step"}), on="src_step")
        .with_columns(pl.col(c) + pl.col("shift") for c in ("first_arrival_ns", "last_arrival_ns", "end_ns"))
        .with_columns(n_ranks=pl.lit(ranks, pl.Int32))
        .select(colls.columns)
        .cast(dict(colls.schema))
    )
    return dataclasses.replace(analysis, steps=rows, collectives=new_colls, ranks=tuple(range(ranks)), world_size=ranks)


def baseline(analysis: Analysis) -> tuple[float, int]:
    """Seconds and bytes for plotly's own self-contained page of one full-resolution heat-map."""
    import plotly.graph_objects as go

    start = time.perf_counter()
    grid = analysis.steps.pivot(on="step", index="rank", values="dur_ns").sort("rank")
    z = (grid.drop("rank") / 1e6).rows()
    page = go.Figure(go.Heatmap(z=z, colorscale="YlOrRd")).to_html(include_plotlyjs=True)
    return time.perf_counter() - start, len(page.encode())


def main() -> None:
    """Print the report's render time and size next to the baseline's."""
    run = tracediag.load(sorted(RUN.glob("rank*.pt.trace.json.gz")))
    small = tracediag.analyze(run)
    model, device = resolve_model("tiny"), resolve_device("a100-80gb")
    prediction = predict(
        model, device, Split(dp=4), Training(seq_len=512, global_batch=16), resolve_engine("megatron-core"), gpus=4
    )
    small = dataclasses.replace(small, check=check(small, prediction, run=run))
    big = replicate(small, RANKS, STEPS)
    print(f"{big.steps.height:,} rank-steps, {big.collectives.height:,} collectives", file=sys.stderr)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        page = render_html(big)
        times.append(time.perf_counter() - start)
    base_s, base_bytes = baseline(big)
    print(f"tracediag report, {RANKS:,} ranks x {STEPS} steps: {min(times):.2f} s, {len(page.encode()) / 1e6:.2f} MB")
    print(f"baseline (plotly to_html, one full heat-map):  {base_s:.2f} s, {base_bytes / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
