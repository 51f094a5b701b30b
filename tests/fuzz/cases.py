"""Fuzz cases: a seed picks a command and a real input, mutates one file it takes (`mutate`), runs the CLI in
process (click's CliRunner) and checks the invariant every input must keep (`check`):

- the exit status is 0, 2 or 3 (never 1, an internal error);
- no traceback in the output;
- the inputs are byte for byte as they were;
- exit 2 is one line ``Error: FILE: problem`` that names the file (or its folder) among at most a few
  one-line warnings;
- a file only a `mutate.LOUD` mutator changed (its events twice) is never read as if nothing were wrong:
  exit 0 needs a warning.
"""

from __future__ import annotations

import gzip
import hashlib
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from click.testing import CliRunner

from fuzz import mutate
from tracediag.cli import cli
from tracediag.errors import shown

if TYPE_CHECKING:
    from collections.abc import Callable

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
KINETO = FIXTURES / "kineto"
GLOO = [KINETO / f"gen_torch2.13cpu_gloo_2rank_rank{r}.pt.trace.json.gz" for r in (0, 1)]
KINETO_FILES = [*GLOO, KINETO / "hta_backward_thread.json", KINETO / "hta_triton_example.json.gz",
                KINETO / "hta_cpu_only_gloo_rank34.json.gz", KINETO / "hta_rocm_mi250.json.gz"]  # fmt: skip
JAX_FILES = sorted((FIXTURES / "jax").glob("*cpu2dev.trace.json.gz"))
NSYS_FILES = sorted((FIXTURES / "nsys").glob("*.sqlite.gz"))
HANG_DIRS = sorted(p for p in (FIXTURES / "hang").iterdir() if p.is_dir())
MODEL_RUN = FIXTURES / "model_runs" / "transformer_dp4"
RUN = FIXTURES / "runs" / "healthy_ddp"

ALLOWED = (0, 2, 3)

CPU_FLAGS = [
    "--gpu", "a100-80gb", "--peak-tflops", "4", "--hbm-gbps", "20", "--gpus-per-node", "4",
    "--intra-link", "1", "--inter-link", "1", "--engine", "megatron-2022",
]  # fmt: skip
MODEL_FLAGS = ["--layers", "2", "--hidden", "512", "--heads", "8", "--ffn", "2048", "--vocab", "4096"]
CALIBRATE = [*CPU_FLAGS, *MODEL_FLAGS, "--seq-len", "256", "--global-batch", "16", "--micro-batch", "4", "--zero", "0"]
PREDICT = ["predict", *CPU_FLAGS, *MODEL_FLAGS, "--gpus", "4", "--seq-len", "256", "--global-batch", "16",
           "--tp", "2", "--dp", "2", "--micro-batch", "8", "--zero", "0"]  # fmt: skip


@dataclass
class Case:
    """One fuzz case, replayed exactly by its kind and seed."""

    kind: str
    seed: int
    args: list[str]
    mutated: Path
    """The file the mutation wrote (what an error must name, or its folder)."""
    what: str
    """The mutations applied."""


@dataclass
class Outcome:
    case: Case
    exit_code: int
    output: str


def _content(path: Path) -> bytes:
    raw = path.read_bytes()
    return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw


def _write(path: Path, data: bytes, rng: random.Random, *, may_gzip: bool) -> tuple[Path, str]:
    """`data` to `path`, or (sometimes) gzipped (and maybe damaged as a container) to `path`.gz."""
    if may_gzip and rng.random() < 0.25:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(mutate.container(data, rng))
        return path, "+container"
    path.write_bytes(data)
    return path, ""


def _out(inputs: Path, name: str = "o.parquet") -> str:
    return str(inputs.parent / "out" / name)


