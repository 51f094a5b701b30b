"""User regular expressions (`--step-regex`, `--rank-from-filename`), run by polars' engine.

Polars' engine (Rust `regex`) matches in linear time: no pattern can make a match run for minutes on
a 30-character name, which Python's backtracking `re` can (`^(a+)+$`). The price is no look-around
and no back-references; such a pattern is refused in one line naming the option.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl


@dataclass(frozen=True, slots=True)
class UserRegex:
    """A pattern the linear-time engine accepts, and how many capture groups it has."""

    pattern: str
    groups: int

    def first_group(self, texts: list[str]) -> list[str | None]:
        """For each text: its first group (the whole match without groups), None when no match."""
        s = pl.Series(texts, dtype=pl.String)
        return s.str.extract(self.pattern, 1 if self.groups else 0).to_list()


def user_regex(pattern: str, option: str) -> UserRegex:
    """`pattern` checked by the engine; a one-line `ValueError` naming `option` when it is refused."""
    try:
        found = pl.Series([""], dtype=pl.String).str.extract_groups(pattern)
    except pl.exceptions.PolarsError as e:
        lines = [ln.strip() for ln in str(e).splitlines()]
        why = next((ln.removeprefix("error: ") for ln in lines if ln.startswith("error:")), lines[0] if lines else "")
        msg = f"{option} {pattern!r} is not a valid regular expression ({why}; the engine matches in linear time)"
        raise ValueError(msg) from None
    return UserRegex(pattern, len(found.dtype.fields))  # type: ignore[union-attr]
