"""The public API's boundary: what a caller passes is checked once, where it comes in.

Each public function and class is `checked`: at every call from outside the package its arguments are
matched against the type hints it is declared with (the hints are the contract: nothing is declared twice;
tracediag's own calls are past the boundary and not checked again), and one of the wrong type is a one-line
`TypeError` naming the argument and what was given, before any work, never an
`AttributeError` or a polars error from deep inside. A table's columns and dtypes are declared in its hint
(`Table`: the event table's, `schema.EventTable`, is checked in one place, when a `Run` is built), and a
frame without them is a one-line `TracediagError` naming what it lacks.
"""

from __future__ import annotations

import enum
import functools
import inspect
import numbers
import os
import sys
import types
import typing
from collections import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from tracediag.errors import TracediagError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

T = TypeVar("T")

_NOT_ITEMS = (str, bytes, bytearray, memoryview, abc.Mapping)
"""Never a collection of paths or values at this API, though Python iterates them (a str by letter)."""


def checked(target: T) -> T:
    """`target`, a public function or class, with its arguments checked against its type hints at each call
    (a class: its constructor's)."""
    if isinstance(target, type):
        init = target.__init__
        check = _Check(target)

        @functools.wraps(init)
        def __init__(self: object, *args: object, **kwargs: object) -> None:
            if not _inside(sys._getframe(1)):
                check(args, kwargs)
            init(self, *args, **kwargs)

        target.__init__ = __init__
        return target
    check = _Check(target)

    @functools.wraps(target)
    def call(*args: object, **kwargs: object) -> object:
        if not _inside(sys._getframe(1)):
            check(args, kwargs)
        return target(*args, **kwargs)

    return call  # type: ignore[return-value]


def _inside(frame: types.FrameType | None) -> bool:
    """Whether the call comes from tracediag's own code, which is past the boundary: its arguments were
    checked where they came in. (A plan's search builds 5,381 `Split`s and `Training`s: checked at each,
    `plan` of llama3-8b on 64 GPUs took 111 CPU-ms against 90 unchecked; past the boundary, 92.)
    `dataclasses.replace` builds an instance on behalf of its own caller, who decides."""
    while frame is not None and frame.f_globals.get("__name__") == "dataclasses":
        frame = frame.f_back
    module = frame.f_globals.get("__name__", "") if frame is not None else ""
    return module.startswith("tracediag.") or module == "tracediag"


class CheckedEnumType(enum.EnumType):
    """The metaclass of a public enum: its call with a value of another type than its members' (``Cause(7)``)
    is `checked`'s one-line `TypeError`, not a lookup that compares the value with each member (a polars
    DataFrame answers ``==`` with a frame); an unknown value of the right type stays the enum's `ValueError`."""

    def __call__(cls, value: object, *args: Any, **kwargs: Any) -> Any:
        """The member `value` names (the enum's own call: with more arguments, its functional API)."""
        if not args and not kwargs and cls._member_map_ and not _compiled(cls)(value):
            raise wrong_type(public_name(cls), "value", _describe(cls), value)
        return super().__call__(value, *args, **kwargs)


def public_name(target: Any) -> str:
    """How a message names `target`: ``tracediag.load`` (``tracediag.Run.save``) for a name of the package's
    `__all__` (a method of one), else where it is defined (``tracediag.model.specs.Split``). The package is
    looked up, not imported (it is the last stage, docs/architecture.md): it was imported before any of its
    modules."""
    package = sys.modules["tracediag"]
    head = target.__qualname__.split(".")[0]  # a method's class
    public = getattr(package, head, None) if head in package.__all__ else None
    defined = getattr(sys.modules[target.__module__], head, None)
    if public is not None and getattr(public, "__wrapped__", public) is getattr(defined, "__wrapped__", defined):
        return f"tracediag.{target.__qualname__}"
    return f"{target.__module__}.{target.__qualname__}"


def wrong_type(caller: str, name: str, expected: str, value: object) -> TypeError:
    """The one-line error for argument `name` of `caller` given `value`, where `expected` was asked."""
    return TypeError(f"{caller}: `{name}` must be {expected}; got {_given(value)}")


@dataclass(frozen=True, eq=False)
class Table:
    """The contract of a table argument, declared in its hint: ``Annotated[pl.DataFrame, Table(...)]``
    (`schema.EventTable`, `schema.GemmTable`). A frame without some of `schema`'s columns, or with one
    of another dtype, is a one-line `TracediagError` that names them (more columns may follow)."""

    what: str
    """The table's name in a message: 'event-table'."""
    schema: Mapping[str, Any]
    """Column name -> polars dtype."""
    source: str
    """Where such a table comes from, said after the problem: 'tracediag.load builds it'."""

    def check(self, caller: str, name: str, frame: object) -> None:
        """Raise if `frame` (a polars DataFrame; anything else was refused by its type) breaks the contract."""
        have = getattr(frame, "schema", None)
        if have is None:
            return
        missing = [c for c in self.schema if c not in have]
        if missing:
            msg = f"{caller}: `{name}` lacks the {self.what} columns {', '.join(missing)} ({self.source})"
            raise TracediagError(msg)
        other = [f"{c} is {have[c]}, not {dtype}" for c, dtype in self.schema.items() if have[c] != dtype]
        if other:
            msg = f"{caller}: `{name}` has {self.what} columns of another dtype: {'; '.join(other)} ({self.source})"
            raise TracediagError(msg)


