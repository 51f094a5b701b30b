"""tracediag: where a multi-GPU training run waits, what it should achieve, and how to split it.

Python API (see docs/api.md)::

    run = tracediag.load(["run/rank0.json.gz", "run/rank1.json.gz"])
    run.events          # polars DataFrame, schema in tracediag.schema.EVENT_SCHEMA
    run.save("run.parquet"); tracediag.load("run.parquet")
"""

from tracediag.analyze import analyze
from tracediag.errors import RankError, TracediagError, TraceError
from tracediag.run import Run, RunMeta, load

__all__ = ["RankError", "Run", "RunMeta", "TraceError", "TracediagError", "analyze", "load"]
