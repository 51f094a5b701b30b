"""The default analysis summarises rank by rank in this process (issue 31 item 1), holding the summaries, not
the events: its JSON, warnings, errors and skipped counts equal the in-memory path's (`events=True`) on every
real run and Kineto fixture, with a rank's profiler windows in different groups, in worker processes, with a
damaged file and a file that is not a trace."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import FIXTURES, KINETO, RUNS

from tracediag.cli import cli
from tracediag.errors import TracediagError
from tracediag.execute import streamed
from tracediag.execute.driver import analyze_sources
from tracediag.report.analyses import analyses_json

INPUTS = [p for p in sorted(RUNS.iterdir()) if p.is_dir()] + [
    [
        KINETO / "gen_torch2.13cpu_gloo_2rank_rank0.pt.trace.json.gz",
        KINETO / "gen_torch2.13cpu_gloo_2rank_rank1.pt.trace.json.gz",
    ],
    [KINETO / "hta_a100_nccl_rank0.json.gz", KINETO / "hta_a100_nccl_rank1.json.gz"],
    *sorted(p for p in KINETO.iterdir() if p.name.endswith((".json", ".json.gz"))),
    *sorted((FIXTURES / "timeline").glob("*.*.gz")),  # op-timeline tables: one file, several ranks
    *sorted((FIXTURES / "timeline").glob("*.parquet")),
    *[p for p in sorted((FIXTURES / "readers_runs").iterdir()) if p.is_dir()],
    sorted((FIXTURES / "nsys").glob("constructed_gpu_rank*.sqlite.gz")),
    sorted((FIXTURES / "jax").glob("gen_jax0.10.2_cpu2proc_p*.trace.json.gz")),
]


def _outcome(sources, **kw) -> tuple[str, tuple[str, ...] | None, dict | None]:
    """The JSON of the analysis (or the error), the unreadable files and the skipped counts."""
    seen = []
    try:
        got = analyze_sources(sources, on_read=seen.append, **kw)
    except (TracediagError, ValueError) as e:
        return f"{type(e).__name__}: {e}", None, None
    meta = seen[0]
    return analyses_json(got.results), (meta.errors, meta.ignored), meta.skipped


@pytest.mark.parametrize("sources", INPUTS, ids=lambda s: s.name if hasattr(s, "name") else s[0].name)
def test_default_equals_the_in_memory_analysis(sources):
    in_memory = _outcome(sources, events=True)
    assert _outcome(sources) == in_memory
    if isinstance(sources, Path) and sources.parent in (RUNS, FIXTURES / "timeline"):  # each analyses
        assert in_memory[0].startswith("{")


def test_default_keeps_no_events_and_in_memory_does():
    run = RUNS / "straggler_persistent"
    assert analyze_sources(run).run is None
    assert analyze_sources(run, events=True).run.events.height > 0


def test_windows_of_a_rank_in_different_groups_are_summarised_together(monkeypatch):
    run = RUNS / "windows_repeat2"
    in_memory = _outcome(run, events=True)
    monkeypatch.setattr(streamed, "STREAM_GROUP", 1)  # each file its own group: every rank's windows split
    assert _outcome(run) == in_memory
    assert '"world_size":4' in in_memory[0]  # eight windows of four ranks


def test_files_read_alone_are_summarised_together_up_to_stream_bytes(monkeypatch):
    import tracediag.run as run_module

    run = RUNS / "slow_node_6"
    in_memory = _outcome(run, events=True)
    monkeypatch.setattr(run_module, "SMALL_FILE_BYTES", 0)  # every file read alone, as a large one is
    groups: list[int] = []
    summarize = streamed.summarize_group
    monkeypatch.setattr(streamed, "summarize_group", lambda args: groups.append(len(args[0])) or summarize(args))
    assert _outcome(run) == in_memory
    files = sum(1 for p in run.iterdir() if p.is_file())
    assert groups == [files]  # a few MB in all: one group
    groups.clear()
    monkeypatch.setattr(streamed, "STREAM_BYTES", 0)
    assert _outcome(run) == in_memory
    assert groups == [1] * files


def test_worker_processes_give_the_same_analysis(monkeypatch):
    run = RUNS / "slow_node_6"
    monkeypatch.setattr(streamed, "STREAM_GROUP", 2)
    assert _outcome(run, jobs=2) == _outcome(run, events=True)


def test_a_damaged_file_and_a_file_not_a_trace_are_reported_as_in_memory(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RUNS / "straggler_persistent", run)
    (run / "rank3.pt.trace.json.gz").write_bytes(b"\x1f\x8b\x08\x00 not gzip")
    (run / "manifest.json").write_bytes(b'{"job": "not a trace"}')
    got = _outcome(run)
    assert got == _outcome(run, events=True)
    (errors, ignored) = got[1]
    assert len(errors) == 1
    assert "rank3.pt.trace.json.gz" in errors[0]
    assert len(ignored) == 1
    assert "manifest.json" in ignored[0]


def test_progress_is_called_once_per_file():
    run = RUNS / "slow_node_6"
    done: list[str] = []
    analyze_sources(run, on_file_done=done.append)
    in_memory: list[str] = []
    analyze_sources(run, events=True, on_file_done=in_memory.append)
    assert sorted(done) == sorted(in_memory) == sorted(str(p) for p in run.iterdir() if p.is_file())


def test_two_files_claiming_one_rank_are_refused_as_in_memory(tmp_path):
    a = tmp_path / "a.json.gz"
    b = tmp_path / "b.json.gz"
    shutil.copy(RUNS / "straggler_persistent" / "rank0.pt.trace.json.gz", a)
    shutil.copy(RUNS / "straggler_persistent" / "rank0.pt.trace.json.gz", b)
    got = _outcome([a, b])
    assert got == _outcome([a, b], events=True)
    assert "both claim rank 0" in got[0]


def test_a_saved_run_is_read_whole(tmp_path):
    from tracediag.run import load

    saved = tmp_path / "run.parquet"
    load(RUNS / "straggler_persistent").save(saved)
    assert analyze_sources(saved).run is not None
    assert _outcome(saved)[0] == _outcome(RUNS / "straggler_persistent")[0]
    assert FIXTURES.is_dir()


MODEL = [
    "--model",
    "tiny",
    "--gpu",
    "h100-sxm",
    "--dp",
    "4",
    "--gpus",
    "4",
    "--seq-len",
    "2048",
    "--global-batch",
    "64",
]


@pytest.mark.parametrize(
    ("option", "events"), [(None, False), ("--html", True), ("--perfetto", True), ("--model", True)]
)
def test_the_command_reads_every_event_only_for_outputs_that_draw_or_count_them(
    option, events, runner, tmp_path, monkeypatch
):
    from tracediag.execute import driver

    asked = []
    real = driver.analyze_sources
    monkeypatch.setattr(driver, "analyze_sources", lambda *a, **kw: asked.append(kw["events"]) or real(*a, **kw))
    args = ["analyze", str(RUNS / "straggler_persistent"), "--format", "json"]
    args += MODEL if option == "--model" else [option, str(tmp_path / "out")] if option else []
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert asked == [events]


def test_files_of_different_runs_are_refused_or_analysed_each_alone_as_in_memory():
    files = [
        KINETO / "gen_torch2.13cpu_gloo_2rank_rank0.pt.trace.json.gz",
        RUNS / "comm_bound" / "rank1.pt.trace.json.gz",
    ]
    refused = _outcome(files)
    assert refused == _outcome(files, events=True)
    assert "world sizes differ" in refused[0]
    each = _outcome(files, per_file=True)
    assert each == _outcome(files, events=True, per_file=True)
    assert each[0].count('"file":') == 2
