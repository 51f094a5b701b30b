"""Reports from real runs for the HTML and browser tests: hostile names, a run with every section."""

from __future__ import annotations

import dataclasses
import gzip
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import polars as pl

import tracediag
from tracediag.model.predict import Prediction, predict
from tracediag.model.specs import Split, Training, resolve_device, resolve_model
from tracediag.model.stack import resolve_engine
from tracediag.observed_vs_predicted import check

if TYPE_CHECKING:
    from tracediag.analysis import Analysis

RUNS = Path(__file__).parent.parent / "fixtures" / "runs"
SCRIPT = "<script>alert(1)</script>"
IMG = "<img src=x onerror=alert(1)>"


def prediction(split: Split) -> Prediction:
    """The tiny model on 4 A100s, for checks against the 4-rank fixture runs."""
    model, device = resolve_model("tiny"), resolve_device("a100-80gb")
    return predict(
        model, device, split, Training(seq_len=512, global_batch=16), resolve_engine("megatron-core"), gpus=4
    )


def traces(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.pt.trace.json.gz"))


def hostile_copy(src: Path, dst: Path) -> None:
    """A real run with trace text replaced by markup: op names, the process group's name and description.

    The group's name (`SCRIPT`) and description (`IMG`) reach the report through the collectives table and
    the check's bus-bandwidth rows.
    """
    dst.mkdir(parents=True)
    shutil.copy(src / "manifest.json", dst / "manifest.json")
    for f in traces(src):
        trace = orjson.loads(gzip.decompress(f.read_bytes()))
        trace["distributedInfo"]["pg_config"][0].update({"pg_name": SCRIPT, "pg_desc": IMG})
        for e in trace["traceEvents"]:
            if e.get("name") == "aten::mm":
                e["name"] = IMG
            elif e.get("name") == "aten::addmm":
                e["name"] = SCRIPT
            elif e.get("name") in ("c10d::allreduce_", "gloo:all_reduce"):
                # as newer PyTorch records them: the group's name and the message size
                group = {"Process Group Name": SCRIPT, "In msg nelems": 262144, "Out msg nelems": 262144}
                e["args"].update({**group, "dtype": "Float", "Group size": 4})
        (dst / f.name).write_bytes(gzip.compress(orjson.dumps(trace)))


def analysis_with_check(paths: Path | list[Path], split: Split) -> Analysis:
    """`tracediag.analyze` of a run, with the check against `prediction(split)`."""
    run = tracediag.load(paths, jobs=1)
    analysis = tracediag.analyze(run)
    result = check(analysis, prediction(split), run=run)
    return dataclasses.replace(analysis, check=result)


def replicated(analysis: Analysis, ranks: int, steps: int) -> Analysis:
    """A 1,024-rank, 100-step analysis made of a real analysis' rows (rank r copies rank r mod n)."""
    src = analysis.steps
    n, first = src["rank"].n_unique(), min(src["step"])
    count = src["step"].n_unique()
    grid = pl.DataFrame({"rank": range(ranks)}).join(pl.DataFrame({"step": range(first, first + steps)}), how="cross")
    rows = grid.with_columns(
        src_rank=(pl.col("rank") % n).cast(pl.Int32), src_step=((pl.col("step") - first) % count + first).cast(pl.Int32)
    ).join(src.rename({"rank": "src_rank", "step": "src_step"}), on=["src_rank", "src_step"])
    rows = rows.drop("src_rank", "src_step").select(src.columns).cast(dict(src.schema))
    return dataclasses.replace(analysis, steps=rows, ranks=tuple(range(ranks)), world_size=ranks)
