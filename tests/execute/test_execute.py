"""Per-rank summaries on local worker processes, a real Ray cluster and a real Dask cluster (issue 12).

Each engine's results must equal the in-memory analysis (`tracediag.analyze(load(...))`) exactly, the
what-if pricing included (its per-rank half travels as the ``replay_*`` tables); engines must equal each
other fully;
a worker killed mid-run is retried; a file failing every retry is an error row. The engines start
once per module (Ray ~3 s, Dask ~0.5 s) and stop at its end.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import _faults
import orjson
import polars as pl
import pytest
from conftest import FIXTURES, loadable_runs
from polars.testing import assert_frame_equal

import tracediag
from tracediag.cli import cli
from tracediag.derive.summary import RankSummary
from tracediag.execute.driver import analyze_ranks, summarize

RUNS = FIXTURES / "runs"
CASES = ["healthy_tp_dp", "pipeline_1f1b_m8", "straggler_persistent"]
"""Split process groups matched by occurrence, point-to-point pipelines, a straggler."""
EVERY_RUN = [p.name for p in loadable_runs()]
KINETO_GLOO0 = FIXTURES / "kineto" / "gen_torch2.13cpu_gloo_2rank_rank0.pt.trace.json.gz"
GPU_PAIR = [FIXTURES / "kineto" / f"hta_a100_nccl_rank{r}.json.gz" for r in (0, 1)]
"""Two real A100 ranks (NCCL kernels): the host-feed table, the GPU kernel view and a host_bound finding."""

HAS_RAY = importlib.util.find_spec("ray") is not None
HAS_DASK = importlib.util.find_spec("distributed") is not None
needs_ray = pytest.mark.skipif(not HAS_RAY, reason="ray is not installed (pip install 'tracediag[ray]')")
needs_dask = pytest.mark.skipif(not HAS_DASK, reason="dask is not installed (pip install 'tracediag[dask]')")


def _by_value(module) -> None:
    """Ship the test's task functions to workers by value (they cannot import the tests)."""
    import cloudpickle

    cloudpickle.register_pickle_by_value(module)
    if HAS_RAY:
        import ray.cloudpickle

        ray.cloudpickle.register_pickle_by_value(module)


@pytest.fixture(scope="module", autouse=True)
def _faults_importable():
    """The local engine's workers import the task functions of `_faults` by name."""
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(_faults.__file__).parent), path) if p)
    yield
    if path is None:
        del os.environ["PYTHONPATH"]
    else:
        os.environ["PYTHONPATH"] = path


@pytest.fixture(scope="module")
def engines():
    """Engine name -> extra `summarize` arguments: a local Ray cluster and a Dask LocalCluster, shared."""
    os.environ.pop("RAY_ADDRESS", None)
    out = {"local": {}}
    cluster = None
    if HAS_RAY:
        import ray

        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        out["ray"] = {}
    if HAS_DASK:
        from distributed import LocalCluster

        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
        out["dask"] = {"address": cluster.scheduler_address}
    if HAS_RAY or HAS_DASK:
        _by_value(_faults)
    yield out
    if HAS_RAY:
        ray.shutdown()
    if cluster is not None:
        cluster.close()


@pytest.fixture(scope="module")
def expected():
    """The in-memory analysis of each case, the reference every executor must reproduce."""
    return {c: tracediag.analyze(tracediag.load(RUNS / c, jobs=1)).to_dict() for c in CASES}


ENGINES = [
    "local",
    pytest.param("ray", marks=needs_ray),
    pytest.param("dask", marks=needs_dask),
]


@pytest.mark.parametrize("engine", ENGINES)
def test_engine_reproduces_in_memory_analysis(engine, engines, expected, tmp_path):
    for case in CASES:
        analysis, summaries = analyze_ranks(
            RUNS / case, out=str(tmp_path / case), executor=engine, workers=2, **engines[engine]
        )
        doc = analysis.to_dict()
        assert doc == expected[case], f"{engine} on {case}"
        assert doc["whatif"]["steps"]
        assert not [w for w in doc["warnings"] if "what-if" in w]
        if case == "straggler_persistent":  # a finding priced by the replay, from the summaries
            assert doc["findings"][0]["step_time_without_ns"] < doc["whatif"]["step_time_ns"]
        ok = summaries.manifest.filter("ok")
        assert ok["rank"].sort().to_list() == [0, 1, 2, 3]
        assert ok["attempt"].to_list() == [1, 1, 1, 1]
        # the manifest.json beside the traces is listed as ignored, not as a failure
        assert summaries.meta.errors == ()
        assert len(summaries.meta.ignored) == 1