def _kineto(tmp: Path, rng: random.Random, seed: int, sides: dict[str, Path]) -> Case:
    command = rng.choice(["ingest", "ingest", "analyze", "calibrate"])
    if command == "analyze":
        source, other = rng.sample(GLOO, 2)
    elif command == "calibrate":
        source = rng.choice(sorted(MODEL_RUN.glob("rank*.json.gz")))
    else:
        source = rng.choice(KINETO_FILES)
    data, what = mutate.mutate(_content(source), rng, mutate.JSON_MUTATORS)
    rank = source.name.split("rank")[-1][:1] if "rank" in source.name else "0"
    path, extra = _write(tmp / f"rank{rank}.json", data, rng, may_gzip=True)
    args = [command, str(path)]
    if command == "ingest":
        args += ["-o", _out(tmp)]
        if rng.random() < 0.5:
            args += ["--rank-from-filename", r"rank(\d+)"]
    elif command == "analyze":
        args += [str(other), "--format", rng.choice(["text", "json"])]
    else:
        args = ["calibrate", *(str(p) for p in sorted(MODEL_RUN.glob("rank*.json.gz")) if p != source), str(path)]
        args += [*CALIBRATE, "-o", _out(tmp, "profile.json")]
    return Case("kineto", seed, args, path, what + extra)


def _jax(tmp: Path, rng: random.Random, seed: int, sides: dict[str, Path]) -> Case:
    source = rng.choice(JAX_FILES)
    xplane = source.with_name(source.name.replace(".trace.json.gz", ".xplane.pb.gz"))
    name = source.name.removesuffix(".gz")
    if rng.random() < 0.2:  # the xplane beside it damaged, the trace intact
        shutil.copyfile(source, tmp / source.name)
        data, what = mutate.mutate(_content(xplane), rng, mutate.BYTE_MUTATORS)
        path = tmp / xplane.name
        path.write_bytes(gzip.compress(data, mtime=0))
        return Case("jax", seed, ["ingest", str(tmp / source.name), "-o", _out(tmp)], path, what)
    shutil.copyfile(xplane, tmp / xplane.name)
    data, what = mutate.mutate(_content(source), rng, mutate.JSON_MUTATORS)
    path, extra = _write(tmp / name, data, rng, may_gzip=True)
    return Case("jax", seed, ["ingest", str(path), "-o", _out(tmp)], path, what + extra)


def _nsys(tmp: Path, rng: random.Random, seed: int, sides: dict[str, Path]) -> Case:
    source = rng.choice(NSYS_FILES)
    data, what = mutate.mutate(_content(source), rng, mutate.SQLITE_MUTATORS)
    path, extra = _write(tmp / source.name.removesuffix(".gz"), data, rng, may_gzip=True)
    return Case("nsys", seed, ["ingest", str(path), "-o", _out(tmp)], path, what + extra)


def _hang(tmp: Path, rng: random.Random, seed: int, sides: dict[str, Path]) -> Case:
    source = rng.choice(HANG_DIRS)
    folder = tmp / source.name
    shutil.copytree(source, folder)
    dumps = sorted(p for p in folder.iterdir() if p.name != "manifest.json")
    victim = rng.choice(dumps)
    mutators = mutate.JSON_MUTATORS if victim.suffix == ".json" else mutate.PICKLE_MUTATORS
    data, what = mutate.mutate(victim.read_bytes(), rng, mutators)
    victim.write_bytes(data)
    args = ["hang", *(str(p) for p in dumps), "--format", rng.choice(["text", "json"])]
    return Case("hang", seed, args, victim, what)


def _side_file(kind: str) -> Callable:
    """A case over a file a command takes beside its traces: the plan of `analyze --plan`, the profile of
    `predict --profile`."""

    def build(tmp: Path, rng: random.Random, seed: int, sides: dict[str, Path]) -> Case:
        data, what = mutate.mutate(sides[kind].read_bytes(), rng, mutate.DOC_MUTATORS)
        path = tmp / f"{kind}.json"
        path.write_bytes(data)
        if kind == "plan":
            return Case(kind, seed, ["analyze", str(RUN), "--plan", str(path)], path, what)
        return Case(kind, seed, [*PREDICT, "--profile", str(path)], path, what)

    return build


def _resume(tmp: Path, rng: random.Random, seed: int, sides: dict[str, Path]) -> Case:
    """`analyze --executor local --out DIR --resume` over summaries of the real run with one file damaged."""
    out = tmp / "summaries"
    shutil.copytree(sides["summaries"], out)
    victim = rng.choice(sorted(p for p in out.rglob("*.parquet")))
    data, what = mutate.mutate(victim.read_bytes(), rng, mutate.BYTE_MUTATORS)
    victim.write_bytes(data)
    args = ["analyze", str(RUN), "--executor", "local", "-j", "1", "--out", str(out), "--resume"]
    return Case("resume", seed, args, victim, what)


