"""The Dask engine: distributed futures, on a cluster or a LocalCluster.

Address: the one given, else the scheduler file given, else Dask's own ``DASK_SCHEDULER_ADDRESS``
(config key ``scheduler-address``), else ``NSYS_DASK_SCHEDULER_FILE`` (Nsight Systems' recipes use
the same two), else a LocalCluster of `workers` single-threaded processes, closed on close. A task
that raises is retried `retries` times; the scheduler reschedules the tasks of a worker that dies
(up to its ``allowed-failures``). The scheduler must be able to import tracediag.

A LocalCluster started here runs lean (`LEAN`): on a small machine Dask's default background work
(a 100 Hz stack sampler in every worker, memory and system monitors, a 20 ms event-loop tick) takes
CPU from the tasks. Its workers import the task's code as they start, as the local engine's do. A
cluster attached to keeps its own configuration.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable, Iterable, Iterator

try:
    import dask
    from distributed import Client, LocalCluster
    from distributed import as_completed as _as_completed
except ImportError as e:  # pragma: no cover - depends on the install
    from tracediag.execute.base import EngineMissing

    msg = "--executor dask needs Dask: pip install 'tracediag[dask]'"
    raise EngineMissing(msg) from e


LEAN = {
    "distributed.worker.profile.enabled": False,
    "distributed.worker.memory.monitor-interval": "1s",
    "distributed.admin.system-monitor.interval": "2s",
    "distributed.admin.tick.interval": "500ms",
}
"""Dask settings for a LocalCluster started here. Measured on 2 cores, an idle 2-worker cluster: 0.10
CPU-s per second with Dask's defaults, 0.02 with these; the sampler costs more while tasks run."""


class DaskExecutor:
    """The tasks on a Dask cluster (`open_executor`, ``dask``): attached to, or a local one started."""

    name = "dask"

    def __init__(
        self, *, workers: int, retries: int, address: str | None = None, scheduler_file: str | None = None
    ) -> None:
        self.retries = retries
        self._cluster = None
        address = address or (None if scheduler_file else dask.config.get("scheduler-address", None))
        scheduler_file = scheduler_file or (None if address else os.environ.get("NSYS_DASK_SCHEDULER_FILE"))
        if address:
            self._client = Client(address)
        elif scheduler_file:
            self._client = Client(scheduler_file=scheduler_file)
        else:
            with dask.config.set(LEAN):  # the nannies hand this configuration to their workers
                self._cluster = LocalCluster(
                    n_workers=workers,
                    threads_per_worker=1,
                    processes=True,
                    dashboard_address=":0",
                    preload=["tracediag.execute.task"],  # imported as a worker starts, not in its first task
                )
                self._client = Client(self._cluster)

    def submit(self, fn: Callable[[Any], Any], arg: Any) -> Hashable:
        """Start ``fn(arg)`` as a Dask future, retried by the scheduler."""
        return self._client.submit(fn, arg, retries=self.retries, pure=False)

    def as_completed(self, handles: Iterable[Hashable]) -> Iterator[tuple[Hashable, Any]]:
        """Each future once as it finishes: its result, or its exception."""
        for fut in _as_completed(list(handles)):
            try:
                yield fut, fut.result()
            except Exception as e:  # the task's last exception, or KilledWorker
                yield fut, e
            fut.release()

    def close(self) -> None:
        """Close the client, and the local cluster if this executor started it."""
        self._client.close()
        if self._cluster is not None:
            self._cluster.close()