def test_local_executor_prices_every_run_as_in_memory(tmp_path):
    """The what-if (time lost, step time without each cause, the combined what-if per step) from
    summaries equals the in-memory one on every fixture run: pipelines paired by their schedule
    annotations, stragglers, input and host waits, communication."""
    priced = 0
    for case in [c for c in EVERY_RUN if c not in CASES]:
        want = tracediag.analyze(tracediag.load(RUNS / case, jobs=1)).to_dict()
        analysis, _ = analyze_ranks(RUNS / case, out=str(tmp_path / case), executor="local", workers=1)
        doc = analysis.to_dict()
        assert doc == want, case
        assert doc["whatif"]["steps"], case
        priced += sum(f["step_time_without_ns"] is not None for f in doc["findings"])
    assert priced >= 4  # straggler, input, comm and pipeline findings priced by the replay


@pytest.mark.parametrize("engine", [pytest.param("ray", marks=needs_ray), pytest.param("dask", marks=needs_dask)])
def test_engine_tables_equal_local_tables(engine, engines, tmp_path):
    sizes = {}
    for case, run in [
        ("pipeline_1f1b_m8", RUNS / "pipeline_1f1b_m8"),
        ("healthy_tp_dp", RUNS / "healthy_tp_dp"),
        ("a100", GPU_PAIR),
    ]:
        local = summarize(run, out=str(tmp_path / case / "local"), executor="local", workers=2).summary().tables()
        out = str(tmp_path / case / engine)
        other = summarize(run, out=out, executor=engine, workers=2, **engines[engine]).summary().tables()
        for name, frame in local.items():
            assert_frame_equal(other[name], frame)
            sizes[name] = sizes.get(name, 0) + frame.height
    assert min(sizes.values()) > 0  # every table compared on rows, not only on its schema


def test_gpu_ranks_from_summaries_equal_in_memory_with_kernel_view_and_host_feed(tmp_path):
    """Issue 11's per-rank derivations (host feed, kernel view) come from the workers' tables."""
    want = tracediag.analyze(tracediag.load(GPU_PAIR, jobs=1)).to_dict()
    analysis, _ = analyze_ranks(GPU_PAIR, out=str(tmp_path / "s"), executor="local", workers=2)
    doc = analysis.to_dict()
    assert doc == want
    assert {k["category"] for k in doc["kernels"]} >= {"compute", "communication"}
    assert len(doc["kernel_categories"]) > 0
    assert "host_bound" in [f["cause"] for f in doc["findings"]]  # read from the per-rank host table


def test_files_of_different_runs_are_refused_from_summaries(tmp_path):
    """The run checks read the manifest's metadata and the per-rank extents: two consecutive runs."""
    files = [RUNS / "comm_bound" / "rank0.pt.trace.json.gz", RUNS / "healthy_ddp" / "rank1.pt.trace.json.gz"]
    with pytest.raises(tracediag.MixedRunError, match="time spans do not overlap") as e:
        analyze_ranks(files, out=str(tmp_path / "a"), executor="local", workers=2)
    with pytest.raises(tracediag.MixedRunError) as mem:
        tracediag.analyze(tracediag.load(files, jobs=1))
    assert str(e.value) == str(mem.value)
    analysis, _ = analyze_ranks(files, out=str(tmp_path / "b"), executor="local", workers=2, allow_mixed=True)
    assert analysis.to_dict() == tracediag.analyze(tracediag.load(files, jobs=1), allow_mixed=True).to_dict()


def test_cli_allow_mixed_with_executor_analyses_each_file_as_in_memory(runner, tmp_path):
    files = [str(KINETO_GLOO0), str(RUNS / "comm_bound" / "rank1.pt.trace.json.gz")]
    args = ["analyze", *files, "--allow-mixed", "--format", "json"]
    mem = runner.invoke(cli, args)
    ex = runner.invoke(cli, [*args, "--executor", "local", "--out", str(tmp_path / "s")])
    assert mem.exit_code == ex.exit_code == 0, ex.output
    want, got = orjson.loads(mem.stdout)["per_file"], orjson.loads(ex.stdout)["per_file"]
    assert [d["file"] for d in got] == [d["file"] for d in want]
    assert len(got) == 2
    assert got == want
    refused = runner.invoke(cli, ["analyze", *files, "--executor", "local", "--out", str(tmp_path / "t")])
    assert refused.exit_code == 2
    assert "world sizes differ" in refused.output


