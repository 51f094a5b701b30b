"""The local engine: worker processes on this machine, one thread driving each.

The workers are `ingest.workers`' plain subprocesses, which import only tracediag, so a script
without a ``__main__`` guard, a notebook or a thread of a service can use this executor. A task that
raises is retried in its worker, up to `retries` more times. A worker that dies (out of memory, a
crash in native code) is replaced, and only the task it was running is retried. Where no worker
process can start at all, tasks run in this process after one warning.
"""

from __future__ import annotations

import itertools
import queue
import threading
import warnings
from typing import TYPE_CHECKING, Any

from tracediag.ingest.workers import WorkerError, _Raised, _Worker

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable, Iterable, Iterator


class LocalExecutor:
    """The tasks on a pool of local worker processes (`open_executor`, ``local``), each retried `retries` times."""

    name = "local"

    def __init__(self, *, workers: int, retries: int) -> None:
        self.workers = max(1, workers)
        self.retries = retries
        self._ids = itertools.count()
        self._tasks: dict[int, tuple[Callable[[Any], Any], Any]] = {}
        self._todo: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()
        self._finished: dict[int, Any] = {}
        self._threads: list[threading.Thread] = []
        self._warned = threading.Lock()

    def _run(self, handle: int, worker: _Worker | None) -> tuple[Any, _Worker | None]:
        """The task's result or last exception, and the worker to use next (replaced when it died)."""
        fn, arg = self._tasks[handle]
        for attempt in range(self.retries + 1):
            try:
                if worker is None:
                    result = fn(arg)
                else:
                    answer = worker.call(fn, arg)
                    if isinstance(answer, _Raised):
                        raise answer.error
                    result = answer
                return result, worker
            except WorkerError as e:
                worker.close()
                worker = self._start()
                error: Exception = e
            except Exception as e:
                error = e
            if attempt == self.retries:
                return error, worker
        msg = "unreachable"
        raise AssertionError(msg)

    def _start(self) -> _Worker | None:
        try:
            return _Worker(of=self.workers)
        except WorkerError as e:
            if self._warned.acquire(blocking=False):
                warnings.warn(f"tracediag: {e}; running tasks in this process", RuntimeWarning, stacklevel=2)
            return None

    def _drive(self) -> None:
        worker = self._start()
        try:
            while (handle := self._todo.get()) is not None:
                try:
                    result, worker = self._run(handle, worker)
                except BaseException as e:  # never leave the caller waiting for this task
                    result = e
                self._done.put((handle, result))
        finally:
            if worker is not None:
                worker.close()

    def submit(self, fn: Callable[[Any], Any], arg: Any) -> Hashable:
        """Queue ``fn(arg)``, starting a pool thread while fewer than `workers` run."""
        if len(self._threads) < self.workers:
            thread = threading.Thread(target=self._drive, name=f"tracediag-local-{len(self._threads)}", daemon=True)
            thread.start()
            self._threads.append(thread)
        handle = next(self._ids)
        self._tasks[handle] = (fn, arg)
        self._todo.put(handle)
        return handle

    def as_completed(self, handles: Iterable[Hashable]) -> Iterator[tuple[Hashable, Any]]:
        """Each handle once as its task finishes: its result, or the exception of its last attempt."""
        wanted = set(handles)
        for handle in [h for h in wanted if h in self._finished]:
            wanted.discard(handle)
            yield handle, self._finished.pop(handle)
        while wanted:
            handle, result = self._done.get()
            del self._tasks[handle]
            if handle in wanted:
                wanted.discard(handle)
                yield handle, result
            else:
                self._finished[handle] = result

    def close(self) -> None:
        """Stop the pool's threads and their worker processes."""
        for _ in self._threads:
            self._todo.put(None)
        for thread in self._threads:
            thread.join()
        self._threads.clear()
