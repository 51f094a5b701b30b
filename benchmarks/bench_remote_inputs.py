"""Reading one real trace from a path, a file:// URL and an S3 server (moto on loopback), side by side.

What it shows: the URL path (pyarrow.fs stream, 8 MB ranged GETs) costs about what a local read
costs, and how many GET requests one trace takes. moto is a Python server in this process (its CPU
counts in the s3 line), so its wall time is an
upper bound on the client's share; a real S3 adds network latency per GET (hence the large buffer).

    python benchmarks/bench_remote_inputs.py [TRACE]   # default: the A100 control trace in ../shared

Needs the s3-test extra (moto). Prints one line per source: wall and CPU seconds (median of 3), GETs.
"""

from __future__ import annotations

import gzip
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.fs as pafs

from tracediag.ingest.read import read_file

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT.parent / "shared" / "trace-samples" / "hta" / "trace_diff" / "control" / "control.json.gz"


class _Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.gets = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "GET /traces/" in record.getMessage():
            self.gets += 1


def _time(fn) -> tuple[float, float]:
    walls, cpus = [], []
    for _ in range(3):
        w, c = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    counter = _Count()
    logging.getLogger("werkzeug").addHandler(counter)
    logging.getLogger("werkzeug").setLevel(logging.INFO)
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
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
        for f in (src, plain):
            with fs.open_output_stream(f"traces/{f.name}", compression=None) as out:
                out.write(f.read_bytes())
        for f in (src, plain):
            print(f"{f.name}: {f.stat().st_size / 1e6:.1f} MB")
            rows = None
            for label, source, kw in [
                ("path", str(f), {}),
                ("file://", f"file://{f}", {}),
                ("s3 (moto)", f"s3://traces/{f.name}", {"storage_options": opts}),
            ]:
                counter.gets = 0
                wall, cpu = _time(lambda source=source, kw=kw: read_file(source, default_rank=0, **kw))
                height = read_file(source, default_rank=0, **kw).events.height
                assert rows in (None, height), "a URL must give the same rows"
                rows = height
                gets = f", {counter.gets // 4} GET/read" if label.startswith("s3") else ""
                print(f"  {label:10s} wall {wall:6.2f} s  cpu {cpu:6.2f} s  rows {height:,}{gets}")
    server.stop()


if __name__ == "__main__":
    main()