@pytest.mark.parametrize("engine", ENGINES)
def test_worker_killed_mid_run_is_retried(engine, engines, expected, tmp_path):
    case = "straggler_persistent"
    analysis, summaries = analyze_ranks(
        RUNS / case,
        out=str(tmp_path),
        executor=engine,
        workers=2,
        task_fn=_faults.crash_first_attempt,
        **engines[engine],
    )
    rows = {r["rank"]: r for r in summaries.manifest.filter("ok").iter_rows(named=True)}
    assert rows[_faults.CRASH_RANK]["attempt"] == 2  # the first attempt's worker died; the retry finished
    assert analysis.to_dict() == expected[case]
    # nothing twice: one table file per rank and name, no temporary file left
    names = sorted(p.name for p in (tmp_path / "ranks" / f"rank={_faults.CRASH_RANK:05d}").iterdir())
    assert names == sorted(f"{t}.parquet" for t in RankSummary.names())
    assert not [p for p in tmp_path.rglob("*") if ".tmp-" in p.name]


def test_file_failing_every_retry_is_an_error_row_and_the_rest_is_analysed(tmp_path):
    case = "straggler_persistent"
    analysis, summaries = analyze_ranks(
        RUNS / case, out=str(tmp_path), executor="local", workers=2, retries=1, task_fn=_faults.storage_fails
    )
    (error,) = summaries.meta.errors
    assert error.startswith(str(RUNS / case / "rank2.pt.trace.json.gz"))
    assert "failed after 2 attempt(s): OSError: cannot write under" in error
    assert analysis.ranks == (0, 1, 3)
    assert error in analysis.warnings
    # one file per task here (5 files, 2 workers): tried, then retried once
    assert (tmp_path / "storage_fails.log").read_text().splitlines() == ["1", "1"]


def test_a_failing_task_of_several_files_is_split_and_each_file_tried_alone(tmp_path):
    case = "straggler_persistent"
    analysis, summaries = analyze_ranks(
        RUNS / case, out=str(tmp_path), executor="local", workers=2, retries=0, files_per_task=3,
        task_fn=_faults.storage_fails,
    )  # fmt: skip
    # tasks [manifest.json, rank0, rank1] and [rank2, rank3]: the second failed, then rank 2's file failed
    # alone and rank 3's was summarised
    assert (tmp_path / "storage_fails.log").read_text().splitlines() == ["2", "1"]
    (error,) = summaries.meta.errors
    assert error.startswith(str(RUNS / case / "rank2.pt.trace.json.gz"))
    assert analysis.ranks == (0, 1, 3)


def test_several_files_per_task_give_the_tables_of_one_file_per_task(tmp_path):
    run = RUNS / "healthy_tp_dp"
    one = summarize(run, out=str(tmp_path / "one"), executor="local", workers=2, files_per_task=1)
    four = summarize(run, out=str(tmp_path / "four"), executor="local", workers=1, files_per_task=5)
    assert four.manifest["worker"].n_unique() == 1  # all five files (four traces, one sidecar) in one task
    for name, frame in one.summary().tables().items():
        assert_frame_equal(four.summary().tables()[name], frame)


def test_cli_bad_file_exits_2_unless_allow_missing_and_resume_skips_finished(runner, tmp_path):
    traces = tmp_path / "traces"
    traces.mkdir()
    for p in sorted((RUNS / "straggler_persistent").glob("rank*.json.gz")):
        (traces / p.name).write_bytes(p.read_bytes())
    bad = traces / "rank3.pt.trace.json.gz"
    bad.write_bytes(bad.read_bytes()[:5000])  # cut short: a real gzip stream truncated
    out = tmp_path / "out"
    args = ["analyze", str(traces), "--executor", "local", "-j", "2", "--out", str(out), "--format", "json"]
    result = runner.invoke(cli, args)
    assert result.exit_code == 2
    doc = orjson.loads(result.stdout)
    assert doc["run"]["ranks"] == [0, 1, 2]
    assert f"Error: {bad}:" in result.stderr
    assert "files 4/4 · ranks 3 · failed 1" in result.stderr
    first = pl.read_parquet(out / "manifest.parquet")
    result = runner.invoke(cli, [*args, "--resume", "--allow-missing"])
    assert result.exit_code == 0
    again = pl.read_parquet(out / "manifest.parquet")
    # the three finished ranks were not run again (same worker, same seconds); the bad file was
    kept = first.filter("ok").select("path", "worker", "seconds")
    assert_frame_equal(again.filter("ok").select("path", "worker", "seconds"), kept)
    assert again.filter(~pl.col("ok"))["attempt"].to_list() == [2]


