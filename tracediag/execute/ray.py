"""The Ray engine: core tasks (``ray.remote`` + ``ray.wait``), on a cluster or a local one.

Address: the one given, else Ray's own ``RAY_ADDRESS`` (set inside ``ray job submit`` and a KubeRay
RayJob), else a Ray already initialised in this process, else a local cluster of `workers` CPUs,
stopped on close. Ray retries a task whose worker or node dies, and here also one that raises,
`retries` times. Token authentication (Ray ≥ 2.52) passes through ``RAY_AUTH_TOKEN`` /
``RAY_AUTH_MODE`` from the environment.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable, Iterable, Iterator

try:
    import ray
except ImportError as e:  # pragma: no cover - depends on the install
    from tracediag.execute.base import EngineMissing

    msg = "--executor ray needs Ray: pip install 'tracediag[ray]'"
    raise EngineMissing(msg) from e


def _call(fn: Callable[[Any], Any], arg: Any) -> Any:
    return fn(arg)


def _warm(_: Any) -> int:
    """Import the task's code (tracediag, polars) in a worker before the first real task."""
    import tracediag.execute.task  # noqa: F401

    return os.getpid()


class RayExecutor:
    """The tasks on a Ray cluster (`open_executor`, ``ray``): attached to, or a local one started."""

    name = "ray"

    def __init__(self, *, workers: int, retries: int, address: str | None = None) -> None:
        address = address or os.environ.get("RAY_ADDRESS")
        self._owned = False
        self._remote = ray.remote(_call).options(max_retries=retries, retry_exceptions=True)
        self._refs: dict[Any, Any] = {}
        if address:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
            self._owned = True  # disconnect this driver on close; the cluster stays
        elif not ray.is_initialized():
            # "local": a new cluster, never one a `ray start` left on this node (that takes an address)
            ray.init(
                address="local",
                num_cpus=workers,
                include_dashboard=False,
                logging_level=logging.WARNING,
                log_to_driver=False,
            )
            self._owned = True
            # the workers Ray started with the cluster import tracediag now, as the local engine's do
            # when they start, rather than in their first task
            ray.get([self._remote.remote(_warm, None) for _ in range(workers)])

    def submit(self, fn: Callable[[Any], Any], arg: Any) -> Hashable:
        """Start ``fn(arg)`` as a Ray task (Ray retries it)."""
        ref = self._remote.remote(fn, arg)
        self._refs[ref] = ref
        return ref

    def as_completed(self, handles: Iterable[Hashable]) -> Iterator[tuple[Hashable, Any]]:
        """Each task once as it finishes: its result, or its exception."""
        pending = list(handles)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                try:
                    yield ref, ray.get(ref)
                except ray.exceptions.RayTaskError as e:
                    cause = e.as_instanceof_cause()
                    yield ref, cause if isinstance(cause, BaseException) else e
                except Exception as e:  # worker or node death after the retries, object lost
                    yield ref, e
                self._refs.pop(ref, None)

    def close(self) -> None:
        """Shut Ray down if this executor started it."""
        if self._owned and ray.is_initialized():
            ray.shutdown()
