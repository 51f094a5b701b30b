"""Read trace files in parallel in worker processes that work wherever Python runs.

`multiprocessing` (spawn, forkserver) re-imports the caller's `__main__` in every worker: a script
without an `if __name__ == "__main__":` guard then starts its own work again in each worker and
the pool breaks; fork is unsafe once polars' thread pool runs. These workers are plain
subprocesses that import only tracediag (`python -c "...serve()"`) and exchange length-prefixed
pickles over their stdin/stdout, so a guard-less script, `python - <<EOF`, a notebook kernel, a
thread of a service or a forked process may all call `load`. Where a worker cannot start or dies,
the files it did not read are read in this process, with one warning.

The package imports this module from `import tracediag` on, so the fork hook (`forked_after_import`:
is this process a fork of one that had imported tracediag?) is in place however little of the
package a process has used before it forks.
"""

from __future__ import annotations

import os
import queue
import signal
import struct
import subprocess
import sys
import threading
import warnings
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

Task = TypeVar("Task")
Result = TypeVar("Result")

_LEN = struct.Struct("<Q")
_ENTRY = (
    "import sys\n"
    "if sys.path and sys.path[0] == '':\n"
    "    del sys.path[0]\n"
    "from tracediag.ingest.workers import serve\n"
    "serve()\n"
)
"""A worker's program. ``-c`` puts the current directory first on the import path, before PYTHONPATH:
a `tracediag` folder there (another checkout) would be imported instead of the parent's own, so it goes."""
_READY = b"tracediag worker ready\n"
"""The first bytes a worker writes: it started and imported tracediag (else the caller reads in-process).
Fixed bytes, not a frame: output printed before them cannot make the caller wait for a bogus length."""
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
"""The folder holding the `tracediag` package, so a worker imports the same code as its parent."""


_FORK = {"after_import": False}
_SERVING = {"worker": False}


def in_worker() -> bool:
    """True in a worker process (`serve`): what a task returns is shipped to the caller."""
    return _SERVING["worker"]


def _forked() -> None:
    _FORK["after_import"] = True


def forked_after_import() -> bool:
    """True in a child forked after `import tracediag` (polars' thread pool may not survive that fork)."""
    return _FORK["after_import"]


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


class WorkerError(Exception):
    """A worker process could not start, or stopped answering."""


class _Raised:
    """What a task raised in a worker, to be raised again in the caller."""

    def __init__(self, error: Exception, travels: bool = True) -> None:
        if travels:
            import pickle

            try:
                pickle.dumps(error)
            except Exception:  # an exception that cannot travel: its text does
                error = RuntimeError(f"{type(error).__name__}: {error}")
        self.error = error


def _send(stream: IO[bytes], obj: Any) -> None:
    import pickle  # here, not at the top: `import tracediag` imports this module, most processes start no worker

    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LEN.pack(len(data)))
    stream.write(data)  # not joined to the length: an answer may be 100 MB of tables
    stream.flush()


def _receive(stream: IO[bytes]) -> Any:
    import pickle

    head = stream.read(_LEN.size)
    if len(head) < _LEN.size:
        raise EOFError
    size = _LEN.unpack(head)[0]
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return pickle.loads(data)


def serve() -> None:
    """Worker loop: read (function, argument) pairs from stdin, answer each result on stdout.

    Anything else printed to stdout (a library, a `sitecustomize`) goes to stderr instead, so it
    cannot corrupt the answers.
    """
    import pickle

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's; a worker ends when its input does
    _SERVING["worker"] = True
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    requests = sys.stdin.buffer
    answers.write(_READY)
    answers.flush()
    while True:
        try:
            fn, arg = _receive(requests)
        except EOFError:
            return
        try:
            answer = fn(arg)
        except Exception as e:  # raised again in the caller, as if the task had run there
            answer = _Raised(e)
        try:
            _send(answers, answer)
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            _send(answers, _Raised(RuntimeError(f"{type(answer).__name__} cannot be sent back ({e})")))


