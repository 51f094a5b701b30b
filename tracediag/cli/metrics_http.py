"""Serving a watch's metrics over HTTP (``tracediag watch --metrics-port``), in a daemon thread.

With `prometheus-client` installed (the ``watch`` extra) it serves them, from a registry of its own
(not the process-global default) whose one collector reads `WatchMetrics.snapshot()`; without it,
the standard library's HTTP server serves the same text exposition (`report.metrics.exposition`),
so the core install needs no new dependency.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from tracediag.report.metrics import WatchMetrics, exposition

if TYPE_CHECKING:
    from collections.abc import Iterator

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def serve(metrics: WatchMetrics, host: str, port: int, *, use_client: bool | None = None) -> tuple[Any, int, str]:
    """Start serving `metrics` at http://host:port/metrics; (server, the port bound, which server).
    `use_client`: force prometheus-client (True) or the standard library (False); None: the first
    when it is installed. Raises OSError when the port cannot be bound."""
    if use_client is not False:
        try:
            return _serve_client(metrics, host, port)
        except ImportError:
            if use_client:
                raise
    return _serve_stdlib(metrics, host, port)


def _serve_client(metrics: WatchMetrics, host: str, port: int) -> tuple[Any, int, str]:
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    class Collector:
        def collect(self) -> Iterator[Any]:
            for f in metrics.snapshot():
                names = [k for k, _ in f.samples[0][0]]
                kind = CounterMetricFamily if f.kind == "counter" else GaugeMetricFamily
                family = kind(f.name, f.help, labels=names)
                for labels, value in f.samples:
                    family.add_metric([v for _, v in labels], value)
                yield family

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector())
    started = start_http_server(port, addr=host, registry=registry)
    server = started[0] if isinstance(started, tuple) else None
    bound = server.server_port if server is not None else port
    return server, bound, "prometheus-client"


def _serve_stdlib(metrics: WatchMetrics, host: str, port: int) -> tuple[Any, int, str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] not in ("/", "/metrics"):
                self.send_error(404)
                return
            body = exposition(metrics.snapshot()).encode()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # no line per scrape on stderr
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="tracediag-metrics", daemon=True).start()
    return server, server.server_port, "http.server"
