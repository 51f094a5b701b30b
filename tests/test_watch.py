"""`tracediag watch` over a real multi-window run replayed as a job writes it (fixtures/watch).

The run's files are copied into a temporary folder one window at a time (and some byte by byte,
as the profiler writes them in place); the watcher follows the folder. The clock is the watcher's
own (`Watcher(clock=...)`), so the timeouts are exact and no test waits for them.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import re
import shutil
import threading
import urllib.request
from typing import TYPE_CHECKING

import orjson
import pytest
from conftest import FIXTURES

import tracediag
from tracediag.cli import cli
from tracediag.report.metrics import WatchMetrics, exposition
from tracediag.watching import Watcher, Window
from tracediag.watching.regress import Detector, Observation, u_test_greater

if TYPE_CHECKING:
    from pathlib import Path

RUN = FIXTURES / "watch" / "straggler_from3"
MANIFEST = json.loads((RUN / "manifest.json").read_text())
FILES: dict[int, dict[int, str]] = {int(k): {int(r): n for r, n in v.items()} for k, v in MANIFEST["files"].items()}
STRAGGLER = MANIFEST["straggler"]["rank"]
FROM = MANIFEST["straggler"]["from_window"]


def copy_window(k: int, dest: Path, ranks: set[int] | None = None) -> None:
    for rank, name in FILES[k].items():
        if ranks is None or rank in ranks:
            shutil.copy(RUN / name, dest / name)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def named(w: Window) -> set[int]:
    """The ranks a window blames: waited for, or named by a straggler finding."""
    blamed = {r for f in w.findings if f.cause.value.endswith("_straggler") for r in f.ranks}
    return blamed | set(w.waited_for)


def test_the_fixture_is_five_windows_of_four_ranks():
    assert MANIFEST["world_size"] == 4
    assert sorted(FILES) == [1, 2, 3, 4, 5]
    assert all(sorted(ranks) == [0, 1, 2, 3] for ranks in FILES.values())
    assert (STRAGGLER, FROM) == (2, 3)


def test_replayed_window_by_window_the_straggler_is_reported_from_its_first_window(tmp_path):
    notices = []
    gen = tracediag.watch(tmp_path, poll_seconds=0.01, window_timeout=3600, on_notice=notices.append)
    windows = []
    for k in sorted(FILES):
        copy_window(k, tmp_path)
        windows.append(next(gen))
    gen.close()
    assert notices == []
    assert [w.index for w in windows] == [1, 2, 3, 4, 5]
    assert [w.key.split(" @ ")[0] for w in windows] == [f"steps {a}-{a + 2}" for a in (2, 7, 12, 17, 22)]
    # the steps analysed: window 2's step 9 is cut on one rank by the recorded window (as `analyze` says)
    assert [w.steps for w in windows] == [(2, 3, 4), (7, 8), (12, 13, 14), (17, 18, 19), (22, 23, 24)]
    assert all(w.ranks == (0, 1, 2, 3) and not w.missing_ranks and not w.error for w in windows)
    for w in windows[: FROM - 1]:
        assert STRAGGLER not in named(w), w.findings
        assert not [c for c in w.changes if c.kind in ("new_straggler", "step_time")]
    first = windows[FROM - 1]
    assert first.findings[0].cause == "compute_straggler"
    assert first.findings[0].ranks == (STRAGGLER,)
    assert first.caused_wait_share_by_rank[STRAGGLER] > 0.9  # (too few collectives to rule out chance: not
    # `waited_for`, which asks P < 1% of being last this often by chance; 3 steps give 1.6%)
    new = [c for c in first.changes if c.kind == "new_straggler"]
    assert [c.ranks for c in new] == [(STRAGGLER,)]
    assert new[0].confidence >= 0.9
    slower = first.slower_than(0.3, 0.9)
    assert slower is not None
    assert slower.value == pytest.approx(first.step_seconds / slower.baseline - 1)
    for w in windows[FROM:]:
        assert STRAGGLER in named(w)
        assert not [c for c in w.changes if c.kind == "new_straggler"]  # not new any more
        assert w.slower_than(0.3, 0.9) is not None  # still slower than the baseline


def test_a_window_has_the_findings_analyze_gives_for_its_files(tmp_path):
    """The reduce over per-file summaries is `analyze`'s: the findings' JSON is the same."""
    copy_window(FROM, tmp_path)
    (w,) = list(tracediag.watch(tmp_path, poll_seconds=0.01, once=True))
    direct = tracediag.analyze(tracediag.load([RUN / n for n in FILES[FROM].values()], jobs=1))
    assert [f.to_dict() for f in w.findings] == [f.to_dict() for f in direct.findings]
    assert w.steps == tuple(direct.step_numbers)
    assert Window.from_dict(orjson.loads(orjson.dumps(w.to_dict()))).to_dict() == w.to_dict()


def test_a_file_being_written_is_read_only_once_complete(tmp_path):
    copy_window(1, tmp_path, {0, 1, 2})
    name = FILES[1][3]
    data = (RUN / name).read_bytes()
    (tmp_path / name).write_bytes(data[: len(data) // 2])  # the profiler is still writing rank 3's file
    clock = Clock()
    watcher = Watcher(str(tmp_path), window_timeout=100, clock=clock)
    for _ in range(4):
        assert watcher.poll() == []
    assert sorted(watcher.grouper.pending[0].parts) == [0, 1, 2]
    with (tmp_path / name).open("ab") as f:
        f.write(data[len(data) // 2 :])
    assert watcher.poll() == []  # the size just changed: not settled yet
    (due,) = watcher.poll()
    assert sorted(due.parts) == [0, 1, 2, 3]


def _cut_json(tmp_path: Path, name: str) -> Path:
    """Rank's file as plain JSON cut right after a complete event: `tracediag load` would read it."""
    raw = gzip.decompress((RUN / name).read_bytes())
    cut = raw.rfind(b"},", 0, len(raw) // 2) + 1
    out = tmp_path / name.removesuffix(".gz")
    out.write_bytes(raw[:cut])
    return out


def test_a_file_truncated_forever_is_left_out_and_its_rank_named(tmp_path):
    copy_window(1, tmp_path, {0, 1, 2})
    cut = _cut_json(tmp_path, FILES[1][3])
    assert tracediag.load([cut], jobs=1).meta.files[0].warnings  # load takes its complete events
    clock, notices = Clock(), []
    watcher = Watcher(str(tmp_path), window_timeout=30, clock=clock, on_notice=notices.append)
    for _ in range(3):
        assert watcher.poll() == []
    assert notices == []
    assert 3 not in watcher.grouper.pending[0].parts
    clock.now = 31
    (due,) = watcher.poll()
    assert [n.reason for n in notices] == ["truncated"]
    assert cut.name in notices[0].message
    w = watcher.analyse(due)
    assert w.missing_ranks == (3,)
    assert w.ranks == (0, 1, 2)
    assert not w.error
    watcher.commit(due, w)
    clock.now = 100
    assert watcher.poll() == []
    assert len(notices) == 1


def test_a_rank_that_never_writes_is_named_after_the_timeout(tmp_path):
    copy_window(1, tmp_path, {0, 1, 3})
    clock = Clock()
    watcher = Watcher(str(tmp_path), window_timeout=60, clock=clock)
    assert watcher.poll() == []
    assert watcher.poll() == []
    clock.now = 59
    assert watcher.poll() == []
    clock.now = 60
    (due,) = watcher.poll()
    w = watcher.analyse(due)
    assert (w.missing_ranks, w.ranks, w.steps) == ((2,), (0, 1, 3), (2, 3, 4))
    watcher.commit(due, w)
    copy_window(1, tmp_path, {2})  # it comes after all: one line, not a second window
    notices = []
    watcher.on_notice = notices.append
    assert watcher.poll() == []
    assert watcher.poll() == []
    assert [n.reason for n in notices] == ["late"]
    assert "window 1" in notices[0].message


def test_a_directory_deleted_under_the_watcher(tmp_path):
    folder = tmp_path / "job"
    folder.mkdir()
    copy_window(1, folder, {0, 1})
    clock, notices = Clock(), []
    watcher = Watcher(str(folder), window_timeout=10, clock=clock, on_notice=notices.append)
    watcher.poll(), watcher.poll()
    shutil.rmtree(folder)
    assert watcher.poll() == []
    assert watcher.poll() == []
    assert [n.reason for n in notices] == ["location_gone"]  # once
    clock.now = 10
    (due,) = watcher.poll()  # what was read is still reported
    assert watcher.analyse(due).missing_ranks == (2, 3)
    # and the generator ends in --once mode instead of waiting
    assert list(tracediag.watch(folder, poll_seconds=0.01, once=True, on_notice=lambda n: None)) == []


def test_a_restarted_watcher_resumes_with_its_state(tmp_path):
    job, state = tmp_path / "job", tmp_path / "state.json"
    job.mkdir()
    for k in (1, 2, 3):
        copy_window(k, job)
    first = list(tracediag.watch(job, poll_seconds=0.01, once=True, state=state))
    assert [w.index for w in first] == [1, 2, 3]
    assert list(tracediag.watch(job, poll_seconds=0.01, once=True, state=state)) == []  # nothing twice
    for k in (4, 5):
        copy_window(k, job)
    later = list(tracediag.watch(job, poll_seconds=0.01, once=True, state=state))
    assert [(w.index, w.steps[0]) for w in later] == [(4, 17), (5, 22)]
    assert later[0].slower_than(0.3, 0.9) is not None  # against windows 1-2, remembered
    assert not [c for c in later[0].changes if c.kind == "new_straggler"]  # window 3 named it already


def test_a_damaged_state_file_is_one_line(tmp_path, runner):
    state = tmp_path / "state.json"
    state.write_text("{not json")
    result = runner.invoke(cli, ["watch", str(tmp_path), "--once", "--state", str(state)])
    assert result.exit_code == 2
    assert "not a watch state file" in result.output
    assert "Traceback" not in result.output


def test_cli_writes_records_and_metrics_and_fails_once_slower(tmp_path, runner):
    job = tmp_path / "job"
    job.mkdir()
    for k in sorted(FILES):
        copy_window(k, job)
    jsonl, prom = tmp_path / "w.jsonl", tmp_path / "w.prom"
    args = ["watch", str(job), "--once", "--poll", "0.01", "--jsonl", str(jsonl), "--metrics-file", str(prom)]
    result = runner.invoke(cli, [*args, "--fail-if-slower", "30"])
    assert result.exit_code == 3, result.output
    records = [orjson.loads(line) for line in jsonl.read_bytes().splitlines()]
    assert [r["window"] for r in records] == [1, 2, 3]  # stopped at the first window that regressed
    assert [c["kind"] for c in records[2]["changes"]][:2] == ["step_time", "new_straggler"]
    assert records[2]["findings"][0]["cause"] == "compute_straggler"
    text = prom.read_text()
    assert "tracediag_windows_analysed_total 3\n" in text
    assert 'tracediag_caused_wait_ratio{rank="2"} 1\n' in text
    assert "tracediag_regressions_total 1\n" in text
    # without the gate it runs through all five; the records append
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert len(jsonl.read_bytes().splitlines()) == 3 + 5


def _families(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


@pytest.mark.parametrize("use_client", [False, True])
def test_metrics_over_http(tmp_path, use_client):
    from tracediag.cli.metrics_http import serve

    if use_client:
        pytest.importorskip("prometheus_client", reason="prometheus-client (the watch extra) is not installed")
    copy_window(FROM, tmp_path)
    metrics = WatchMetrics()
    server, port, _how = serve(metrics, "127.0.0.1", 0, use_client=use_client)
    try:
        for w in tracediag.watch(tmp_path, poll_seconds=0.01, once=True):
            metrics.window(w)
        metrics.notice("truncated")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            body = r.read().decode()
    finally:
        server.shutdown()
    got = _families(body)
    want = _families(exposition(metrics.snapshot()))
    assert got["tracediag_windows_analysed_total"] == 1
    assert got['tracediag_files_skipped_total{reason="truncated"}'] == 1
    assert got['tracediag_caused_wait_ratio{rank="2"}'] == 1
    for key in ('tracediag_step_seconds{rank="0"}', "tracediag_job_step_seconds"):
        assert got[key] == pytest.approx(want[key])


def test_the_watch_runs_in_a_thread_and_stops(tmp_path):
    copy_window(1, tmp_path)
    stop, got = threading.Event(), []

    def run() -> None:
        for w in tracediag.watch(tmp_path, poll_seconds=0.01, stop=stop):
            got.append(w.index)
            stop.set()

    t = threading.Thread(target=run)
    t.start()
    t.join(timeout=60)
    assert not t.is_alive()
    assert got == [1]


def test_u_test_exact_values():
    assert u_test_greater([3, 4, 5], [0.5, 1, 1.1, 1.5, 2, 2.2]) == pytest.approx(1 / 84)  # C(9, 3)
    assert u_test_greater([1, 2, 3], [4, 5, 6]) == pytest.approx(1.0)
    assert u_test_greater([2.5], [1, 2, 3, 4]) == pytest.approx(3 / 5)  # U = 2 of 0..4


def test_one_slow_step_is_not_a_regression():
    d = Detector(baseline_windows=2, slower=0.1, min_confidence=0.9)
    d.observe(Observation(1, (1.0, 1.01, 0.99)))
    d.observe(Observation(2, (1.0, 1.02, 0.98)))
    assert d.observe(Observation(3, (0.99, 1.0, 3.0))) == ()  # a checkpoint step: the median holds
    (change,) = d.observe(Observation(4, (1.3, 1.31, 1.29)))
    assert change.kind == "step_time"
    assert change.value == pytest.approx(0.3, abs=0.01)
    assert change.confidence == pytest.approx(1 - 1 / 84)


def test_docs_list_every_metric_with_its_type():
    from conftest import ROOT

    from tracediag.report.metrics import METRICS

    doc = (ROOT / "docs" / "watch.md").read_text()
    rows = dict(re.findall(r"^\| `(tracediag_\w+)` \| (\w+) \|", doc, flags=re.M))
    assert rows == {name: kind for name, (kind, _) in METRICS.items()}


HAS_MOTO = importlib.util.find_spec("moto") is not None and importlib.util.find_spec("flask") is not None


@pytest.mark.skipif(not HAS_MOTO, reason="no S3 server: pip install -e '.[s3-test]' (moto)")
def test_a_bucket_is_watched_as_objects_land():
    """A real S3 server (moto's, on loopback): windows uploaded one at a time under a prefix."""
    import pyarrow.fs as pafs
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        opts = {
            "aws_endpoint_url": endpoint,
            "aws_access_key_id": "testing",
            "aws_secret_access_key": "testing",
            "aws_region": "us-east-1",
            "aws_allow_http": "true",
        }
        fs = pafs.S3FileSystem(
            access_key="testing", secret_key="testing", endpoint_override=endpoint, region="us-east-1",
            allow_bucket_creation=True,
        )  # fmt: skip
        fs.create_dir("watch")

        def upload(k: int) -> None:
            for name in FILES[k].values():
                with fs.open_output_stream(f"watch/job/{name}", compression=None) as out:
                    out.write((RUN / name).read_bytes())

        upload(1)
        gen = tracediag.watch("s3://watch/job/", poll_seconds=0.05, storage_options=opts, window_timeout=3600)
        got = [next(gen)]
        for k in (2, 3):
            upload(k)
            got.append(next(gen))
        gen.close()
    finally:
        server.stop()
    assert [w.index for w in got] == [1, 2, 3]
    assert all(f.startswith("s3://watch/job/") for w in got for f in w.files)
    assert [(c.kind, c.ranks) for c in got[2].changes if c.kind == "new_straggler"] == [("new_straggler", (2,))]


def test_skewed_file_times_do_not_matter(tmp_path):
    """File modification times only tell a file changed: one from 1970 and one from next year group."""
    copy_window(1, tmp_path)
    names = list(FILES[1].values())
    os.utime(tmp_path / names[0], (0, 0))
    os.utime(tmp_path / names[1], (4e9, 4e9))
    (w,) = list(tracediag.watch(tmp_path, poll_seconds=0.01, once=True))
    assert w.ranks == (0, 1, 2, 3)
    assert w.steps == (2, 3, 4)


def test_a_window_carries_its_mfu_against_the_jobs_plan(tmp_path, runner):
    """Two real A100 ranks (HTA's NCCL sample) watched with a saved plan: the window's MFU is the one
    `analyze --plan` gives for the same files (the plan's FLOPs over the observed step, peak and GPUs),
    in the record, the line and the metrics."""
    from tracediag.model.predict import load_prediction
    from tracediag.observed_vs_predicted import check

    job = tmp_path / "job"
    job.mkdir()
    pair = [FIXTURES / "kineto" / f"hta_a100_nccl_rank{r}.json.gz" for r in (0, 1)]
    for p in pair:
        shutil.copy(p, job / p.name)
    plan = tmp_path / "plan.json"
    model = ["--model", "tiny", "--gpu", "a100-80gb", "--seq-len", "512", "--global-batch", "16", "--gpus", "2"]
    assert runner.invoke(cli, ["predict", *model, "-o", str(plan)]).exit_code == 0
    prediction = load_prediction(plan)
    want = next(c for c in check(tracediag.analyze(tracediag.load(pair)), prediction).components if c.name == "mfu")
    assert want.observed is not None
    assert 0 < want.observed < 1
    (window,) = tracediag.watch(job, once=True, poll_seconds=0.01, prediction=prediction)
    assert window.mfu == pytest.approx(want.observed)
    assert window.mfu_predicted == pytest.approx(prediction.mfu)
    records = tmp_path / "w.jsonl"
    metrics = tmp_path / "m.prom"
    args = ["watch", str(job), "--once", "--poll", "0.01", "--plan", str(plan), "--jsonl", str(records)]
    result = runner.invoke(cli, [*args, "--metrics-file", str(metrics)])
    assert result.exit_code == 0, result.output
    assert f"MFU {want.observed:.1%}" in result.stdout
    assert orjson.loads(records.read_text().splitlines()[0])["mfu"] == pytest.approx(want.observed)
    assert re.search(r"^tracediag_mfu_ratio [0-9.e-]+$", metrics.read_text(), re.M)
    (plain,) = tracediag.watch(job, once=True, poll_seconds=0.01)
    assert plain.mfu is None


def test_a_plan_that_is_no_prediction_is_one_line(tmp_path, runner):
    bad = tmp_path / "plan.json"
    bad.write_text('{"inputs": 3}')
    result = runner.invoke(cli, ["watch", str(tmp_path), "--once", "--plan", str(bad)])
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