class _Worker:
    """One worker subprocess, one of `of` running at once: its polars thread pool gets its share of the
    CPUs (unless POLARS_MAX_THREADS is set), so `of` workers never run `of` times as many threads as
    there are CPUs (each thread idles and wakes at a cost)."""

    def __init__(self, of: int = 1) -> None:
        if not sys.executable:
            msg = "no Python executable to start workers with (sys.executable is empty)"
            raise WorkerError(msg)
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": _PACKAGE_ROOT + (os.pathsep + path if path else "")}
        env.setdefault("POLARS_MAX_THREADS", str(max(1, (os.cpu_count() or 1) // max(1, of))))
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _ENTRY], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
            )
        except OSError as e:
            msg = f"cannot start {sys.executable} ({e.strerror or e})"
            raise WorkerError(msg) from None
        try:
            ready = self.proc.stdout.read(len(_READY))
        except OSError:
            ready = b""
        if ready != _READY:
            self.close()
            code = self.proc.returncode
            msg = f"a worker process did not start (exit status {code}; its error is above)"
            raise WorkerError(msg)

    def call(self, fn: Callable[[Any], Any], arg: Any) -> Any:
        import pickle

        try:
            _send(self.proc.stdin, (fn, arg))
            return _receive(self.proc.stdout)
        except (OSError, EOFError, pickle.UnpicklingError) as e:
            try:  # its output ended: it is exiting, or wedged
                code = self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
            why = f"exit status {code}" if code is not None else type(e).__name__
            msg = f"a worker process stopped ({why})"
            raise WorkerError(msg) from None

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        finally:
            self.proc.stdout.close()


def map_in_workers(
    fn: Callable[[Task], Result],
    tasks: Sequence[Task],
    jobs: int,
    *,
    crashed: Callable[[Task, str], Result],
    on_done: Callable[[int], None] | None = None,
    in_caller: bool = False,
) -> list[Result]:
    """`[fn(t) for t in tasks]`, run in up to `jobs` worker processes.

    `fn` must be a module-level function of tracediag (workers import it by name). A task during
    which its worker died (out of memory, a crash in native code) is not retried here, where it
    could take the caller down: its result is `crashed(task, why)`. `on_done(i)` is called in the
    calling thread as task `i` finishes. Tasks no worker could run are run here, after one
    `RuntimeWarning` saying why.

    `in_caller`: the calling thread takes tasks too, as one of the `jobs`, so one worker fewer
    starts (each costs an interpreter and its imports) and the caller's own results need no
    transfer; it starts at once, while the workers still start.
    """
    todo: queue.SimpleQueue[int] = queue.SimpleQueue()
    for i in range(len(tasks)):
        todo.put(i)
    finished: queue.SimpleQueue[tuple[int, Any] | None] = queue.SimpleQueue()
    failures: list[str] = []

    n = max(0 if in_caller else 1, min(jobs, len(tasks)) - in_caller)
    started: list[_Worker] = []

    def drive() -> None:
        try:
            worker = _Worker(of=n + in_caller)  # the caller reads too: the CPUs are shared among n + 1
        except WorkerError as e:
            failures.append(str(e))
            finished.put(None)
            return
        started.append(worker)
        try:
            while True:
                try:
                    i = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    finished.put((i, worker.call(fn, tasks[i])))
                except WorkerError as e:
                    failures.append(str(e))
                    finished.put((i, crashed(tasks[i], str(e))))
                    return
        finally:
            worker.close()
            finished.put(None)

    # the caller's first task is taken before any worker starts: it is the caller's, however late the
    # scheduler runs this thread again (a loaded machine), so the caller never waits idle for a worker
    first = todo.get_nowait() if in_caller and tasks else None
    threads = [threading.Thread(target=drive, name=f"tracediag-worker-{k}", daemon=True) for k in range(n)]
    for t in threads:
        t.start()
    results: dict[int, Any] = {}
    running = n

    def take(item: tuple[int, Any] | None) -> None:
        nonlocal running
        if item is None:
            running -= 1
            return
        results[item[0]] = item[1]
        if on_done:
            on_done(item[0])

    try:
        here = 0  # tasks the caller ran
        while in_caller:
            if first is not None:
                i, first = first, None
            else:
                try:
                    i = todo.get_nowait()
                except queue.Empty:
                    break
            here += 1
            try:
                take((i, fn(tasks[i])))
            except Exception as e:  # raised after every task ended, as a worker's would be
                take((i, _Raised(e, travels=False)))
            while True:  # the workers' results so far, so `on_done` follows the work
                try:
                    take(finished.get_nowait())
                except queue.Empty:
                    break
        while running:
            take(finished.get())
    except BaseException:  # Ctrl-C, SIGTERM: no worker outlives the caller, finishing a file for nobody
        for worker in started:
            worker.proc.kill()
            worker.proc.wait()
        raise
    for t in threads:
        t.join()
    raised = [r.error for r in results.values() if isinstance(r, _Raised)]
    if raised:
        raise raised[0]
    left = sorted(i for i in range(len(tasks)) if i not in results)
    if left or (failures and here):  # a worker failed: the caller read its share
        warnings.warn(
            f"tracediag: {failures[0]}; reading {len(left) + here} file(s) in this process instead",
            RuntimeWarning,
            stacklevel=4,
        )
        for i in left:
            results[i] = fn(tasks[i])
            if on_done:
                on_done(i)
    return [results[i] for i in range(len(tasks))]
