"""Every command's output on every fixture (and ../shared trace), written to one folder per tree.

A refactor must change no result (issue 27): run this once with the code before (``PYTHONPATH`` at a
checkout of the old commit) and once after, into two folders, and compare them byte for byte::

    before=$(mktemp -d) && git archive main tracediag | tar -x -C "$before"
    PYTHONPATH="$before" python benchmarks/same_outputs.py "$before.out"
    PYTHONPATH=$PWD python benchmarks/same_outputs.py "$before.after"
    diff -r "$before.out" "$before.after" && echo same

Run from the repository root: the inputs are read there (relative paths, so the file names the
outputs show agree), whichever tree's code is imported. Each case writes its exit code, stdout,
stderr and any file it wrote (JSON, text, HTML, Parquet); the folder a case wrote into is shown as
``<OUT>``, an executor's progress rate as ``<RATE>`` and its scratch folder is left out. No timing:
this checks results only.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

from click.testing import CliRunner

from tracediag.cli import cli

ROOT = Path()
FIXTURES = ROOT / "fixtures"
SHARED = Path("..") / "shared" / "trace-samples"
PREDICT = ["--model", "llama3-8b", "--gpus", "16", "--gpu", "h100-sxm", "--seq-len", "8192", "--global-batch", "32"]
SPLIT = ["--tp", "2", "--pp", "2", "--dp", "4", "--sequence-parallel"]
PLAN = ["--model", "llama3-70b", "--gpus", "64", "--gpu", "h100-sxm", "--seq-len", "8192", "--global-batch", "64"]
CPU_FLAGS = [
    "--gpu", "a100-80gb", "--peak-tflops", "4", "--hbm-gbps", "20", "--gpus-per-node", "4",
    "--intra-link", "1", "--inter-link", "1", "--engine", "megatron-2022",
]  # fmt: skip
MODEL_FLAGS = ["--layers", "2", "--hidden", "512", "--heads", "8", "--ffn", "2048", "--vocab", "4096"]


def run_folders() -> list[Path]:
    """Every folder of fixture runs (one run each) and of the shared samples that holds traces."""
    found = [p.parent for p in sorted(FIXTURES.glob("*runs/*/manifest.json"))]
    found += sorted(p for p in FIXTURES.glob("paired/*/*") if p.is_dir())
    if SHARED.exists():
        found += [SHARED / "gpu-public" / "dlrm_v100_8rank"]
        found += sorted(p for p in SHARED.glob("gpu-public/resnet50_v100_2021/*") if p.is_dir())
        found += sorted({p.parent for p in SHARED.glob("hta/**/*.json*")})
        found += sorted(p for p in SHARED.glob("generated/*") if p.is_dir())
    return found


def single_files() -> list[Path]:
    """Trace files read alone (every reader's fixtures)."""
    out = sorted(FIXTURES.glob("kineto/*.json*")) + sorted(FIXTURES.glob("jax/*.gz"))
    out += sorted(FIXTURES.glob("nsys/*.sqlite.gz")) + sorted(FIXTURES.glob("timeline/*.*[!y]"))
    if SHARED.exists():
        out += sorted(SHARED.glob("gpu-public/formats/*"))
    return out


def cases() -> list[tuple[str, list[str]]]:
    """(name, arguments) of every command run; ``{out}`` in an argument is the case's folder."""
    out: list[tuple[str, list[str]]] = []
    for folder in run_folders():
        key = "_".join(folder.parts[-2:])
        out.append((f"analyze_json_{key}", ["analyze", str(folder), "--format", "json", "--allow-mixed"]))
        out.append((f"analyze_text_{key}", ["analyze", str(folder), "--kernels", "3", "--allow-mixed"]))
        out.append((f"analyze_html_{key}", ["analyze", str(folder), "--allow-mixed", "--html", "{out}/r.html"]))
    runs = FIXTURES / "runs"
    for path in single_files():
        out.append((f"analyze_file_{path.parent.name}_{path.name}", ["analyze", str(path), "--format", "json"]))
        out.append((f"ingest_{path.parent.name}_{path.name}", ["ingest", str(path)]))
    mixed = [str(FIXTURES / "kineto" / "gen_torch2.13cpu_gloo_2rank_rank0.pt.trace.json.gz")]
    mixed.append(str(runs / "comm_bound" / "rank1.pt.trace.json.gz"))
    out.append(("analyze_mixed", ["analyze", *mixed, "--allow-mixed", "--kernels", "2"]))
    out.append(("analyze_mixed_json", ["analyze", *mixed, "--allow-mixed", "--format", "json"]))
    out.append(("analyze_mixed_html", ["analyze", *mixed, "--allow-mixed", "--html", "{out}/r.html"]))
    out.append(("executor_mixed", ["analyze", *mixed, "--allow-mixed", "--executor", "local", "--out", "{out}/s"]))
    out.append(("analyze_refused_mixed", ["analyze", *mixed]))
    for name in ("straggler_persistent", "pipeline_gpipe_m8", "healthy_ddp"):
        executor = ["--executor", "local", "--format", "json", "--out", "{out}/s"]
        out.append((f"executor_{name}", ["analyze", str(runs / name), *executor]))
        out.append((f"ingest_parquet_{name}", ["ingest", str(runs / name), "-o", "{out}/run.parquet"]))
    out.append(("fail_on", ["analyze", str(runs / "straggler_persistent"), "--fail-on", "compute_straggler"]))
    out.append(("fail_on_bad", ["analyze", str(runs / "straggler_persistent"), "--fail-on", "nope"]))
    base, new = runs / "healthy_ddp", runs / "straggler_persistent"
    for fmt in ("text", "json", "html"):
        out.append((f"compare_{fmt}", ["compare", str(base), str(new), "--format", fmt]))
    out.append(("compare_gate", ["compare", str(base), str(new), "--fail-if-slower", "1"]))
    out.append(("predict_text", ["predict", *PREDICT, *SPLIT]))
    out.append(("predict_json", ["predict", *PREDICT, *SPLIT, "--format", "json", "-o", "{out}/plan.json"]))
    out.append(("predict_bad", ["predict", *PREDICT, "--tp", "3"]))
    out.append(("plan_text", ["plan", *PLAN]))
    out.append(("plan_json", ["plan", *PLAN, "--format", "json", "--headroom", "0.25"]))
    out.append(("plan_bf16", ["plan", *PLAN, "--grad-dtype", "bf16", "--dtype", "fp8"]))
    for target in ("megatron", "torchtitan", "deepspeed"):
        out.append((f"plan_emit_{target}", ["plan", *PLAN, "--emit", target]))
    models = FIXTURES / "model_runs"
    shape = [*CPU_FLAGS, *MODEL_FLAGS, "--gpus", "4", "--seq-len", "256", "--global-batch", "16"]
    for name in ("transformer_dp4", "transformer_tp2_dp2"):
        traces = str(models / name / "rank*.pt.trace.json.gz")
        cal = ["calibrate", traces, *shape]
        out.append((f"calibrate_{name}", [*cal, "-o", "{out}/profile.json"]))
        check = ["analyze", traces, *shape, "--micro-batch", "4"]
        check += ["--dp", "4"] if "dp4" in name else ["--tp", "2", "--dp", "2"]
        out.append((f"check_text_{name}", check))
        out.append((f"check_json_{name}", [*check, "--format", "json", "--html", "{out}/r.html"]))
    out.append(("check_plan", ["analyze", str(runs / "healthy_ddp"), "--plan", "{out}/../predict_json/plan.json"]))
    for folder in sorted(p.parent for p in FIXTURES.glob("hang/*/manifest.json")):
        for fmt in ("text", "json", "html"):
            out.append((f"hang_{fmt}_{folder.name}", ["hang", str(folder), "--format", fmt]))
    bad_json = str(FIXTURES / "runs" / "healthy_ddp" / "manifest.json")  # a JSON file of another kind
    trace = str(runs / "healthy_ddp" / "rank0.pt.trace.json.gz")
    errors = {
        "missing_path": ["analyze", "no/such/dir"],
        "glob_matches_nothing": ["analyze", "fixtures/runs/healthy_ddp/*.nothing"],
        "output_is_input": ["analyze", str(runs / "healthy_ddp"), "-o", trace],
        "html_is_input": ["analyze", str(runs / "healthy_ddp"), "--html", trace],
        "executor_output_is_input": ["analyze", str(runs / "healthy_ddp"), "--executor", "local", "-o", trace],
        "bad_plan": ["analyze", str(runs / "healthy_ddp"), "--plan", bad_json],
        "bad_model": [
            "predict",
            "--model",
            bad_json,
            "--gpus",
            "8",
            "--gpu",
            "h100-sxm",
            "--seq-len",
            "8",
            "--global-batch",
            "8",
        ],
        "bad_profile": ["predict", *PREDICT, "--profile", bad_json],
        "plan_bad_profile": ["plan", *PLAN, "--profile", bad_json],
        "one_file_unreadable": ["analyze", str(runs / "healthy_ddp" / "rank0.pt.trace.json.gz"), bad_json],
        "rank_map_bad": ["analyze", str(runs / "healthy_ddp"), "--rank", "x=y"],
    }
    out += [(f"error_{name}", args) for name, args in errors.items()]
    refused = ["calibrate", str(runs / "healthy_ddp" / "rank*.pt.trace.json.gz"), *CPU_FLAGS, "-o", "{out}/p.json"]
    out.append(("calibrate_refused", refused))
    return out


def main(dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    runner = CliRunner()
    saved = dest / "_saved.json"
    todo = cases()
    todo.append(("save", ["analyze", str(FIXTURES / "runs" / "stage_imbalance"), "--format", "json", "-o", str(saved)]))
    todo.append(("report_html", ["report", str(saved), "-o", "{out}/r.html"]))
    todo.append(("compare_saved", ["compare", str(saved), str(saved), "--format", "json"]))
    for name, args in todo:
        case = dest / name
        case.mkdir()
        argv = [a.replace("{out}", str(case)) for a in args]
        result = runner.invoke(cli, argv)
        e = result.exception
        crash = "" if e is None or isinstance(e, SystemExit) else f"crash: {type(e).__name__}: {e}\n"
        show = str(case)
        shutil.rmtree(case / "s", ignore_errors=True)  # an executor's scratch: attempts and timings
        rate = re.compile(r"[\d.]+ files/s · [\d.]+ MB/s")
        (case / "exit").write_text(f"{result.exit_code}\n{crash}")
        (case / "stdout").write_text(result.stdout.replace(show, "<OUT>"))
        (case / "stderr").write_text(rate.sub("<RATE>", result.stderr.replace(show, "<OUT>")))
        print(name, result.exit_code, file=sys.stderr)
    saved.unlink(missing_ok=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