BUILDERS: dict[str, Callable] = {
    "kineto": _kineto,
    "jax": _jax,
    "nsys": _nsys,
    "hang": _hang,
    "plan": _side_file("plan"),
    "profile": _side_file("profile"),
    "resume": _resume,
}
WEIGHTS = {"kineto": 6, "jax": 2, "nsys": 3, "hang": 4, "plan": 2, "profile": 2}
"""How often each kind is drawn (the cheap readers more often than a whole analysis). `resume` starts a
worker process for the rank it must read again (seconds a case): only the campaign draws it."""


def side_files(tmp: Path, *, summaries: bool = False) -> dict[str, Path]:
    """The real side files the side-file cases mutate: a plan (`predict -o`), a profile (`calibrate -o`
    from the real transformer_dp4 run) and, with `summaries`, the summaries of `analyze --executor`."""
    tmp.mkdir(parents=True, exist_ok=True)
    sides = {"plan": tmp / "plan.json", "profile": tmp / "profile.json", "summaries": tmp / "summaries"}
    runs = [
        [*PREDICT, "-o", str(sides["plan"])],
        ["calibrate", str(MODEL_RUN / "rank*.pt.trace.json.gz"), *CALIBRATE, "-o", str(sides["profile"])],
    ]
    if summaries:
        runs.append(["analyze", str(RUN), "--executor", "local", "-j", "1", "--out", str(sides["summaries"])])
    for args in runs:
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
    return sides


def build(seed: int, root: Path, sides: dict[str, Path], weights: dict[str, int] | None = None) -> Case:
    """The case of `seed`: its input files written to `root`/in, its outputs going to `root`/out."""
    rng = random.Random(seed)
    weights = weights or WEIGHTS
    kind = rng.choices(list(weights), weights=list(weights.values()))[0]
    for folder in ("in", "out"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    return BUILDERS[kind](root / "in", rng, seed, sides)


def digests(paths: list[Path]) -> dict[str, str]:
    """sha256 of every file under `paths`."""
    files = [f for p in paths for f in ([p] if p.is_file() else sorted(p.rglob("*"))) if f.is_file()]
    return {str(f): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


def inputs(case: Case) -> list[Path]:
    """The files and folders `case` reads: the folder of its mutated file, and the fixtures it names (not
    the summaries `--resume` reads: their folder is the --out it writes, and a damaged one is redone)."""
    named = [Path(a) for a in case.args if a.startswith(str(FIXTURES))]
    mutated = [] if case.kind == "resume" else [case.mutated.parent]
    return [*mutated, *(p for p in named if p.exists())]


def run(case: Case) -> Outcome:
    """The CLI on `case`, in process. What click's runner lets through (a BaseException such as a Rust
    panic in polars) is an outcome too: exit 1 with a traceback, so the invariant reports it."""
    try:
        result = CliRunner().invoke(cli, case.args)
    except BaseException as e:  # the fuzzer sees everything
        if isinstance(e, KeyboardInterrupt):
            raise
        return Outcome(case, 1, f"Traceback: {type(e).__name__}: {str(e)[:200]}")
    return Outcome(case, result.exit_code, result.output)


def problems(outcome: Outcome) -> list[str]:
    """What `outcome` breaks of the invariant (empty: nothing)."""
    case, out = outcome.case, outcome.output
    found = []
    if outcome.exit_code not in ALLOWED:
        found.append(f"exit {outcome.exit_code}")
    if "Traceback" in out or "internal error" in out:
        found.append("a traceback or internal error")
    if outcome.exit_code == 2:
        errors = [line for line in out.splitlines() if line.startswith("Error:")]
        # a message naming several files names each by the end of its path that tells them apart
        names = (shown(case.mutated), shown(case.mutated.parent), f"{case.mutated.parent.name}/{case.mutated.name}")
        if len(errors) != 1:
            found.append(f"{len(errors)} error lines")
        elif not any(n in errors[0] for n in names):
            found.append("the error names no file")
    applied = set(case.what.replace("+container", "").split("+"))
    if outcome.exit_code == 0 and applied <= mutate.LOUD and "warning" not in out.lower():
        found.append("read as if nothing were wrong")
    return found
