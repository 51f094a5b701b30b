"""The GEMM table of a trace: one row per GEMM host op with a recorded shape, for `model.calibrate`.

A reader-side view: the files are read here (their own slices and args, `ingest.chrome`), so that the
calibration is a computation over this table and never reads a file itself.
"""

from __future__ import annotations

from collections.abc import Iterable

import polars as pl

from tracediag.api_types import checked
from tracediag.ingest import chrome
from tracediag.ingest.sniff import iter_blocks
from tracediag.schema import GEMM_SCHEMA
from tracediag.units import NS_PER_S
from tracediag.vocab import STEP_MARKER

GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm")
"""Host ops whose recorded `Input Dims` give a GEMM's shape (the leaves: `aten::linear`/`matmul` call these)."""

_OPERANDS = {"aten::mm": 0, "aten::_scaled_mm": 0, "aten::bmm": 0, "aten::addmm": 1, "aten::baddbmm": 1}
"""Index in `Input Dims` of the first matrix operand (addmm/baddbmm start with the bias)."""


@checked
def gemm_table(paths: Iterable[str]) -> pl.DataFrame:
    """One row per GEMM op with a recorded shape: path, op, batch, m, k, n, dtype, seconds, and the
    number of `ProfilerStep#N` spans in that file.

    On GPU traces the time is the op's kernels (linked by External id); on CPU traces the op itself.
    """
    frames = []
    for path in paths:
        dec = chrome.decode(iter_blocks(path), path)
        s = dec.slices
        ops = dec.with_args(
            s.filter((pl.col("cat") == "cpu_op") & pl.col("name").is_in(GEMM_OPS)), "a_input_dims", "a_input_type"
        )
        kernels = (
            s.filter((pl.col("cat") == "kernel") & pl.col("a_external_id").is_not_null())
            .group_by("a_external_id")
            .agg(kernel_ns=pl.col("dur").sum())
        )
        ops = ops.join(kernels, on="a_external_id", how="left")
        steps = s.filter(pl.col("name").cast(pl.String).str.contains(STEP_MARKER))
        first = pl.col("name").replace_strict(_OPERANDS, return_dtype=pl.Int64)
        dims = pl.col("a_input_dims").cast(pl.String).str.json_decode(pl.List(pl.List(pl.Int64)))
        types = pl.col("a_input_type").cast(pl.String).str.json_decode(pl.List(pl.String))
        a, b = dims.list.get(first, null_on_oob=True), dims.list.get(first + 1, null_on_oob=True)
        frames.append(
            ops.filter(pl.col("a_input_dims").is_not_null())
            .select(
                path=pl.lit(path),
                op=pl.col("name").cast(pl.String),
                batch=pl.when(a.list.len() == 3).then(a.list.get(0)).otherwise(1),
                m=a.list.get(-2, null_on_oob=True),
                k=a.list.get(-1, null_on_oob=True),
                n=b.list.get(-1, null_on_oob=True),
                dtype=types.list.get(first, null_on_oob=True),
                seconds=pl.coalesce("kernel_ns", "dur") / NS_PER_S,
                steps=pl.lit(steps.height, dtype=pl.Int64),
            )
            .drop_nulls(["m", "k", "n"])
            .filter(pl.col("seconds") > 0)
        )
    return pl.concat(frames) if frames else pl.DataFrame(schema=GEMM_SCHEMA)
