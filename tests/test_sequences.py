"""Issue 24 item 3: with recorded input shapes, sequence_imbalance shows the compute follows Σ sequence length².

fixtures/runs/sequence_imbalance (made by fixtures/runs/make_imbalance_runs.py with `record_shapes=True`):
4 DDP ranks, each drawing 4 sequences of one length per step, one rank the long (512) ones; the manifest
lists every rank's length per step.
"""

from __future__ import annotations

import dataclasses
import json

import polars as pl
import pyarrow.parquet as pq
import pytest
from conftest import FIXTURES

import tracediag
from tracediag.analysis import Cause
from tracediag.detect import Thresholds, sequence_imbalance, straggler
from tracediag.reduce import derive_facts

RUN = FIXTURES / "runs" / "sequence_imbalance"


def _files(folder):
    return sorted(folder.glob("rank*.pt.trace.json.gz"))


@pytest.fixture(scope="module")
def facts():
    return derive_facts(tracediag.load(_files(RUN), jobs=1)).facts


def _detect(facts):
    th = Thresholds()
    return sequence_imbalance.detect(facts, thresholds=th, ratios=straggler.rank_step_ratios(facts.steps, th))


def test_each_rank_step_carries_its_batch_sum_of_squares(facts):
    """B·S² from the embedding's recorded token ids: 4 sequences of the length the script drew."""
    details = json.loads((RUN / "manifest.json").read_text())["details"]
    want = {(r, int(s)): 4 * n**2 for s, lens in details["seq_lengths_by_step"].items() for r, n in enumerate(lens)}
    got = {(r, s): q for r, s, q in facts.steps.select("rank", "step", "seq_sq").iter_rows()}
    assert len(got) == 32
    assert got == {k: want[k] for k in got}


def test_the_correlation_is_reported_and_high(facts):
    (f,) = _detect(facts)
    ev = f.evidence
    assert ev["seq_sq_rank_steps"] == 32
    assert ev["compute_seq_sq_r"] >= 0.8
    assert ev["slowest_drew_most"] == len(f.steps) == 8
    assert "Pearson r" in f.summary


def test_without_shapes_no_correlation_is_invented(facts):
    """The same run with its shapes unknown still gives the finding, without the shape evidence; a
    run profiled without `record_shapes` has no seq_sq at all."""
    blind = dataclasses.replace(facts, steps=facts.steps.with_columns(seq_sq=pl.lit(None, pl.Int64)))
    (f,) = _detect(blind)
    assert f.cause == Cause.SEQUENCE_IMBALANCE
    assert not {"compute_seq_sq_r", "seq_sq_rank_steps", "slowest_drew_most"} & set(f.evidence)
    assert "Pearson" not in f.summary
    healthy = tracediag.load(_files(FIXTURES / "runs" / "healthy_ddp"), jobs=1)
    assert healthy.events["seq_sq"].null_count() == healthy.events.height


def test_a_saved_table_from_before_seq_sq_still_loads(tmp_path):
    """`tracediag ingest` Parquet written without the column reads as nulls (an optional column)."""
    run = tracediag.load(_files(RUN), jobs=1)
    path = tmp_path / "run.parquet"
    run.save(path)
    table = pq.read_table(path)
    pq.write_table(table.drop_columns(["seq_sq"]).replace_schema_metadata(table.schema.metadata), path)
    back = tracediag.load([path])
    assert back.events.height == run.events.height
    assert back.events["seq_sq"].null_count() == back.events.height
