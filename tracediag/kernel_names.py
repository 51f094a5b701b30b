"""Short kernel names for tables: C++ names demangled and shortened, keeping what tells them apart.

A CUDA kernel's name as the profiler records it is the whole template instance, return type and
parameter list included (up to 2,000 characters on the DLRM traces). `short_names` turns each into
what a reader needs to tell it from its neighbours: no return type, no parameter lists, no namespace
qualifiers, lambdas as ``{lambda(float)}`` (their parameter types are often the dtype), and the
template arguments nested two deep summarised to the floating-point types they name
(``FillFunctor<float>`` stays, ``Array<char*, 1>`` becomes ``Array<…>``). Where two names of one
table would come out the same (``Half`` vs ``float`` nested deeper), both keep the longer form of
the step before, down to the full name. Tables show the short name with the full one on hover; the
JSON keeps the full name.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

MAX_CHARS = 80
"""Longest short name; a longer one keeps its start and its end (where the template arguments are)
around a "…" (unless that makes two names equal)."""
_TAIL = 32

_LAMBDA = re.compile(r"\{lambda\(([^(){}]*)\)#\d+\}")
_CALL_OPERATOR = re.compile(r"::operator\(\)\(\)(?:\s*const)?")
_PARENS = re.compile(r"\([^()]*\)")
_QUALIFIER = re.compile(r"\b[A-Za-z_]\w*::(?=[A-Za-z_~])")
_FLOAT_TYPES = re.compile(r"\b(?:float|double|Half|BFloat16|Float8_\w+|Complex(?:Float|Double|Half))\b")
_CPP = re.compile(r"^(?:void )?[A-Za-z_][\w:]*[<(]")
"""A C++ function or template name: the others (``aten::mm``, ``Memcpy HtoD (Pinned -> Device)``) stay as they are."""
_MANGLED = re.compile(r"_Z(N?)((?:\d+[A-Za-z_]\w*)+)")


def demangle(name: str) -> str:
    """The qualified name of an Itanium-mangled function name (``_Z5saxpyPdS_d`` -> ``saxpy``,
    ``_ZN2at6native3fooEv`` -> ``at::native::foo``); any other name unchanged. Only the name is
    decoded (no template arguments or parameter types): enough to read and group by."""
    m = _MANGLED.match(name)
    if m is None:
        return name
    parts, rest = [], m.group(2)
    while rest and rest[0].isdigit():
        digits = re.match(r"\d+", rest).group()
        n, rest = int(digits), rest[len(digits) :]
        parts.append(rest[:n])
        rest = rest[n:]
        if not m.group(1):  # an unqualified name has one part
            break
    return "::".join(parts) or name


def _summarise_nested(name: str) -> str:
    """Template argument lists two or more deep replaced by the floating-point types they name, or "…"."""
    out, depth, start, inner = [], 0, 0, []
    for i, ch in enumerate(name):
        if ch == "<":
            depth += 1
            if depth == 2:
                out.append(name[start : i + 1])
                start = i + 1
        elif ch == ">":
            if depth == 2:
                inner = list(dict.fromkeys(_FLOAT_TYPES.findall(name[start:i])))
                out.append(", ".join(inner) or "…")
                start = i
            depth -= 1
    out.append(name[start:])
    return "".join(out)


def _cut(name: str) -> str:
    """`name` within `MAX_CHARS`: its start and its last `_TAIL` characters around "…"."""
    return name if len(name) <= MAX_CHARS else f"{name[: MAX_CHARS - _TAIL - 1]}…{name[-_TAIL:]}"


def _clean(name: str) -> str:
    """`name` demangled, without return type, parameter lists and namespace qualifiers (C++ names only)."""
    clean = demangle(name.strip())
    if not _CPP.match(clean):
        return clean
    clean = clean.removeprefix("void ")
    clean = _CALL_OPERATOR.sub("", clean)
    clean = _LAMBDA.sub(lambda m: "{lambda:" + m.group(1).replace(",", ";") + "}", clean)
    clean = clean.replace("(anonymous namespace)::", "")
    while True:  # parameter lists, innermost first
        stripped = _PARENS.sub("", clean)
        if stripped == clean:
            break
        clean = stripped
    clean = _QUALIFIER.sub("", clean)
    clean = re.sub(r"::\{lambda:\}", "", clean)
    clean = re.sub(r"(?:::)?\{lambda:([^{}]*)\}", lambda m: "{lambda(" + m.group(1).replace(";", ",") + ")}", clean)
    return re.sub(r"\s+", " ", clean).replace("> >", ">>").replace("> >", ">>").strip() or name


def _forms(name: str) -> tuple[str, ...]:
    """The forms of `name` to try, shortest first, the full name last."""
    clean = _clean(name)
    summarised = _summarise_nested(clean)
    return (_cut(summarised), summarised, _cut(clean), clean, name)


def short_names(names: Iterable[str]) -> dict[str, str]:
    """Full name -> its short form, unique over `names`: each name takes the first of its forms
    (`_forms`) that no other name of `names` has at the same place; the full name where two would
    still read the same."""
    forms = {n: _forms(n) for n in dict.fromkeys(names)}
    taken = [Counter(f[i] for f in forms.values()) for i in range(5)]
    out = {n: next((f[i] for i in range(4) if taken[i][f[i]] == 1), n) for n, f in forms.items()}
    shown = Counter(out.values())
    return {n: s if shown[s] == 1 else n for n, s in out.items()}
