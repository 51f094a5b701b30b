#!/usr/bin/env python3
"""Paired-run validation of the what-if: does the injected run's what-if predict the healthy run?

For each pair under PAIRS_DIR (default fixtures/paired; made by fixtures/paired/make_pairs.py):
analyze the healthy and the injected run, take the injected run's finding of the injected cause and
compare its ``step_time_without_ns`` with the healthy run's median step time. The link pair is
analysed with ``link_gbps`` = the healthy run's median bus bandwidth (a calibration of what the link
reaches), the pipeline pair at the healthy run's micro-batches (``whatif.pipeline``
``step_ns_by_microbatches``). Prints the markdown table of docs/analyze.md.

    python benchmarks/whatif_pairs.py [PAIRS_DIR]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import polars as pl

import tracediag

HERE = Path(__file__).resolve().parent
MS = 1e6


def _analysis(path: Path, link_gbps: float | None = None) -> tracediag.Analysis:
    return tracediag.analyze(tracediag.load(path, jobs=1), link_gbps=link_gbps)


def _median_step(a: tracediag.Analysis) -> float:
    return float(a.steps.group_by("step").agg(pl.col("dur_ns").median())["dur_ns"].median())


def compare(pair: Path) -> dict:
    """One row: the injected cause, the healthy and injected step, the what-if and its error."""
    manifest = json.loads((pair / "injected" / "manifest.json").read_text())
    cause = manifest["cause"]
    healthy = _analysis(pair / "healthy")
    link = None
    if cause == "comm_bound":
        link = float(healthy.collectives["busbw_gbps"].drop_nulls().median())
    injected = _analysis(pair / "injected", link)
    found = [f for f in injected.findings if f.cause == cause]
    row = {
        "pair": pair.name,
        "cause": cause,
        "healthy_ms": _median_step(healthy) / MS,
        "injected_ms": _median_step(injected) / MS,
        "found": [f.cause for f in injected.findings],
        "link_gbps": link,
        "whatif_ms": None,
    }
    if found and cause == "pipeline_bubble":
        m = json.loads((pair / "healthy" / "manifest.json").read_text())["config"]["m"]
        for proj in injected.extra["whatif"].get("pipeline", []):
            ns = proj["step_ns_by_microbatches"].get(str(m))
            row["whatif_ms"] = ns / MS if ns else None
    elif found:
        row["whatif_ms"] = found[0].step_time_without_ns / MS
    if row["whatif_ms"] is not None:
        row["error"] = row["whatif_ms"] / row["healthy_ms"] - 1
    return row


def main(argv: list[str]) -> None:
    root = Path(argv[0]) if argv else HERE.parent / "fixtures" / "paired"
    rows = [compare(p) for p in sorted(root.iterdir()) if (p / "injected" / "manifest.json").exists()]
    print("| pair | injected cause | found | healthy step | injected step | what-if | error |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        w = f"{r['whatif_ms']:.1f} ms" if r["whatif_ms"] is not None else "—"
        e = f"{100 * r['error']:+.1f}%" if "error" in r else "—"
        link = f" (link {r['link_gbps']:.2f} GB/s)" if r["link_gbps"] else ""
        found = ", ".join(r["found"])
        print(
            f"| {r['pair']} | {r['cause']}{link} | {found} | {r['healthy_ms']:.1f} ms | "
            f"{r['injected_ms']:.1f} ms | {w} | {e} |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