class _ModuleNames(abc.Mapping):
    """The names of a module as its hints see them, those it imports on first use (a module `__getattr__`:
    `analysis.Check`) included."""

    def __init__(self, module: types.ModuleType) -> None:
        self.module = module

    def __getitem__(self, name: str) -> object:
        try:
            return getattr(self.module, name)
        except AttributeError:
            raise KeyError(name) from None

    def __iter__(self) -> abc.Iterator[str]:
        return iter(vars(self.module))

    def __len__(self) -> int:
        return len(vars(self.module))


class _Check:
    """The argument check of one public callable. Its signature and hints are read, and compiled into one
    test per parameter, at the first call: the hints may name classes defined after it, and a process calls
    few of the public callables it imports."""

    def __init__(self, target: Any) -> None:
        self.target = target
        self.tables: dict[str, list[Table]] | None = None
        """None until the first call compiles the check."""

    def _read_signature(self) -> None:
        self.signature = signature = inspect.signature(self.target)
        params = list(signature.parameters.values())
        self.positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        self.var_positional = next((p.name for p in params if p.kind is p.VAR_POSITIONAL), None)
        self.var_keyword = next((p.name for p in params if p.kind is p.VAR_KEYWORD), None)
        self.keywords = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        required = {p.name for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        self.required_after = [required - set(self.positional[:n]) for n in range(len(self.positional) + 1)]
        """Per number of positional arguments given, the required names they leave to keywords."""

    def __call__(self, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
        if self.tables is None:
            self._compile()
        n, keys = len(args), kwargs.keys()
        positional = self.positional
        if (
            (n > len(positional) and self.var_positional is None)
            or not self.required_after[min(n, len(positional))] <= keys
            or (self.var_keyword is None and not keys <= self.keywords)
            or (n and kwargs and not keys.isdisjoint(positional[:n]))
        ):
            self._refuse_binding(args, kwargs)
        tests = self.tests
        for name, value in zip(positional, args):
            if not tests[name](value):
                self._refuse(name, name, value)
        for value in args[len(positional) :]:
            if not tests[self.var_positional](value):
                self._refuse(self.var_positional, self.var_positional, value)
        for name, value in kwargs.items():
            test = tests.get(name)
            if test is None:
                if not tests[self.var_keyword](value):
                    self._refuse(name, self.var_keyword, value)
            elif not test(value):
                self._refuse(name, name, value)
        if self.tables:
            for name, tables in self.tables.items():
                i = positional.index(name) if name in positional else None
                value = args[i] if i is not None and i < n else kwargs.get(name)
                for table in tables:
                    table.check(public_name(self.target), name, value)

    def _refuse(self, name: str, param: str, value: object) -> None:
        raise wrong_type(public_name(self.target), name, _describe(self.hints.get(param, Any)), value)

    def _compile(self) -> None:
        self._read_signature()
        module = _ModuleNames(sys.modules[self.target.__module__])
        self.hints: dict[str, Any] = typing.get_type_hints(self.target, localns=module, include_extras=True)
        names = [*self.positional, *self.keywords, self.var_positional, self.var_keyword]
        self.tests = {n: _compiled(self.hints.get(n, Any)) for n in names if n is not None}
        self.tables = {n: _tables(self.hints[n]) for n in names if n in self.hints and _tables(self.hints[n])}

    def _refuse_binding(self, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
        """A missing, extra or doubled argument: Python's words for it, with the caller's name."""
        try:
            self.signature.bind(*args, **kwargs)
        except TypeError as e:
            msg = f"{public_name(self.target)}: {e}"
            raise TypeError(msg) from None


def _tables(hint: Any) -> list[Table]:
    """The `Table` contracts `hint` declares (``Annotated[pl.DataFrame, Table(...)]``, or ``... | None``)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        return [m for m in hint.__metadata__ if isinstance(m, Table)]
    if origin is typing.Union or origin is types.UnionType:
        return [t for a in args for t in _tables(a)]
    return []


def _anything(value: object) -> bool:
    return True


@functools.cache
def _compiled(hint: Any) -> Callable[[object], bool]:
    """The test of whether a value is of the type `hint` names (a container: its items too)."""
    if hint is Any or isinstance(hint, TypeVar):
        return _anything
    if hint is None or hint is type(None):
        return lambda v: v is None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        return _compiled(args[0])
    if origin is typing.Union or origin is types.UnionType:
        parts = tuple(_compiled(a) for a in args)
        return lambda v: any(part(v) for part in parts)
    if origin is typing.Literal:
        return lambda v: any(type(v) is type(a) and v == a for a in args)
    if origin is None:
        return _instance_of(hint)
    if origin is abc.Callable:
        return callable
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            item = _compiled(args[0])
            return lambda v: isinstance(v, tuple | list) and all(map(item, v))
        items = tuple(_compiled(a) for a in args)
        return lambda v: (
            isinstance(v, tuple | list)
            and (not items or (len(v) == len(items) and all(t(x) for t, x in zip(items, v))))
        )
    if not isinstance(origin, type):
        return _anything  # a form typing cannot check at run time: left to the code
    if origin is type:
        return lambda v: isinstance(v, type)
    if issubclass(origin, abc.Mapping):
        key, item = (_compiled(a) for a in (args or (Any, Any)))
        if key is _anything and item is _anything:
            return lambda v: isinstance(v, abc.Mapping)
        return lambda v: isinstance(v, abc.Mapping) and all(key(k) and item(x) for k, x in v.items())
    if issubclass(origin, abc.Iterator):
        return lambda v: isinstance(v, abc.Iterator)
    if issubclass(origin, abc.Iterable):
        item = _compiled(args[0]) if args else _anything
        # items are checked where that consumes nothing: a generator is taken as it is
        return lambda v: (
            not isinstance(v, _NOT_ITEMS)
            and isinstance(v, origin)
            and (isinstance(v, abc.Iterator) or item is _anything or all(map(item, v)))
        )
    return lambda v: isinstance(v, origin)


def _instance_of(cls: Any) -> Callable[[object], bool]:
    """`isinstance`, as an annotation means it: an int is a number, a bool is no count, a path is any
    `os.PathLike`, an enum's value stands for its member, a protocol is matched by its methods."""
    if not isinstance(cls, type):
        return _anything  # a name typing cannot check (a NewType, a ParamSpec): left to the code
    if cls is bool:
        return lambda v: isinstance(v, bool)
    if cls is int:
        return lambda v: type(v) is int or (isinstance(v, numbers.Integral) and not isinstance(v, bool))
    if cls is float:
        return lambda v: type(v) is float or type(v) is int or (isinstance(v, numbers.Real) and not isinstance(v, bool))
    if issubclass(cls, os.PathLike):
        return lambda v: isinstance(v, os.PathLike)
    if issubclass(cls, enum.Enum):
        kinds = (cls, *{type(m.value) for m in cls})
        return lambda v: isinstance(v, kinds)
    if getattr(cls, "_is_protocol", False):
        methods = [m for m in vars(cls) if not m.startswith("_")]
        return lambda v: all(callable(getattr(v, m, None)) for m in methods)
    return lambda v: isinstance(v, cls)


def _describe(hint: Any) -> str:
    """What `hint` asks for, in words: 'a str, a path or a list of str or path'."""
    if hint is None or hint is type(None):
        return "None"
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        tables = _tables(hint)
        return f"{_article(tables[0].what.replace('-', ' '))} (a polars DataFrame)" if tables else _describe(args[0])
    if origin is typing.Union or origin is types.UnionType:
        words = [_describe(a) for a in args]
        return ", ".join(words[:-1]) + " or " + words[-1]
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin is None:
        return _article(_noun(hint))
    if origin is abc.Callable:
        return "a callable"
    if isinstance(origin, type) and issubclass(origin, abc.Mapping):
        key, item = args or (Any, Any)
        return f"a mapping of {_noun(key)} to {_noun(item)}"
    if isinstance(origin, type) and issubclass(origin, abc.Iterable):
        return f"a list of {_noun(args[0])}" if args else "a list"
    return _article(_noun(origin))


_NOUNS = {bool: "True or False", int: "int", float: "number", str: "str"}


def _noun(hint: Any) -> str:
    """`hint` as a bare noun ('int', 'str or path')."""
    if hint is None or hint is type(None):
        return "None"
    if hint is Any:
        return "anything"
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        return _noun(args[0])
    if origin is typing.Union or origin is types.UnionType:
        return " or ".join(_noun(a) for a in args)
    if origin is not None:
        return _describe(hint)
    if hint in _NOUNS:
        return _NOUNS[hint]
    if isinstance(hint, type) and issubclass(hint, os.PathLike):
        return "path"
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return f"{hint.__name__} (or its value)"
    if getattr(hint, "__module__", "").startswith("polars."):
        return f"polars {hint.__name__}"
    return getattr(hint, "__name__", str(hint))


def _article(noun: str) -> str:
    if noun in ("None", "anything", "True or False") or noun.startswith(("a ", "an ")):
        return noun
    return ("an " if noun[0] in "aeiouAEIOU" else "a ") + noun


def _given(value: object) -> str:
    """What was given, in one short phrase: its type, and a container's item types."""
    if value is None:
        return "None"
    name = type(value).__name__
    if isinstance(value, list | tuple | set | frozenset):
        if not value:
            return f"an empty {name}"
        items = sorted({type(v).__name__ for v in value})
        return f"a {name} of {', '.join(items[:3])}{', ...' if len(items) > 3 else ''}"
    return name
