"""Side by side with torch's own `torchfrtrace` on every pickle fixture of fixtures/hang (issue 25):
wherever it names a culprit collective and ranks, tracediag names the same.

torch 2.13's `torchfrtrace` stops with ``KeyError`` on gloo dumps as written (gloo's ``pg_config`` is keyed
by an empty name), so it is run twice: on the dumps as written, and on a copy whose ``pg_config`` lists each
group under its name with the members the fixture script created (its manifest's ``groups``); nothing else
changes. torch runs in a separate interpreter: this one if it has torch, else ``$TRACEDIAG_TORCH_PYTHON``;
without either the tests skip and say so. ``python tests/test_hang_torchfrtrace.py`` prints the table of
docs/hang.md.
"""

from __future__ import annotations

import json
import pickle
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import FIXTURES, torch_python

import tracediag
from tracediag.ingest.safepickle import load_plain

HANG = FIXTURES / "hang"
PICKLED = sorted(p.parent.name for p in HANG.glob("*/nccl_trace_rank_0"))


@dataclass(frozen=True)
class FrTrace:
    """What torchfrtrace said: its exit status, last line, and the first culprit it names."""

    rc: int
    last_line: str
    seq: int | None
    group: str | None
    ranks: tuple[int, ...]
    undecided: bool


def _parse(rc: int, out: str) -> FrTrace:
    lines = [line for line in out.splitlines() if line.strip()]
    m = re.search(r"sequence number: (\d+)", out)
    seq = group = None
    ranks: tuple[int, ...] = ()
    if m:
        seq = int(m.group(1))
        block = out[m.end() :].split("sequence number:")[0]
        g = re.search(r"group info: ([^:\n]+)", block)
        group = g.group(1) if g else None
        missing = re.search(r"missing ranks: \{([\d, ]*)\}", block)
        culprits = re.findall(r"Culprit rank (\d+)", block)
        found = missing.group(1).split(",") if missing else culprits
        ranks = tuple(sorted(int(r) for r in found if r.strip()))
    return FrTrace(rc, lines[-1] if lines else "", seq, group, ranks, "We cannot decide" in out)


def _copy(scenario: str, dest: Path, *, fill: bool) -> Path:
    """The scenario's dumps in `dest`; with `fill`, each rank's pg_config lists the groups it is in."""
    dest.mkdir(parents=True, exist_ok=True)
    groups = json.loads((HANG / scenario / "manifest.json").read_text())["groups"]
    paths = sorted((HANG / scenario).glob("nccl_trace_rank_*"))
    docs = {p: load_plain(p.read_bytes(), str(p)) for p in paths}
    descs = {e["process_group"][0]: e["process_group"][1] for doc in docs.values() for e in doc["entries"]}
    for src in paths:
        data = src.read_bytes()
        if fill:
            doc, rank = docs[src], int(src.name.rsplit("_", 1)[1])
            doc["pg_config"] = {
                name: {"name": name, "desc": descs.get(name, ""), "ranks": str(ranks)}
                for name, ranks in groups.items()
                if rank in ranks
            }
            data = pickle.dumps(doc, protocol=2)
        (dest / src.name).write_bytes(data)
    return dest


def run_frtrace(python: str, scenario: str, tmp: Path, *, fill: bool) -> FrTrace:
    folder = _copy(scenario, tmp / ("filled" if fill else "as_written") / scenario, fill=fill)
    cmd = [python, "-m", "torch.distributed.flight_recorder.fr_trace", str(folder), "--allow-incomplete-ranks"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    return _parse(done.returncode, done.stdout + done.stderr)


@pytest.fixture(scope="module")
def python() -> str:
    found = torch_python()
    if found is None:
        pytest.skip("torch is not installed: set TRACEDIAG_TORCH_PYTHON to a python with torch to run torchfrtrace")
    return found


@pytest.mark.parametrize("scenario", PICKLED)
def test_as_written_torchfrtrace_stops_on_gloo_dumps(python, scenario, tmp_path):
    """The limitation issue 25 reports: a KeyError in build_collectives, no analysis."""
    fr = run_frtrace(python, scenario, tmp_path, fill=False)
    assert fr.rc != 0
    assert fr.last_line.startswith("KeyError")


@pytest.mark.parametrize("scenario", PICKLED)
def test_same_culprit_as_torchfrtrace(python, scenario, tmp_path):
    fr = run_frtrace(python, scenario, tmp_path, fill=True)
    assert fr.rc == 0, fr.last_line
    ours = tracediag.hang(HANG / scenario)
    if fr.seq is not None:
        assert (ours.culprit_group, ours.culprit_seq, ours.culprit_ranks) == (fr.group, fr.seq, fr.ranks)
    elif fr.undecided:
        assert ours.verdict == "undecided"
    else:
        assert ours.verdict in ("consistent", "desync")


def main() -> None:
    """The table of docs/hang.md: torchfrtrace (as written / pg_config filled) and tracediag per fixture."""
    import tempfile

    python = torch_python()
    if python is None:
        msg = "no python with torch: set TRACEDIAG_TORCH_PYTHON"
        raise SystemExit(msg)
    print("| fixture | torchfrtrace, dumps as written | torchfrtrace, pg_config filled | tracediag |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for scenario in sorted(p.parent.name for p in HANG.glob("*/manifest.json")):
            ours = tracediag.hang(HANG / scenario)
            said = f"{ours.verdict}: {ours.sentence.split(';')[0].rstrip('.')}"
            if scenario not in PICKLED:
                print(f"| {scenario} | reads pickles only | reads pickles only | {said} |")
                continue
            raw = run_frtrace(python, scenario, Path(tmp), fill=False)
            filled = run_frtrace(python, scenario, Path(tmp), fill=True)
            if filled.seq is not None:
                named = f"#{filled.seq} of group {filled.group}, ranks {list(filled.ranks)}"
            elif filled.undecided:
                named = '"cannot decide" (missing dumps)'
            else:
                named = "no error found"
            print(f"| {scenario} | `{raw.last_line[:40]}` | {named} | {said} |")


if __name__ == "__main__":
    main()
