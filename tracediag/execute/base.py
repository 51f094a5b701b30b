"""What every executor shares: the `Executor` protocol, the engine names, the error a missing engine
raises, and one-line exception text. Kept apart from `open_executor` so the engines (`local`, `ray`,
`dask`) import these without importing the module that imports them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable, Iterable, Iterator

EXECUTORS = ("local", "ray", "dask")


class Executor(Protocol):
    """A task engine: the engine retries a task whose worker dies or that raises, `retries` times."""

    name: str

    def submit(self, fn: Callable[[Any], Any], arg: Any) -> Hashable:
        """Start ``fn(arg)`` on a worker; the handle `as_completed` yields back."""

    def as_completed(self, handles: Iterable[Hashable]) -> Iterator[tuple[Hashable, Any]]:
        """Each handle once, as its task finishes: its result, or the exception of its last attempt."""
        ...


class EngineMissing(ImportError):
    """The engine's package is not installed (`pip install 'tracediag[ray]'` or `'tracediag[dask]'`)."""


def first_line(e: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__