def test_ingest_executor_writes_each_ranks_events(runner, tmp_path):
    run = RUNS / "healthy_ddp"
    result = runner.invoke(cli, ["ingest", str(run), "--executor", "local", "-j", "2", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    whole = tracediag.load(run, jobs=1).events
    for rank in range(4):
        part = pl.read_parquet(tmp_path / "events" / f"rank={rank:05d}.parquet")
        assert_frame_equal(part, whole.filter(pl.col("rank") == rank))
    assert "ranks   4 (0..3) of world size 4" in result.stdout


def test_attaching_without_out_is_refused_before_any_work(runner, monkeypatch):
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", "tcp://127.0.0.1:1")
    result = runner.invoke(cli, ["analyze", str(RUNS / "comm_bound"), "--executor", "dask"])
    assert result.exit_code == 2
    assert "give --out on storage both reach" in result.stderr


def test_missing_engine_is_one_line_naming_the_extra(tmp_path):
    # Ray made unimportable in a fresh interpreter, as on an install without the extra
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "from tracediag.cli import main\n"
        f"sys.argv = ['tracediag', 'analyze', {str(RUNS / 'comm_bound')!r}, '--executor', 'ray']\n"
        "main()\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == "Error: --executor ray needs Ray: pip install 'tracediag[ray]'"


def test_local_executor_in_a_script_without_main_guard(tmp_path):
    # multiprocessing's spawn would run this script again in every worker; these workers import only tracediag
    script = tmp_path / "noguard.py"
    script.write_text(
        "from tracediag.execute.driver import analyze_ranks\n"
        f"analysis, s = analyze_ranks({str(RUNS / 'comm_bound')!r}, executor='local', workers=2)\n"
        "import os, socket; me = f'{socket.gethostname()}:{os.getpid()}'\n"
        "print(list(analysis.ranks), me in s.manifest['worker'].to_list())\n"
    )
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split("\n")[0] == "[0, 1, 2, 3] False"  # read in worker processes, not here


def test_resume_redoes_ranks_whose_events_an_ingest_needs(tmp_path):
    run = RUNS / "comm_bound"
    summarize(run, out=str(tmp_path), executor="local", workers=2)  # analyze's summaries: no events
    again = summarize(run, out=str(tmp_path), executor="local", workers=2, resume=True, keep_events=True)
    assert again.manifest.filter("ok")["attempt"].to_list() == [2, 2, 2, 2]
    assert sorted(p.name for p in (tmp_path / "events").iterdir()) == [f"rank={r:05d}.parquet" for r in range(4)]


def test_resume_redoes_summaries_without_the_replay_tables_and_prices_as_in_memory(tmp_path):
    """Summaries of a version before the what-if's per-rank tables (no ``replay_*`` files, a manifest
    naming the older tables) are redone by --resume, and the analysis is priced."""
    run = RUNS / "straggler_persistent"
    summarize(run, out=str(tmp_path), executor="local", workers=2)
    older = ",".join(sorted(t for t in RankSummary.names() if not t.startswith("replay_")))
    for done in (tmp_path / "done").glob("*.parquet"):
        pl.read_parquet(done).with_columns(pl.lit(older).alias("tables")).write_parquet(done)
    for stale in (tmp_path / "ranks").rglob("replay_*.parquet"):
        stale.unlink()
    analysis, summaries = analyze_ranks(run, out=str(tmp_path), executor="local", workers=2, resume=True)
    assert summaries.manifest.filter("ok")["attempt"].to_list() == [2, 2, 2, 2]
    assert analysis.to_dict() == tracediag.analyze(tracediag.load(run, jobs=1)).to_dict()
    assert analysis.findings[0].step_time_without_ns is not None


def test_resume_redoes_summaries_written_with_other_tables(tmp_path):
    run = RUNS / "comm_bound"
    summarize(run, out=str(tmp_path), executor="local", workers=2)
    # a summary folder from a version whose per-rank tables differ: its manifest rows name other tables
    for done in (tmp_path / "done").glob("*.parquet"):
        pl.read_parquet(done).with_columns(pl.lit("spans,breakdown").alias("tables")).write_parquet(done)
    again = summarize(run, out=str(tmp_path), executor="local", workers=2, resume=True)
    assert again.manifest.filter("ok")["attempt"].to_list() == [2, 2, 2, 2]
