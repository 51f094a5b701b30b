"""The analytic model as a person or a program reads it: a prediction and a plan as terminal text
(`render_prediction`, `render_plan`) and as the JSON `predict` and `plan` print (`prediction_json`,
`plan_json`), each with the calibration profile it used, if any; what `calibrate` prints."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from tracediag.model.ceilings import mfu_ceiling
from tracediag.model.plan import prediction_warnings
from tracediag.units import count, of_peak

if TYPE_CHECKING:
    from tracediag.model.calibrate import Profile
    from tracediag.model.plan import Plan
    from tracediag.model.predict import Prediction

GIB = 2**30


def _in_flight(n: float) -> str:
    """Micro-batches held at once: whole ones counted ("1 micro-batch", "4 micro-batches"), a fraction kept."""
    if n == int(n):
        return count(int(n), "micro-batch", "micro-batches")
    return f"{n:.1f} micro-batches"


def _gib(x: float) -> str:
    return f"{x / GIB:7.1f} GiB"


def render_prediction(p: Prediction) -> str:
    """Terminal text for one prediction."""
    s, t, mem = p.split, p.time, p.memory
    head = (
        f"{p.model.name} on {p.gpus} x {p.device.name}: tp={s.tp} pp={s.pp} dp={s.dp} cp={s.cp}"
        f"{f' ep={s.ep}' if s.ep > 1 else ''}{f' etp={s.etp}' if s.etp is not None else ''}"
        f"{f' vpp={s.vpp}' if s.vpp > 1 else ''} zero={s.zero}"
        f"{' sp' if s.sequence_parallel else ''}, micro-batch {p.training.micro_batch}, "
        f"recompute {p.training.recompute}, engine {p.engine.name}"
    )
    lines = [head, "", f"memory per device (stage {mem.stage}): {'fits' if mem.fits else 'DOES NOT FIT'}"]
    for name in ("weights", "gradients", "optimizer", "activations", "temporary", "reserved"):
        lines.append(f"  {name:<12}{_gib(getattr(mem, name))}")
    lines += [
        f"  {'total':<12}{_gib(mem.total)} of {_gib(mem.capacity).strip()} "
        f"(headroom {_gib(mem.headroom).strip()}; {_in_flight(mem.in_flight_micro_batches)} in flight)",
        "",
        f"step time {t.step_time_s:.3f} s ({count(t.micro_batches, 'micro-batch', 'micro-batches')} per pipeline)",
    ]
    parts = (
        "compute_s",
        "exposed_tp_s",
        "exposed_pp_s",
        "exposed_dp_s",
        "exposed_cp_s",
        "exposed_ep_s",
        "bubble_s",
        "optimizer_s",
    )
    for name in parts:
        value = getattr(t, name)
        lines.append(f"  {name.removesuffix('_s'):<12}{value:9.3f} s  {100 * value / t.step_time_s:5.1f}%")
    lines += [
        "",
        f"{of_peak('MFU', p.mfu)} (causal; {100 * p.mfu_full_s2:.1f}% counting the full s², as Megatron-LM"
        f" and PaLM do)  {of_peak('HFU', p.hfu)}  {p.tokens_per_s:,.0f} tokens/s "
        f"({p.tokens_per_s / p.gpus:,.0f} per GPU)",
    ]
    return "\n".join(lines)


def render_plan(result: Plan) -> str:
    """Terminal text for a plan."""
    lines = [
        f"{result.explored} settings sized, {result.fitting} splits fit with {100 * result.headroom:.0f}% "
        f"memory headroom{f' and are expressible in {result.target}' if result.target else ''}; fastest first:",
        "",
    ]
    for r in result.ranked:
        p, s = r.prediction, r.prediction.split
        lines.append(
            f"#{r.rank} tp={s.tp} pp={s.pp} dp={s.dp} cp={s.cp}{f' ep={s.ep}' if s.ep > 1 else ''}"
            f"{f' etp={s.etp}' if s.etp is not None else ''} "
            f"vpp={s.vpp} zero={s.zero} mb={p.training.micro_batch} recompute={p.training.recompute}: "
            f"{of_peak('MFU', p.mfu)}, {p.step_time_s:.3f} s/step, {p.tokens_per_s:,.0f} tokens/s"
        )
        lines.append(f"    {r.reason}")
        if r.warning:
            lines.append(f"    warning: {r.warning}")
    return "\n".join(lines)


def _calibration_line(profile: Profile | None) -> str:
    return f"{profile.describe()}\n" if profile is not None else ""


def prediction_text(p: Prediction, profile: Profile | None) -> str:
    """What `predict` prints: the profile used, the prediction, and the published-ceiling warning."""
    warning = prediction_warnings(p)
    return _calibration_line(profile) + render_prediction(p) + (f"\nwarning: {warning}" if warning else "")


def plan_text(result: Plan, profile: Profile | None) -> str:
    """What `plan` prints: the profile used and the ranked splits."""
    return _calibration_line(profile) + render_plan(result)


def calibration_text(profile: Profile, path: object) -> str:
    """What `calibrate` prints: the profile, its notes, and where it was written."""
    return "\n".join([profile.describe(), *(f"  {note}" for note in profile.notes), f"wrote {path}"])


def _dump(data: dict[str, Any]) -> str:
    return orjson.dumps(data, option=orjson.OPT_INDENT_2).decode()


def prediction_json(p: Prediction, profile: Profile | None) -> str:
    """`predict --format json`: the prediction, the profile used and the published MFU ceiling."""
    data = p.to_dict()
    if profile is not None:
        data["calibration"] = profile.to_dict()
    ceiling = mfu_ceiling(p)
    if ceiling is not None:
        data["published_mfu_ceiling"] = {
            "mfu": ceiling.mfu,
            "mfu_causal": ceiling.mfu_causal,
            "size_class": ceiling.size_class,
            "run": ceiling.run,
            "source": ceiling.source,
        }
    warning = prediction_warnings(p)
    if warning or ceiling is not None:
        data["warning"] = warning
    return _dump(data)


def plan_json(result: Plan, profile: Profile | None) -> str:
    """`plan --format json`: the plan and the profile used."""
    data = result.to_dict()
    if profile is not None:
        data["calibration"] = profile.to_dict()
    return _dump(data)
