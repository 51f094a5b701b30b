#!/usr/bin/env python3
"""Paired-run validation of the what-if: does the injected run's what-if predict the healthy run?

For each pair under PAIRS_DIR (default fixtures/paired; made by fixtures/paired/make_pairs.py):
analyze the healthy and the injected run, take the injected run's finding of the injected cause and
compare its ``step_time_without_ns`` with the healthy run's median step time. The link pair is
analysed with ``link_gbps`` = the healthy run's median bus bandwidth (a calibration of what the link
reaches), the pipeline pair at the healthy run's micro-batches (``whatif.pipeline``
``step_ns_by_microbatches``). Where the detector does not find the injected cause, the what-if of that
cause is computed anyway on every rank and step ("forced": this validates the what-if, not the
detector). Prints the markdown table of docs/analyze.md.

    python benchmarks/whatif_pairs.py [PAIRS_DIR]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import polars as pl

import tracediag
from tracediag.analysis import Finding
from tracediag.causes import price
from tracediag.reduce import derive_facts
from tracediag.whatif import graph_of

HERE = Path(__file__).resolve().parent
MS = 1e6


def _analysis(path: Path, link_gbps: float | None = None) -> tracediag.Analysis:
    return tracediag.analyze(tracediag.load(path, jobs=1), link_gbps=link_gbps)


def _forced(path: Path, cause: str, link_gbps: float | None, steps: tuple[int, ...] = ()) -> Finding:
    """The what-if of `cause` on every rank and step, for a run where the detector did not find it
    (this validates the what-if, not the detector)."""
    run = tracediag.load(path, jobs=1)
    derived = derive_facts(run, link_gbps=link_gbps)
    facts = derived.facts
    ranks = tuple(sorted(facts.steps["rank"].unique().to_list()))
    probe = Finding(cause=cause, ranks=ranks, steps=steps, time_lost_ns=0, confidence=0.0, summary="")
    priced, _ = price((probe,), facts, graph_of(facts, derived.replay))
    return priced[0]


def _median_step(a: tracediag.Analysis) -> float:
    return float(a.steps.group_by("step").agg(pl.col("dur_ns").median())["dur_ns"].median())


def _step_ms(a: tracediag.Analysis, steps: list[int]) -> float:
    per = a.steps.filter(pl.col("step").is_in(steps)).group_by("step").agg(pl.col("dur_ns").median())
    return float(per["dur_ns"].median()) / MS


def compare_alternating(pair: Path) -> dict:
    """One run, the cause on odd steps: the what-if of those steps against the even (healthy) steps."""
    manifest = json.loads((pair / "run" / "manifest.json").read_text())
    cause, bad, good = manifest["cause"], manifest["injected_steps"], manifest["healthy_steps"]
    a = _analysis(pair / "run")
    found = [f for f in a.findings if f.cause == cause and set(f.steps) & set(bad)]
    # priced on exactly the injected steps when the detector's steps differ or it found nothing
    ok = found and set(found[0].steps) <= set(bad)
    finding = found[0] if ok else _forced(pair / "run", cause, None, tuple(bad))
    row = {
        "pair": f"{pair.name} (steps {','.join(map(str, bad))} vs {','.join(map(str, good))})",
        "cause": cause,
        "healthy_ms": _step_ms(a, good),
        "injected_ms": _step_ms(a, bad),
        "found": [f.cause for f in a.findings],
        "link_gbps": None,
        "whatif_ms": finding.step_time_without_ns / MS if finding.step_time_without_ns else None,
        "forced": finding not in a.findings,
    }
    if row["whatif_ms"] is not None:
        row["error"] = row["whatif_ms"] / row["healthy_ms"] - 1
    row["no_whatif_error"] = row["injected_ms"] / row["healthy_ms"] - 1
    return row


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
        for proj in injected.whatif.pipeline if injected.whatif else ():
            ns = proj["step_ns_by_microbatches"].get(str(m))
            row["whatif_ms"] = ns / MS if ns else None
    elif found:
        row["whatif_ms"] = found[0].step_time_without_ns / MS
    elif cause != "pipeline_bubble":
        forced = _forced(pair / "injected", cause, link)
        row["whatif_ms"] = forced.step_time_without_ns / MS if forced.step_time_without_ns else None
        row["forced"] = True
    if row["whatif_ms"] is not None:
        row["error"] = row["whatif_ms"] / row["healthy_ms"] - 1
    row["no_whatif_error"] = row["injected_ms"] / row["healthy_ms"] - 1
    return row


def main(argv: list[str]) -> None:
    root = Path(argv[0]) if argv else HERE.parent / "fixtures" / "paired"
    rows = [compare(p) for p in sorted(root.iterdir()) if (p / "injected" / "manifest.json").exists()]
    rows += [compare_alternating(p) for p in sorted(root.iterdir()) if (p / "run" / "manifest.json").exists()]
    print(
        "| pair | injected cause | found | healthy step | injected step (error) | what-if | what-if error |\n"
        "|---|---|---|---|---|---|---|"
    )
    for r in rows:
        w = f"{r['whatif_ms']:.1f} ms" + (" (forced)" if r.get("forced") else "") if r["whatif_ms"] else "—"
        e = f"{100 * r['error']:+.1f}%" if "error" in r else "—"
        link = f" (link {r['link_gbps']:.2f} GB/s)" if r["link_gbps"] else ""
        found = ", ".join(r["found"])
        print(
            f"| {r['pair']} | {r['cause']}{link} | {found} | {r['healthy_ms']:.1f} ms | "
            f"{r['injected_ms']:.1f} ms ({100 * r['no_whatif_error']:+.1f}%) | {w} | {e} |"
        )
    hit = [r for r in rows if "error" in r]
    within = sum(abs(r["error"]) <= 0.15 for r in hit)
    closer = sum(abs(r["error"]) < abs(r["no_whatif_error"]) for r in hit)
    print(f"\n{within} of {len(hit)} what-ifs within 15% of the healthy step; {closer} closer than no what-if")


if __name__ == "__main__":
    main(sys.argv[1:])
