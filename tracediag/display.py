"""How the result types show themselves: a short ``repr`` and, in a notebook, HTML.

The result types (`Analysis`, `Finding`, `Check`, `Comparison`, `Prediction`) live in stages before the
report (docs/architecture.md), so their ``_repr_html_`` cannot import it: it calls the renderer installed
here, which the package's façade (`tracediag/__init__.py`) installs on import, before any result type
exists. Until one is installed, ``_repr_html_`` returns None and a notebook shows the plain ``repr``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracediag.units import noun, spans

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

_RENDERER: list[Callable[[object], str]] = []
"""The installed renderer (at most one): the one hook between the result types and the report."""
LISTED = 4
"""Ranks or steps a ``repr`` names before it counts the rest."""
CUT = 140
"""Characters of a sentence (a summary, a headline) a ``repr`` keeps."""


def install(render: Callable[[object], str]) -> None:
    """Make `render` the HTML renderer of every result type (replacing any before it)."""
    _RENDERER[:] = [render]


def html(obj: object) -> str | None:
    """`obj` as an HTML fragment, or None (plain text only) when no renderer is installed."""
    return _RENDERER[0](obj) if _RENDERER else None


def listing(word: str, values: Iterable[int]) -> str:
    """``rank 2``, ``ranks 0–3``, ``steps 1, 4, 9, 12 … (20)``: runs joined, at most `LISTED` pieces."""
    values = sorted(set(values))
    pieces = spans(values)
    more = f" … ({len(values):,})" if len(pieces) > LISTED else ""
    return f"{noun(len(values), word)} {', '.join(pieces[:LISTED])}{more}" if values else f"no {word}s"


def cut(sentence: str, limit: int = CUT) -> str:
    """`sentence` on one line, cut to `limit` characters with an ellipsis."""
    one = " ".join(sentence.split())
    return one if len(one) <= limit else one[: limit - 1].rstrip() + "…"
