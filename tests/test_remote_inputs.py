"""Trace inputs named by URL (issue 12): listed on the driver, each object streamed by its reader.

``file://`` URLs go through the same `pyarrow.fs` path as an object store; a real S3 server (moto's,
on loopback, from the ``s3-test`` extra) checks the S3 client itself: listing, ranged reads, the
errors (missing object, access denied), ``--resume`` from the listing's sizes and times, and
summaries written back to the bucket. A URL's results must equal those of the same files on disk,
in memory and with ``--executor local``.
"""

from __future__ import annotations

import gzip
import importlib.util
import os
import shutil
import socket
import urllib.request
from pathlib import Path

import orjson
import polars as pl
import pyarrow.fs as pafs
import pytest
from conftest import FIXTURES
from polars.testing import assert_frame_equal

import tracediag
from tracediag.cli import cli
from tracediag.errors import OutputError, TracediagError
from tracediag.execute.driver import analyze_ranks, summarize
from tracediag.ingest.read import read_file
from tracediag.ingest.remote import expand, fs_kwargs, location_key
from tracediag.output import refuse_inputs, refuse_inputs_under

RUN = FIXTURES / "runs" / "straggler_persistent"
NSYS = FIXTURES / "nsys" / "constructed_gpu_rank0.sqlite.gz"
JAX = [FIXTURES / "jax" / f"gen_jax0.10.2_cpu2dev.{kind}" for kind in ("trace.json.gz", "xplane.pb.gz")]
"""A real JAX trace and the xplane.pb beside it that places it in epoch time."""
HAS_MOTO = importlib.util.find_spec("moto") is not None and importlib.util.find_spec("flask") is not None
needs_moto = pytest.mark.skipif(not HAS_MOTO, reason="no S3 server: pip install -e '.[s3-test]' (moto)")


def _renamed(doc: object, old: str, new: str) -> object:
    """`doc` (an analysis as JSON) with the file locations `old` written as `new`."""
    return orjson.loads(orjson.dumps(doc).decode().replace(old, new))


def _copy_run(dest: Path) -> Path:
    shutil.copytree(RUN, dest)
    return dest


# ------------------------------------------------------------------------------------ file:// URLs


def test_file_url_run_equals_the_files_on_disk_in_memory(tmp_path):
    run = _copy_run(tmp_path / "run")
    disk = tracediag.load(run, jobs=1)
    for source in (f"file://{run}/*.json.gz", f"file://{run}/"):
        url = tracediag.load(source, jobs=1)
        assert_frame_equal(url.events, disk.events)
        assert [f.path for f in url.meta.files] == [f"file://{f.path}" for f in disk.meta.files]
    want = tracediag.analyze(disk).to_dict()
    got = tracediag.analyze(url).to_dict()
    assert got["findings"]
    assert _renamed(got, "file://", "") == want


@pytest.fixture(scope="module")
def on_disk(tmp_path_factory):
    """The local executor's analysis and summaries of the run's files on disk: what a URL run must equal."""
    return analyze_ranks(RUN, out=str(tmp_path_factory.mktemp("disk")), executor="local", workers=2)


def test_file_url_run_equals_the_files_on_disk_with_local_executor(on_disk, tmp_path):
    disk, disk_s = on_disk
    url, url_s = analyze_ranks(f"file://{RUN}", out=str(tmp_path / "url"), executor="local", workers=2)
    assert _renamed(url.to_dict(), "file://", "") == disk.to_dict()
    for name, frame in disk_s.summary().tables().items():
        assert_frame_equal(url_s.summary().tables()[name], frame)
    # the manifest's bytes and mtime (what --resume compares) are the files' own
    for row in url_s.manifest.iter_rows(named=True):
        st = Path(row["path"].removeprefix("file://")).stat()
        assert (row["bytes"], row["mtime_ns"]) == (st.st_size, st.st_mtime_ns)


