#!/usr/bin/env python
"""Coverage-guided fuzzing (atheris: libFuzzer for Python) of the C scanner and the JSON pieces of `chrome`.

Each input is decoded as a Chrome trace twice, by the C scanner (`_chromescan`, with the piece machinery
of `chrome.decode` cut to small pieces) and by the msgspec path alone, and must give the same columns or
the same one-line `TracediagError`; any other exception, or a crash in the C code, is a finding. The
scanner's own entry point is also fed the raw input as an array and as an object document. Coverage is
that of `chrome.py` and `native.py` (instrumented) plus, for the C code built without coverage, one edge
per reason the scanner declines a document (`_reason_edges`), so inputs reaching a new reason are kept.

    pip install -e '.[fuzz]'
    python tests/fuzz/atheris_chromescan.py --make-seeds tests/fuzz/corpus/chromescan   # the seeds, once
    python tests/fuzz/atheris_chromescan.py -max_total_time=60 -max_len=4096 NEW_DIR tests/fuzz/corpus/chromescan

libFuzzer writes what it finds to NEW_DIR (the committed corpus stays as it is; merge with
``-merge=1 tests/fuzz/corpus/chromescan NEW_DIR`` to keep the inputs that add coverage, under 200 KB).
With the scanner built with AddressSanitizer (``CFLAGS=-fsanitize=address,undefined``) run it with
``LD_PRELOAD=$(gcc -print-file-name=libasan.so)`` to catch out-of-bounds reads too.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import atheris

with atheris.instrument_imports(include=["tracediag.ingest.chrome", "tracediag.ingest.native"]):
    from tracediag.ingest import chrome, native

from polars.testing import assert_frame_equal

from tracediag.errors import TracediagError

SCANNER = native._chromescan
SOURCE = Path(__file__).resolve().parents[2] / "tracediag" / "ingest" / "_chromescan.c"


def _reason_edges() -> object:
    """A function with one branch per reason `_chromescan.c` declines with (read from its source), so
    libFuzzer sees a new edge when the scanner declines for a new reason."""
    reasons = sorted(set(re.findall(r'FAIL\(st, "((?:[^"\\]|\\.)*)"\)', SOURCE.read_text())))
    lines = ["def edge(reason):"] + [f"    if reason == {r!r}:\n        return {i}" for i, r in enumerate(reasons)]
    namespace: dict = {}
    exec("\n".join([*lines, "    return -1"]), namespace)
    return atheris.instrument_func(namespace["edge"])


_edge = _reason_edges()


def _decoded(data: bytes, *, scanner: bool) -> tuple:
    saved = native._chromescan
    native._chromescan = SCANNER if scanner else None
    try:
        d = chrome.decode(data, "fuzz.json")
    except TracediagError as e:
        return ("error", str(e))
    finally:
        native._chromescan = saved
    return ("ok", d)


def test_one_input(data: bytes) -> None:
    for is_array in (True, False):
        result = SCANNER.Scanner(0).feed(data, is_array, None, 0, -1)
        if isinstance(result, str):
            _edge(result)
    scanned, decoded = _decoded(data, scanner=True), _decoded(data, scanner=False)
    assert scanned[0] == decoded[0], (scanned, decoded)
    if scanned[0] == "error":
        assert scanned[1] == decoded[1], (scanned, decoded)
        assert "\n" not in scanned[1]
        return
    assert_frame_equal(scanned[1].slices, decoded[1].slices)
    assert scanned[1].events_in == decoded[1].events_in
    assert scanned[1].skipped == decoded[1].skipped


ABSOLUTE_PATH = re.compile(rb"/(?:tmp|home|root|work)/")


def make_seeds(folder: Path) -> None:
    """The corpus's seeds: the first events of each real Kineto and JAX fixture (Object and Array form, a
    cut copy), each under 4 KB."""
    import gzip

    import orjson

    fixtures = Path(__file__).resolve().parents[2] / "fixtures"
    folder.mkdir(parents=True, exist_ok=True)
    for path in sorted([*(fixtures / "kineto").glob("*.json*"), *(fixtures / "jax").glob("*.trace.json.gz")]):
        raw = path.read_bytes()
        doc = orjson.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
        events = doc["traceEvents"] if isinstance(doc, dict) else doc
        top = (
            {k: v for k, v in doc.items() if k != "traceEvents" and len(orjson.dumps(v)) < 300}
            if isinstance(doc, dict)
            else {}
        )
        kept = []
        for e in events:
            if len(orjson.dumps({**top, "traceEvents": [*kept, e]})) > 3500:
                break
            kept.append(e)
        name = path.name.removesuffix(".gz").removesuffix(".json")
        # the traces' own paths (a profiler's /tmp files) would read as paths of a developer machine
        whole = ABSOLUTE_PATH.sub(b"/var/", orjson.dumps({**top, "traceEvents": kept}))
        (folder / f"{name}.json").write_bytes(whole)
        (folder / f"{name}.array.json").write_bytes(ABSOLUTE_PATH.sub(b"/var/", orjson.dumps(kept)))
        (folder / f"{name}.cut.json").write_bytes(whole[: len(whole) * 2 // 3])


def main() -> None:
    if sys.argv[1:2] == ["--make-seeds"]:
        make_seeds(Path(sys.argv[2]))
        return
    chrome.CHUNK_BYTES = 512  # pieces, their cuts and the rest are reached by inputs of a few KB
    chrome.SCANNED_ROWS = 8
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
