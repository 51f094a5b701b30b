"""What `tracediag analyze` prints: one analysis, or one per file (``--allow-mixed``), as the versioned
JSON document (docs/analysis-json.md) or as text, each with its observed-vs-predicted block when a
plan or a model was given."""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

from tracediag.errors import shown

if TYPE_CHECKING:
    from tracediag.analysis import Analysis


def analyses_json(results: list[tuple[str, Analysis]]) -> str:
    """One analysis as its document; analyses per file as ``{"per_file": [...]}``, each naming its file."""
    return analyses_json_bytes(results, newline=False).decode()


def analyses_json_bytes(results: list[tuple[str, Analysis]], *, newline: bool = True) -> bytes:
    """`analyses_json` as UTF-8 (with a final newline: the file ``analyze -o`` writes), made once: no str
    copies of a document that is 180 MB at 16,384 ranks."""
    docs = [{**({"file": p} if p else {}), **r.to_dict()} for p, r in results]
    doc = docs[0] if len(docs) == 1 and not results[0][0] else {"per_file": docs}
    del docs
    return orjson.dumps(doc, option=orjson.OPT_APPEND_NEWLINE if newline else None)


def analyses_text(results: list[tuple[str, Analysis]], *, kernels_top: int = 0) -> str:
    """The text report of each analysis, its check's block and (`kernels_top`) each rank's top kernels;
    an analysis of one file of several headed by its name."""
    from tracediag.report.check_text import render_check_text
    from tracediag.report.kernels_text import render_kernels
    from tracediag.report.text import render_text

    parts = []
    for p, r in results:
        body = render_text(r)
        if r.check is not None:
            body += f"\n\n{render_check_text(r.check)}"
        if kernels_top:
            body += "\n\n" + render_kernels(r, kernels_top)
        parts.append(f"== {shown(p)} (analysed alone: --allow-mixed)\n{body}" if p else body)
    return "\n\n".join(parts)