def test_with_an_executor_the_driver_lists_and_never_reads_a_trace(tmp_path, monkeypatch):
    from tracediag.ingest import remote, sniff

    def refuse(url, *args, **kw):
        msg = f"the driver opened {url}"
        raise AssertionError(msg)

    run = _copy_run(tmp_path / "run")
    monkeypatch.setattr(remote, "open_stream", refuse)  # in this process only: the workers read
    monkeypatch.setattr(sniff, "open_stream", refuse)
    s = summarize(f"file://{run}/*.json.gz", out=str(tmp_path / "out"), executor="local", workers=2)
    assert s.ranks == [0, 1, 2, 3]
    with pytest.raises(AssertionError, match="the driver opened"):
        tracediag.load(f"file://{run}/rank0.pt.trace.json.gz", jobs=1)  # in memory, this process reads


def test_saved_run_at_a_url_loads_back_exactly(tmp_path):
    run = tracediag.load(RUN, jobs=1)
    run.save(tmp_path / "run.parquet")
    again = tracediag.load(f"file://{tmp_path}/run.parquet")
    assert_frame_equal(again.events, run.events)
    assert again.meta == run.meta


def test_url_glob_matches_components_and_double_star_spans_folders(tmp_path):
    for rel in ("a/r0.json.gz", "a/b/r1.json.gz", "a/b/c/r2.json.gz", "a/x.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"{}")
    names = lambda pattern: [f.url.rsplit("/a/", 1)[1] for f in expand(f"file://{tmp_path}/{pattern}")]  # noqa: E731
    assert names("a/*.json.gz") == ["r0.json.gz"]  # one component: not into b/
    assert names("a/*/*.json.gz") == ["b/r1.json.gz"]
    assert names("a/**/*.json.gz") == ["b/c/r2.json.gz", "b/r1.json.gz", "r0.json.gz"]
    assert names("a/b/r[0-1].json.gz") == ["b/r1.json.gz"]
    with pytest.raises(TracediagError, match="the pattern matches no object"):
        expand(f"file://{tmp_path}/a/*.sqlite")
    found = expand(f"file://{tmp_path}/a", suffixes=(".json.gz",))  # a prefix: searched as a directory
    assert [f.in_directory for f in found] == [True, True, True]
    assert [f.size for f in found] == [2, 2, 2]


def test_stream_errors_are_one_line_naming_the_url(runner, tmp_path):
    good = RUN / "rank0.pt.trace.json.gz"
    (tmp_path / "cut.json.gz").write_bytes(good.read_bytes()[:5000])
    (tmp_path / "image.json").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))
    (tmp_path / "plain.json.gz").write_bytes(gzip.decompress(good.read_bytes()))  # named .gz, not gzipped
    base = f"file://{tmp_path}"
    with pytest.raises(TracediagError, match=r"^file://.*/missing\.json: no such object$"):
        read_file(f"{base}/missing.json")
    with pytest.raises(TracediagError, match=r"^file://.*/cut\.json\.gz: corrupt gzip data \(Compressed file ended"):
        read_file(f"{base}/cut.json.gz")
    with pytest.raises(TracediagError, match=r"^file://.*/image\.json: not a trace: the file is a PNG image$"):
        read_file(f"{base}/image.json")
    # the content decides, not the name: a plain JSON named .gz reads as the gzipped original
    assert_frame_equal(read_file(f"{base}/plain.json.gz").events, read_file(good).events)
    result = runner.invoke(cli, ["analyze", f"{base}/missing.json", f"{base}/cut.json.gz"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2
    assert all(line.startswith(f"Error: {base}/") for line in lines)


def test_unreachable_store_is_retried_then_one_line_naming_the_url(runner):
    # an S3 endpoint on a loopback port nobody listens on: a storage error, not a bad trace
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    opts = {"aws_endpoint_url": f"http://127.0.0.1:{port}", "aws_access_key_id": "x", "aws_secret_access_key": "x"}
    flags = [arg for k, v in {**opts, "aws_region": "us-east-1"}.items() for arg in ("--storage-option", f"{k}={v}")]
    url = "s3://bucket/run/rank0.json.gz"
    result = runner.invoke(cli, ["analyze", url, "--executor", "local", "--retries", "1", *flags])
    assert result.exit_code == 2
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"Error: {url}: failed after 2 attempt(s): OSError: {url}: cannot read (")


def test_gzip_cap_on_a_stream_uses_the_objects_size(tmp_path, monkeypatch):
    from tracediag.ingest import sniff

    monkeypatch.setattr(sniff, "GUNZIP_FLOOR", 1 << 20)
    doc = gzip.decompress((RUN / "rank0.pt.trace.json.gz").read_bytes())
    at = doc.index(b'"traceEvents"')
    (tmp_path / "bomb.json.gz").write_bytes(gzip.compress(doc[:at] + b'"x": "' + b"a" * (32 << 20) + b'", ' + doc[at:]))
    with pytest.raises(TracediagError, match=r"^file://.*/bomb\.json\.gz: gzip data expands past"):
        read_file(f"file://{tmp_path}/bomb.json.gz")


def test_sqlite_export_at_a_url_is_read_from_a_copy_and_named_by_its_url(tmp_path):
    shutil.copy(NSYS, tmp_path / NSYS.name)
    url = f"file://{tmp_path}/{NSYS.name}"
    got, want = read_file(url), read_file(NSYS)
    assert_frame_equal(got.events, want.events)
    assert got.meta.path == url
    assert got.meta.rank == want.meta.rank
    assert not list(Path(tmp_path).glob("*.sqlite"))  # nothing written beside the input


def test_jax_trace_at_a_url_finds_its_xplane_beside_it(tmp_path):
    for f in JAX:
        shutil.copy(f, tmp_path / f.name)
    got, want = read_file(f"file://{tmp_path}/{JAX[0].name}", default_rank=0), read_file(JAX[0], default_rank=0)
    assert got.meta.time_base == want.meta.time_base == "epoch"
    assert_frame_equal(got.events, want.events)
    (tmp_path / JAX[1].name).unlink()
    assert read_file(f"file://{tmp_path}/{JAX[0].name}", default_rank=0).meta.time_base == "relative"


def test_outputs_are_refused_over_input_urls(runner, tmp_path):
    run = _copy_run(tmp_path / "run")
    target = run / "rank0.pt.trace.json.gz"
    before = target.read_bytes()
    result = runner.invoke(cli, ["analyze", f"file://{run}/", "-o", str(target)])
    assert result.exit_code == 2
    assert "-o names an input file" in result.stderr
    assert target.read_bytes() == before
    with pytest.raises(OutputError):
        refuse_inputs("file://" + str(target), [str(target)], "-o")
    with pytest.raises(OutputError):
        refuse_inputs("gcs://bucket/run/r0.json", ["gs://bucket/run/r0.json"], "-o")
    refuse_inputs("s3://bucket/run/r0.json", ["gs://bucket/run/r0.json"], "-o")  # another store: fine
    with pytest.raises(OutputError, match="--out s3://b/run would write over this input"):
        refuse_inputs_under("s3://b/run", ["s3://b/run/done/x.parquet"], "--out")
    refuse_inputs_under("s3://b/run", ["s3://b/run/rank0.json.gz"], "--out")  # beside the summaries: fine
    assert location_key(f"file://localhost{tmp_path}/run/../x") == location_key(str(tmp_path / "x"))


def test_storage_options_map_polars_names_and_refuse_unknown_ones_of_the_store():
    opts = {
        "aws_endpoint_url": "http://127.0.0.1:9000",
        "aws_access_key_id": "k",
        "aws_secret_access_key": "s",
        "aws_region": "eu-west-1",
        "google_service_account": "/x.json",  # another store's key: left for the outputs
        "aws_server_side_encryption": "aws:kms",  # writing only: left for the outputs
    }
    assert fs_kwargs("s3", opts) == {
        "endpoint_override": "127.0.0.1:9000",
        "scheme": "http",
        "access_key": "k",
        "secret_key": "s",
        "region": "eu-west-1",
    }
    with pytest.raises(TracediagError, match="--storage-option aws_no_such_key: not supported for reading s3"):
        fs_kwargs("s3", {"aws_no_such_key": "1"})
    az = fs_kwargs("azure", {"azure_storage_account_name": "acct", "azure_storage_endpoint": "http://127.0.0.1:10000"})
    assert az["account_name"] == "acct"
    assert az["blob_storage_scheme"] == "http"


# ------------------------------------------------------------------------------ a real S3 server


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on loopback with the run uploaded: (storage options, base URL, file system)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
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
    fs.create_dir("traces")
    uploads = [*((p, f"run/{p.name}") for p in sorted(RUN.iterdir())), (NSYS, f"nsys/{NSYS.name}")]
    for src, key in [*uploads, *((p, f"jax/{p.name}") for p in JAX)]:
        with fs.open_output_stream(f"traces/{key}", compression=None) as out:
            out.write(src.read_bytes())
    yield opts, "s3://traces", fs, endpoint
    server.stop()


def _set_auth(endpoint: str, count: str) -> None:
    """Moto's switch: after `count` more requests, check credentials (``inf``: never)."""
    request = urllib.request.Request(
        f"{endpoint}/moto-api/reset-auth", data=count.encode(), method="POST", headers={"Content-Type": "text/plain"}
    )
    urllib.request.urlopen(request, timeout=10).read()


@needs_moto
def test_s3_run_equals_the_files_on_disk_in_memory_and_with_local_executor(s3, on_disk):
    opts, base, _, _ = s3
    disk = tracediag.load(RUN, jobs=1)
    url = tracediag.load(f"{base}/run/", jobs=1, storage_options=opts)
    assert_frame_equal(url.events, disk.events)
    want = tracediag.analyze(disk).to_dict()
    assert _renamed(tracediag.analyze(url).to_dict(), f"{base}/run/", f"{RUN}/") == want
    # summaries written back to the bucket by polars, with the same options
    disk_run, disk_s = on_disk
    got, url_s = analyze_ranks(f"{base}/run/", out=f"{base}/out", executor="local", workers=2, storage_options=opts)
    assert _renamed(got.to_dict(), f"{base}/run/", f"{RUN}/") == disk_run.to_dict()
    for name, frame in disk_s.summary().tables().items():
        assert_frame_equal(url_s.summary().tables()[name], frame)
    assert [m.replace(f"{base}/run/", f"{RUN}/") for m in url_s.meta.ignored] == list(disk_s.meta.ignored)


@needs_moto
def test_s3_resume_uses_the_listings_size_and_time(s3, tmp_path):
    opts, base, fs, _ = s3
    fs.copy_file("traces/run/rank0.pt.trace.json.gz", "traces/again/rank0.pt.trace.json.gz")
    fs.copy_file("traces/run/rank1.pt.trace.json.gz", "traces/again/rank1.pt.trace.json.gz")
    out = str(tmp_path / "out")
    first = summarize(f"{base}/again/*.json.gz", out=out, executor="local", workers=1, storage_options=opts)
    sizes = {i.path: i.size for i in fs.get_file_info(pafs.FileSelector("traces/again"))}
    assert dict(zip(first.manifest["path"], first.manifest["bytes"])) == {f"s3://{k}": v for k, v in sizes.items()}
    # rank 1 replaced by another rank's bytes: only it is summarised again
    fs.copy_file("traces/run/rank2.pt.trace.json.gz", "traces/again/rank1.pt.trace.json.gz")
    again = summarize(
        f"{base}/again/*.json.gz", out=out, executor="local", workers=1, storage_options=opts, resume=True
    )
    redone = again.manifest.filter(pl.col("attempt") == 2)["path"].to_list()
    assert redone == [f"{base}/again/rank1.pt.trace.json.gz"]
    assert again.manifest["attempt"].to_list() == [1, 2]


@needs_moto
def test_s3_missing_object_and_denied_access_are_one_line(s3, runner):
    opts, base, _, endpoint = s3
    flags = [arg for k, v in opts.items() for arg in ("--storage-option", f"{k}={v}")]
    result = runner.invoke(cli, ["analyze", f"{base}/run/nothere.json.gz", *flags])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"Error: {base}/run/nothere.json.gz: no such object"
    _set_auth(endpoint, "0")
    try:
        one = runner.invoke(cli, ["analyze", f"{base}/run/rank0.pt.trace.json.gz", *flags])
        listed = runner.invoke(cli, ["analyze", f"{base}/run/*.json.gz", "--executor", "local", *flags])
    finally:
        _set_auth(endpoint, "inf")
    assert one.exit_code == listed.exit_code == 2
    line = one.stderr.strip()
    assert "\n" not in line
    assert line.startswith(f"Error: {base}/run/rank0.pt.trace.json.gz: access denied (")
    line = listed.stderr.strip()
    assert "\n" not in line
    assert line.startswith(f"Error: {base}/run/*.json.gz: cannot list (access denied (")


@needs_moto
def test_s3_sqlite_export_jax_xplane_and_cli_with_storage_options(s3, runner):
    opts, base, _, _ = s3
    got = read_file(f"{base}/nsys/{NSYS.name}", storage_options=opts)
    assert_frame_equal(got.events, read_file(NSYS).events)
    jax = read_file(f"{base}/jax/{JAX[0].name}", default_rank=0, storage_options=opts)
    assert jax.meta.time_base == "epoch"
    assert_frame_equal(jax.events, read_file(JAX[0], default_rank=0).events)
    flags = [arg for k, v in opts.items() for arg in ("--storage-option", f"{k}={v}")]
    url = runner.invoke(cli, ["analyze", f"{base}/run/*.json.gz", "--format", "json", *flags])
    disk = runner.invoke(cli, ["analyze", str(RUN / "*.json.gz"), "--format", "json"])
    assert url.exit_code == disk.exit_code == 0, url.stderr
    assert _renamed(orjson.loads(url.stdout), f"{base}/run/", f"{RUN}/") == orjson.loads(disk.stdout)


@needs_moto
def test_s3_credentials_and_endpoint_from_the_environment_reach_the_workers(s3, monkeypatch, tmp_path):
    opts, base, _, _ = s3
    monkeypatch.setenv("AWS_ENDPOINT_URL", opts["aws_endpoint_url"])
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    s = summarize(f"{base}/run/rank[01].pt.trace.json.gz", out=str(tmp_path), executor="local", workers=2)
    assert s.manifest["ok"].to_list() == [True, True]
    assert s.ranks == [0, 1]


@needs_moto
@pytest.mark.skipif(importlib.util.find_spec("distributed") is None, reason="dask is not installed")
def test_s3_on_a_dask_cluster_each_worker_streams_its_objects(s3, on_disk, tmp_path):
    from distributed import LocalCluster

    opts, base, _, _ = s3
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster:
        got = summarize(
            f"{base}/run/*.json.gz",
            out=str(tmp_path / "dask"),
            executor="dask",
            address=cluster.scheduler_address,
            workers=2,
            storage_options=opts,
        )
    for name, frame in on_disk[1].summary().tables().items():
        assert_frame_equal(got.summary().tables()[name], frame)
    assert f"{socket.gethostname()}:{os.getpid()}" not in got.manifest["worker"].to_list()
