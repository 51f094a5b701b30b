"""The cross-rank stage of `analyze` at scale: 1,024 ranks × 100 steps, time and memory.

    python benchmarks/bench_cross_rank.py [--ranks 1024] [--steps 100] [--per-step 2] [--baseline-ranks 64]

Per-rank summaries are replicated from a real run (fixtures/runs/straggler_persistent: its
collective instances and per-step breakdown): rank 2 stays the straggler, every other rank copies
one of the healthy ranks with its own clock offset, step s copies step s % 8, with `--per-step`
collectives per step. The stage must still name rank 2. Then, in a fresh process
each (so peak RSS is the stage's own):

1. the cross-rank stage: clock offsets and matching (`align_and_match`), waits per (rank, step),
   the collective table, and every detector (`detect_all`), timed per part; peak RSS growth;
2. the baseline: the same matching, offsets and waits written as a plain Python loop over
   instance rows (dicts per key), on `--baseline-ranks` ranks (scaled linearly when fewer).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "fixtures" / "runs" / "straggler_persistent"


def _hwm() -> int:
    return int(re.search(r"VmHWM:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) * 1024


def build(ranks: int, steps: int, per_step: int):
    """Replicated (instances, steps) frames from the real run."""
    import polars as pl

    import tracediag
    from tracediag.derive.collectives import collective_instances
    from tracediag.derive.steps import assign_steps, find_markers, step_spans
    from tracediag.reduce import derive_facts

    run = tracediag.load(sorted(SOURCE.glob("rank*.pt.trace.json.gz")), jobs=1)
    ev = run.events
    inst = collective_instances(assign_steps(ev, step_spans(ev, find_markers(ev))))
    facts = derive_facts(run).facts
    src_steps = sorted(inst["step"].unique().to_list())
    step_len = 300_000_000
    base = inst.with_columns(
        k=pl.int_range(pl.len()).over("rank", "step"),
        t0=pl.col("ts") - pl.col("ts").min().over("rank", "step"),
        t1=pl.col("end") - pl.col("ts").min().over("rank", "step"),
    )
    grid = pl.DataFrame({"rank": range(ranks)}, schema={"rank": pl.Int32}).join(
        pl.DataFrame({"step": range(steps)}, schema={"step": pl.Int32}), how="cross"
    )
    grid = grid.with_columns(
        # rank 2 is the real run's straggler; every other rank copies one of the healthy ranks 0, 1, 3
        src_rank=pl.when(pl.col("rank") == 2)
        .then(2)
        .otherwise(pl.lit([0, 1, 3]).list.get(pl.col("rank") % 3))
        .cast(pl.Int32),
        src_step=pl.lit(src_steps).list.get(pl.col("step") % len(src_steps)).cast(pl.Int32),
        offset=(pl.col("rank") * 7919 % 5_000_000).cast(pl.Int64),
    )
    reps = pl.DataFrame({"rep": range(per_step // 2 or 1)})
    instances = (
        grid.join(base, left_on=["src_rank", "src_step"], right_on=["rank", "step"])
        .join(reps, how="cross")
        .with_columns(
            ts=pl.col("step").cast(pl.Int64) * step_len + pl.col("rep") * 1_000_000 + pl.col("t0") + pl.col("offset"),
            end=pl.col("step").cast(pl.Int64) * step_len + pl.col("rep") * 1_000_000 + pl.col("t1") + pl.col("offset"),
            seq=(pl.col("step").cast(pl.Int64) * per_step + pl.col("rep") * 2 + pl.col("k")),
        )
        .select("rank", "group", "op", "seq", "step", "bytes", "group_size", "ts", "end")
    )
    step_rows = (
        grid.join(
            facts.steps.drop("late_n", "coll_n", "wait_ns"), left_on=["src_rank", "src_step"], right_on=["rank", "step"]
        )
        .with_columns(start_ns=pl.col("step").cast(pl.Int64) * step_len)
        .drop("src_rank", "src_step", "offset")
    )
    return instances, step_rows, facts


def stage(ranks: int, steps: int, per_step: int) -> dict:
    import polars as pl

    from tracediag.causes import detect_all
    from tracediag.derive.collectives import align_and_match, summarize_instances, wait_per_step
    from tracediag.detect import Facts

    instances, step_rows, facts = build(ranks, steps, per_step)
    base = _hwm()
    times = {}
    t = time.perf_counter()
    _offsets, matched, _ = align_and_match(instances)
    times["match_s"] = time.perf_counter() - t
    t = time.perf_counter()
    waits = wait_per_step(matched)
    collectives = summarize_instances(matched)
    times["waits_table_s"] = time.perf_counter() - t
    t = time.perf_counter()
    table = step_rows.join(waits, on=["rank", "step"], how="left").with_columns(
        pl.col("wait_ns", "late_n", "coll_n").fill_null(0)
    )
    findings = detect_all(Facts(steps=table, collectives=collectives, p2p=facts.p2p.clear()))
    times["detect_s"] = time.perf_counter() - t
    return {
        "ranks": ranks,
        "steps": steps,
        "instance_rows": instances.height,
        "step_rows": table.height,
        **{k: round(v, 3) for k, v in times.items()},
        "total_s": round(sum(times.values()), 3),
        "peak_rss_growth_mb": round((_hwm() - base) / 2**20, 1),
        "findings": [(f.cause, f.ranks[:8], f.steps[:3]) for f in findings][:3],
    }


def baseline(ranks: int, steps: int, per_step: int) -> dict:
    """Matching, offsets and waits as a Python loop over rows (what per-row code does)."""
    from statistics import median

    instances, _, _ = build(ranks, steps, per_step)
    rows = instances.rows(named=True)
    t = time.perf_counter()
    by_key: dict = {}
    for r in rows:
        by_key.setdefault((r["group"], r["op"], r["seq"]), []).append(r)
    diffs: dict = {}
    for members in by_key.values():
        ref = median(m["end"] for m in members)
        for m in members:
            diffs.setdefault(m["rank"], []).append(m["end"] - ref)
    offset = {rank: median(d) for rank, d in diffs.items()}
    waits: dict = {}
    for members in by_key.values():
        arrivals = [(m["ts"] - offset[m["rank"]], m) for m in members]
        last = max(a for a, _ in arrivals)
        for a, m in arrivals:
            key = (m["rank"], m["step"])
            waits[key] = waits.get(key, 0) + min(last - a, m["end"] - m["ts"])
    elapsed = time.perf_counter() - t
    return {"ranks": ranks, "instance_rows": len(rows), "loop_s": round(elapsed, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--per-step", type=int, default=2)
    ap.add_argument("--baseline-ranks", type=int, default=1024)
    ap.add_argument("--child", choices=["stage", "baseline"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child == "stage":
        print(json.dumps(stage(a.ranks, a.steps, a.per_step)))
        return
    if a.child == "baseline":
        print(json.dumps(baseline(a.ranks, a.steps, a.per_step)))
        return
    common = ["--steps", str(a.steps), "--per-step", str(a.per_step)]
    for child, ranks in (("stage", a.ranks), ("baseline", a.baseline_ranks)):
        cmd = [sys.executable, __file__, "--child", child, "--ranks", str(ranks), *common]
        out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        if child == "baseline":
            out["loop_s_scaled_to_ranks"] = round(out["loop_s"] * a.ranks / ranks, 1)
        print(child, json.dumps(out))


if __name__ == "__main__":
    main()
