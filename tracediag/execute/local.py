"""The local engine: a process pool (``spawn``, safe with polars' threads) on this machine.

A task that raises is retried `retries` times. A worker process that dies breaks the pool: it is
replaced and the tasks that were in flight are retried (each counts an attempt, since the pool does
not say which of them killed the worker).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from typing import Any


class LocalExecutor:
    name = "local"

    def __init__(self, *, workers: int, retries: int) -> None:
        self.workers = workers
        self.retries = retries
        self._pool: ProcessPoolExecutor | None = None
        self._ids = itertools.count()
        self._tasks: dict[int, tuple[Callable[[Any], Any], Any]] = {}
        self._tries: dict[int, int] = {}
        self._futures: dict[int, tuple[Future, ProcessPoolExecutor]] = {}

    def _pool_now(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=get_context("spawn"))
        return self._pool

    def _replace(self, broken: ProcessPoolExecutor) -> None:
        """A new pool, once per broken one (its other futures fail with BrokenProcessPool too)."""
        if self._pool is broken:
            broken.shutdown(wait=False)
            self._pool = None

    def _start(self, handle: int) -> Future:
        fn, arg = self._tasks[handle]
        self._tries[handle] = self._tries.get(handle, 0) + 1
        pool = self._pool_now()
        try:
            fut = pool.submit(fn, arg)
        except BrokenProcessPool:
            self._replace(pool)
            pool = self._pool_now()
            fut = pool.submit(fn, arg)
        self._futures[handle] = (fut, pool)
        return fut

    def submit(self, fn: Callable[[Any], Any], arg: Any) -> Hashable:
        handle = next(self._ids)
        self._tasks[handle] = (fn, arg)
        self._start(handle)
        return handle

    def as_completed(self, handles: Iterable[Hashable]) -> Iterator[tuple[Hashable, Any]]:
        waiting = {self._futures[h][0]: h for h in handles}
        while waiting:
            done, _ = wait(waiting, return_when=FIRST_COMPLETED)
            for fut in done:
                handle = waiting.pop(fut)
                error = fut.exception()
                if error is None:
                    del self._tasks[handle]
                    yield handle, fut.result()
                    continue
                if isinstance(error, BrokenProcessPool):
                    self._replace(self._futures[handle][1])
                if self._tries[handle] <= self.retries:
                    waiting[self._start(handle)] = handle
                else:
                    del self._tasks[handle]
                    yield handle, error

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
