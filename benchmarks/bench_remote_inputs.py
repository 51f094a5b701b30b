"""Reading one real trace from a path, a file:// URL and an S3 server (moto on loopback), side by side.

What it shows: the URL path (a `pyarrow.fs` stream, 8 MB ranged GETs) costs about what a local read
costs, and how many GET requests a trace takes; and, where s3fs is importable, the raw transfer
through `pyarrow.fs` (no new dependency) against s3fs (the fsspec route: 20 more packages).
The server runs in its own process, so the CPU seconds are the client's alone; a real S3 adds
network latency per request, hence the large buffer.

    python benchmarks/bench_remote_inputs.py [TRACE]   # default: the A100 control trace in ../shared
    PYTHONPATH=DIR_WITH_S3FS python benchmarks/bench_remote_inputs.py   # also the s3fs comparison

Needs the s3-test extra (moto). Prints one line per source: wall and CPU seconds (median of 5).
"""

from __future__ import annotations

import gzip
import importlib.util
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tracediag.ingest.read import read_file
from tracediag.ingest.remote import open_stream

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT.parent / "shared" / "trace-samples" / "hta" / "trace_diff" / "control" / "control.json.gz"

SERVER = """
import sys, time, logging
from moto.server import ThreadedMotoServer
class Count(logging.Handler):
    def emit(self, record):
        if "GET /traces/" in record.getMessage():
            print("GET", flush=True)
logging.getLogger("werkzeug").addHandler(Count())
logging.getLogger("werkzeug").setLevel(logging.INFO)
ThreadedMotoServer(ip_address="127.0.0.1", port=int(sys.argv[1]), verbose=False).start()
print("ready", flush=True)
time.sleep(3600)
"""


def _median(fn, runs: int = 5) -> tuple[float, float]:
    walls, cpus = [], []
    for _ in range(runs):
        w, c = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return statistics.median(walls), statistics.median(cpus)


def _drain(stream) -> int:
    n = 0
    with stream:
        while block := stream.read(1 << 20):
            n += len(block)
    return n


def main() -> None:
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the server with the project's botocore
    with tempfile.TemporaryFile("w+") as log:
        cmd = [sys.executable, "-c", SERVER, str(port)]
        server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.DEVNULL, env=env)
        try:
            _run(src, f"http://127.0.0.1:{port}", log)
        finally:
            server.terminate()
            server.wait(timeout=10)


def _server_said(log) -> str:
    log.seek(0)
    return log.read()


def _gets(log) -> int:
    return _server_said(log).count("GET\n")


def _run(src: Path, endpoint: str, log) -> None:
    import pyarrow.fs as pafs

    while "ready" not in _server_said(log):
        time.sleep(0.1)
    opts = {
        "aws_endpoint_url": endpoint,
        "aws_access_key_id": "x",
        "aws_secret_access_key": "x",
        "aws_region": "us-east-1",
    }
    fs = pafs.S3FileSystem(
        access_key="x", secret_key="x", endpoint_override=endpoint, region="us-east-1", allow_bucket_creation=True
    )
    fs.create_dir("traces")
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / src.name.removesuffix(".gz")
        plain.write_bytes(gzip.decompress(src.read_bytes()) if src.name.endswith(".gz") else src.read_bytes())
        files = [src, plain]
        for f in files:
            with fs.open_output_stream(f"traces/{f.name}", compression=None) as out:
                out.write(f.read_bytes())
        print("read_file (decode + event table), median of 5:")
        for f in files:
            print(f"{f.name}: {f.stat().st_size / 1e6:.1f} MB")
            rows = None
            for label, source, kw in [
                ("path", str(f), {}),
                ("file://", f"file://{f}", {}),
                ("s3 (moto)", f"s3://traces/{f.name}", {"storage_options": opts}),
            ]:
                before = _gets(log)
                wall, cpu = _median(lambda source=source, kw=kw: read_file(source, default_rank=0, **kw))
                height = read_file(source, default_rank=0, **kw).events.height
                assert rows in (None, height), "a URL must give the same rows"
                rows = height
                gets = f"  {(_gets(log) - before) // 6} GET per read" if label.startswith("s3") else ""
                print(f"  {label:10s} wall {wall:6.3f} s  cpu {cpu:6.3f} s  rows {height:,}{gets}")
        if importlib.util.find_spec("s3fs") is None:
            print("s3fs is not importable: the fsspec comparison is skipped")
            return
        import s3fs

        print("raw transfer (bytes only), median of 5:")
        for f in files:
            via_arrow = lambda f=f: _drain(open_stream(f"s3://traces/{f.name}", opts)[0])  # noqa: E731

            def via_s3fs(f=f):
                s3 = s3fs.S3FileSystem(
                    key="x", secret="x", client_kwargs={"endpoint_url": endpoint, "region_name": "us-east-1"},
                    skip_instance_cache=True,
                )  # fmt: skip
                return _drain(s3.open(f"traces/{f.name}", "rb", block_size=8 << 20))

            for name, fn in (("pyarrow.fs", via_arrow), ("s3fs", via_s3fs)):
                wall, cpu = _median(fn)
                print(f"  {f.name:18s} {name:10s} wall {wall:6.3f} s  cpu {cpu:6.3f} s")


if __name__ == "__main__":
    main()
