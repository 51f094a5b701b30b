"""Kernel view: top kernels/operators per rank split compute / communication / memory (issue 11)."""

from __future__ import annotations

import orjson
import polars as pl
from conftest import FIXTURES, SAMPLES, needs_shared

import tracediag
from tracediag.cli import cli
from tracediag.derive.intervals import union_intervals
from tracediag.derive.kernels import top_kernels
from tracediag.derive.steps import assign_steps, find_markers, step_spans

RUN = FIXTURES / "runs" / "comm_bound"


def _assigned(paths):
    ev = tracediag.load(paths, jobs=1).events
    spans = step_spans(ev, find_markers(ev))
    return assign_steps(ev, spans), spans


def test_cpu_operator_self_times_add_up_to_the_busy_time_of_each_thread():
    """Self time (duration minus direct children) summed over operators equals, per rank, the union
    of operator time on each thread summed over threads: nothing counted twice, nothing lost."""
    ev, spans = _assigned(sorted(RUN.glob("rank*.gz")))
    steps = spans.select("rank", "step", "device", dur_ns=pl.col("end") - pl.col("start"))
    table = top_kernels(ev, steps, top=None)
    ours = table.group_by("rank").agg(pl.col("total_ns").sum()).sort("rank")
    ops = ev.filter(pl.col("device") == -1, pl.col("kind").is_in(["cpu_op", "comm"]), pl.col("step").is_not_null())
    union = union_intervals(ops.select("rank", "tid", "ts", end=pl.col("ts") + pl.col("dur")).lazy(), ["rank", "tid"])
    busy = union.collect().group_by("rank").agg((pl.col("end") - pl.col("ts")).sum()).sort("rank")
    assert ours["total_ns"].to_list() == busy["end"].to_list()
    assert set(table["category"]) == {"compute", "communication"}
    top = table.filter(pl.col("rank") == 0).row(0, named=True)
    assert (top["name"], top["category"]) == ("gloo:all_reduce", "communication")


@needs_shared(SAMPLES / "hta")
def test_gpu_kernel_totals_are_the_device_rows_of_the_analysed_steps(runner):
    path = SAMPLES / "hta" / "nccl_parser_config"
    result = runner.invoke(cli, ["analyze", str(path), "--format", "json"])
    doc = orjson.loads(result.output)
    cats = {c["category"]: c for c in doc["kernel_categories"]}
    ev, _ = _assigned(path)
    kept = ev.filter(pl.col("device") == 0, pl.col("step").is_in(doc["run"]["steps"]))
    for cat, kinds in (("compute", ["kernel"]), ("communication", ["comm"]), ("memory", ["memcpy", "memset"])):
        rows = kept.filter(pl.col("kind").is_in(kinds))
        assert (cats[cat]["count"], cats[cat]["total_ns"]) == (rows.height, rows["dur"].sum())
    assert doc["kernels"][0]["name"].startswith("ncclKernel_AllReduce")
    text = runner.invoke(cli, ["analyze", str(path), "--kernels", "3"]).output
    block = text.split("top 3 kernels/operators per rank")[1].splitlines()
    assert block[1].startswith("rank 0: communication 46.9 ms")
    assert len(block) == 6


def test_html_has_the_kernel_view_with_names_escaped(tmp_path):
    from tracediag.report.html import render_html

    a = tracediag.analyze(tracediag.load(sorted(RUN.glob("rank*.gz")), jobs=1))
    import dataclasses

    first = pl.Series("name", ["<script>alert(1)</script>", *a.kernels["name"].to_list()[1:]])
    page = render_html(dataclasses.replace(a, kernels=a.kernels.with_columns(first)))
    section = page.split('<section id="kernels">')[1].split("</section>")[0]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in section
    assert "<script>alert" not in section
    assert "gloo:all_reduce" in section
    assert "communication" in section
