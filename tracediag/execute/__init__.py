"""Run the per-rank work where the workers are: a local process pool, a Ray cluster or a Dask cluster.

Every engine offers the same two calls, `submit(fn, arg) -> handle` and `as_completed(handles)`,
which yields ``(handle, result)`` or ``(handle, exception)`` once the engine's retries are spent.
`open_executor` picks one by name; `driver.summarize` runs `task.summarize_files` over a run's files
with it and gathers the summaries.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from tracediag.execute.base import EXECUTORS, EngineMissing, Executor, first_line

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["EXECUTORS", "EngineMissing", "Executor", "first_line", "open_executor"]


@contextmanager
def open_executor(
    name: str,
    *,
    workers: int = 0,
    retries: int = 2,
    address: str | None = None,
    scheduler_file: str | None = None,
) -> Iterator[Executor]:
    """The executor `name` (``local``, ``ray`` or ``dask``), closed (and a cluster it started stopped) on exit.

    `workers`: processes of a pool or local cluster it starts (0 = one per CPU). `address`: the
    cluster to attach to, else the engine's own convention (``RAY_ADDRESS``;
    ``DASK_SCHEDULER_ADDRESS`` or a scheduler file), else a local cluster is started.
    """
    workers = workers or os.cpu_count() or 1
    if name == "local":
        from tracediag.execute.local import LocalExecutor

        ex: Any = LocalExecutor(workers=workers, retries=retries)
    elif name == "ray":
        from tracediag.execute.ray import RayExecutor

        ex = RayExecutor(workers=workers, retries=retries, address=address)
    elif name == "dask":
        from tracediag.execute.dask import DaskExecutor

        ex = DaskExecutor(workers=workers, retries=retries, address=address, scheduler_file=scheduler_file)
    else:
        msg = f"unknown executor {name!r}; one of {', '.join(EXECUTORS)}"
        raise ValueError(msg)
    try:
        yield ex
    finally:
        ex.close()
