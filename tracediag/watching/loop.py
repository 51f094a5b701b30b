"""`watch(location) -> Iterator[Window]`: follow a job's trace files and analyse each profiler window.

Each poll lists the location, reads the files that have settled (`watching.files`), files them into
windows across ranks (`watching.windows`), and for each window due analyses it with the one reduce of
`tracediag analyze` (`reduce.reduce` over the ranks' summaries), keeps a `Window` and drops the
tables. What changed since the earlier windows comes from `watching.regress`.

No global state and no signal handler: a service may run `watch` in a thread and end it with
`stop` (a `threading.Event`). Files that cannot be used are reported through `on_notice` (one line
each, with a reason) and never stop the watch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tracediag.api_types import checked
from tracediag.derive.summary import concat
from tracediag.detect import Thresholds
from tracediag.errors import RankError, TracediagError, one_line, shown
from tracediag.model.predict import Prediction
from tracediag.observed_vs_predicted import check
from tracediag.reduce import reduce
from tracediag.run import RunMeta, rank_resolver
from tracediag.watching.files import Listed, Settling, Unready, gone, list_files, parts, read_trace
from tracediag.watching.regress import STRAGGLER_CAUSES, Detector, Observation
from tracediag.watching.result import Change, Window, caused_shares, per_rank, step_times, window_key
from tracediag.watching.state import State, load_state, save_state
from tracediag.watching.windows import Grouper, Pending

if TYPE_CHECKING:
    from tracediag.analysis import Analysis
    from tracediag.ingest.trace import FileTrace


@dataclass(frozen=True, slots=True)
class Notice:
    """Something the watcher could not use, in one line."""

    reason: str
    """"truncated" (a file that stays cut short), "unreadable", "not_a_trace", "late" (a file of a
    window already reported), "duplicate", "location_gone", "listing" (the location could not be listed),
    "rank_key" (a `--rank FILE=N` whose FILE no watched file matched)."""
    message: str


class Stop(Protocol):
    """What stops a watch: a `threading.Event` (or anything with its two methods)."""

    def is_set(self) -> bool:
        """Whether the watch should stop."""

    def wait(self, timeout: float | None = None) -> bool:
        """Wait up to `timeout` seconds for the stop; whether it came."""


class Watcher:
    """One watched location: its files, its open windows, its history. `watch` drives it."""

    def __init__(
        self,
        location: str,
        *,
        window_timeout: float = 300.0,
        state: State | None = None,
        state_path: str | Path | None = None,
        detector: Detector | None = None,
        step_regex: str | None = None,
        thresholds: Thresholds | None = None,
        rank_from_filename: str | None = None,
        rank_map: Mapping[str, int] | None = None,
        storage_options: dict[str, Any] | None = None,
        on_notice: Callable[[Notice], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        prediction: Prediction | None = None,
    ) -> None:
        self.location = str(location)
        self.window_timeout = window_timeout
        self.state = state or State(self.location)
        self.state_path = state_path
        self.detector = detector or Detector()
        if self.state.detector:
            self.detector.restore(self.state.detector)
        self.step_regex, self.thresholds, self.storage_options = step_regex, thresholds, storage_options
        self.resolve = rank_resolver(rank_from_filename=rank_from_filename, rank_map=dict(rank_map or {}))
        self._rank_keys = dict(rank_map or {})
        """`--rank FILE=N` keys no listed file has matched yet (by path or base name): with `once` refused at
        the start (`refuse_unmatched_rank_keys`); else each is named once the watch flushes (files may land
        later, so not before)."""
        self.on_notice = on_notice or (lambda n: None)
        self.clock = clock
        self.prediction = prediction
        self.grouper = Grouper(window_timeout, list(self.state.done), self.state.known_ranks)
        self.settling = Settling()
        self._held: set[str] = set()
        """Files read into a window not yet reported."""
        self._failed: dict[str, tuple[int, int, float, Unready, bool]] = {}
        """Settled files that could not be read: (size, mtime, since, why, warned)."""
        self._gone = False
        self._listing_error = ""
        self.unsettled = 0
        """Files of the last poll still changing."""
        self.read_last = 0
        """Files read into windows by the last poll."""

    def notice(self, reason: str, message: str) -> None:
        """Report a file left out (`reason`) to the caller's `on_notice`."""
        self.on_notice(Notice(reason, message))

    def poll(self, *, flush: bool = False) -> list[Pending]:
        """List, read what settled, group; the windows due now (all of them with `flush`)."""
        now = self.clock()
        self.read_last = 0
        if gone(self.location):
            if not self._gone:
                self.notice("location_gone", f"{shown(self.location)}: no longer exists; watching for it to return")
            self._gone = True
            return self.grouper.due(now, flush=flush)
        self._gone = False
        try:
            listed = list_files(self.location, self.storage_options)
            self._listing_error = ""
        except (TracediagError, OSError) as e:
            text = one_line(str(e))
            if text != self._listing_error:
                self.notice("listing", text)
            self._listing_error = text
            return self.grouper.due(now, flush=flush)
        if self._rank_keys:
            self._match_rank_keys(listed, flush=flush)
        fresh = [f for f in listed if f.path not in self.state.consumed and f.path not in self._held]
        self.unsettled = self.settling.unsettled(fresh)
        settled = self.settling.settled(fresh)
        read: list[tuple[Listed, FileTrace]] = []
        for f in settled:
            failed = self._failed.get(f.path)
            if failed is not None and failed[:2] == (f.size, f.mtime_ns):
                size, mtime, since, why, warned = failed
                if not warned and (flush or now - since >= self.window_timeout):
                    self.notice("truncated", f"{why.why}; it stayed so for {now - since:.0f} s: left out")
                    self._failed[f.path] = (size, mtime, since, why, True)
                continue
            trace = read_trace(f.path, resolve=self.resolve, storage_options=self.storage_options)
            if isinstance(trace, Unready):
                warned = not trace.cut_short
                if warned:
                    self.notice("not_a_trace" if trace.not_a_trace else "unreadable", trace.why)
                self._failed[f.path] = (f.size, f.mtime_ns, now, trace, warned)
                continue
            read.append((f, trace))
        # (the events of `read` are dropped when this poll returns: only the summaries stay)
        summarised = parts([t for _, t in read], step_regex=self.step_regex)
        for (f, _), part in zip(read, summarised):
            if isinstance(part, Unready):
                self.notice("unreadable", part.why)
                self._failed[part.path] = (f.size, f.mtime_ns, now, part, True)
                continue
            self._failed.pop(part.path, None)
            self.read_last += 1
            problem = self.grouper.add(part, now)
            if problem is not None:
                self.notice(*problem)
                self.state.consumed.add(part.path)
            else:
                self._held.add(part.path)
        return self.grouper.due(now, flush=flush)

    def _match_rank_keys(self, listed: list, *, flush: bool) -> None:
        """Forget the `--rank` keys a listed file matches; with `flush`, name each left (once)."""
        names = {f.path for f in listed} | {f.path.rstrip("/").rsplit("/", 1)[-1] for f in listed}
        for key in [k for k in self._rank_keys if k in names]:
            del self._rank_keys[key]
        if flush:
            for key, rank in self._rank_keys.items():
                self.notice("rank_key", f"--rank {shown(key)}={rank}: no watched file has this path or base name")
            self._rank_keys.clear()

    def refuse_unmatched_rank_keys(self) -> None:
        """With `once` (the files are there now): a `RankError` for a `--rank FILE=N` no listed file has as
        its path or base name, at the start, as `load` refuses it; not a warning after the windows were
        analysed with the file's own rank. A listing that fails is left to the first poll to say."""
        try:
            listed = list_files(self.location, self.storage_options)
        except (TracediagError, OSError):
            return
        self._match_rank_keys(listed, flush=False)
        if self._rank_keys:
            key, rank = next(iter(self._rank_keys.items()))
            msg = f"--rank {shown(key)}={rank}: no file of {shown(self.location)} has this path or base name"
            raise RankError(msg)

    def analyse(self, w: Pending) -> Window:
        """The `Window` of a due window (its parts' tables dropped afterwards by the caller)."""
        index = self.state.next_index
        ranks = tuple(sorted(w.parts))
        chosen = [w.parts[r] for r in ranks]
        missing = self.grouper.missing(w)
        base = {
            "index": index,
            "key": window_key(w.steps, w.lo_ns),
            "ranks": ranks,
            "missing_ranks": missing,
            "start_ns": w.lo_ns,
            "end_ns": w.hi_ns,
            "files": tuple(p.path for p in chosen),
        }
        started = time.perf_counter()
        try:
            summary = concat([p.summary for p in chosen])
            analysis = reduce(
                summary,
                RunMeta(files=tuple(p.meta for p in chosen)),
                step_regex=self.step_regex,
                thresholds=self.thresholds,
            )
        except (TracediagError, ValueError) as e:
            window = Window(steps=(), error=one_line(str(e)), **base)
            window = _with_changes(window, self.detector.observe(Observation(index, (), complete=False)))
            return window
        window = summarize(analysis, base, time.perf_counter() - started)
        if self.prediction is not None:
            window = _with_mfu(window, analysis, self.prediction)
        return _with_changes(window, self.detector.observe(observation(window, analysis, complete=not missing)))

    def commit(self, w: Pending, window: Window) -> None:
        """Mark `window` reported (and save the state when a state file is given)."""
        self.grouper.handed_out(w, window.index, window.ranks)
        paths = set(window.files)
        self._held -= paths
        self.state.consumed |= paths
        self.state.next_index = window.index + 1
        self.state.done = list(self.grouper.done)
        self.state.known_ranks = set(self.grouper.known_ranks)
        self.state.detector = self.detector.to_dict()
        if self.state_path is not None:
            save_state(self.state_path, self.state)

    @property
    def quiet(self) -> bool:
        """The last poll found nothing still being written and read nothing new."""
        return self.unsettled == 0 and self.read_last == 0


def _with_mfu(window: Window, analysis: Analysis, prediction: Prediction) -> Window:
    """`window` with its observed MFU against `prediction` (`observed_vs_predicted.check`, as `analyze
    --plan`)."""
    mfu = next(c for c in check(analysis, prediction).components if c.name == "mfu")
    return replace(window, mfu=mfu.observed, mfu_predicted=mfu.predicted, mfu_note=mfu.note)


def summarize(analysis: Analysis, base: dict[str, Any], seconds: float) -> Window:
    """The small record of one window's analysis."""
    step_s, comm, idle = per_rank(analysis)
    times = step_times(analysis)
    waited, shares = caused_shares(analysis)
    return Window(
        steps=tuple(analysis.step_numbers),
        step_seconds=_median(times),
        step_seconds_by_rank=step_s,
        exposed_comm_ratio_by_rank=comm,
        idle_ratio_by_rank=idle,
        findings=analysis.findings,
        waited_for=waited,
        caused_wait_share_by_rank=shares,
        warnings=analysis.warnings,
        analysis_seconds=seconds,
        **base,
    )


def observation(window: Window, analysis: Analysis, *, complete: bool) -> Observation:
    """What the change detector reads of a window (see `watching.regress`)."""
    named: dict[int, tuple[float, float, str]] = {}
    shares = window.caused_wait_share_by_rank
    for f in analysis.findings:
        if f.cause.value in STRAGGLER_CAUSES and f.measurable:
            for r in f.ranks:
                conf = max(f.confidence, named.get(r, (0.0, 0.0, ""))[0])
                named[r] = (conf, shares.get(r, 0.0), named.get(r, (0, 0, f.cause.value))[2])
    late = analysis.lateness
    for r in window.waited_for:
        conf = max(1 - (late.chance if late else 1.0), named.get(r, (0.0, 0.0, ""))[0])
        named[r] = (conf, shares.get(r, 0.0), named.get(r, (0, 0, "waited_for"))[2])
    causes = frozenset(
        f.cause.value for f in analysis.findings if f.measurable and f.cause.value not in STRAGGLER_CAUSES | {"healthy"}
    )
    return Observation(window.index, tuple(step_times(analysis)), named, causes, complete)


def _with_changes(window: Window, changes: tuple[Change, ...]) -> Window:
    return replace(window, changes=changes)


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


@checked
def watch(
    location: str | Path,
    *,
    poll_seconds: float = 2.0,
    window_timeout: float = 300.0,
    once: bool = False,
    max_windows: int | None = None,
    state: str | Path | None = None,
    baseline_windows: int = 2,
    slower: float = 0.10,
    min_confidence: float = 0.9,
    step_regex: str | None = None,
    thresholds: Thresholds | None = None,
    rank_from_filename: str | None = None,
    rank_map: Mapping[str, int] | None = None,
    storage_options: dict[str, Any] | None = None,
    on_notice: Callable[[Notice], None] | None = None,
    stop: Stop | None = None,
    prediction: Prediction | None = None,
) -> Iterator[Window]:
    """Follow the trace files of a running job at `location` and yield one `Window` per profiler window.

    Parameters
    ----------
    location
        A directory (searched recursively), a glob, or an object-store URL (``s3://bucket/run/``), as
        `tracediag.load` takes them; `storage_options` apply to a URL.
    poll_seconds
        Time between two listings; a file is read once two listings in a row saw the same size.
    window_timeout
        Seconds after a window's first file at which it is analysed with the ranks it has (the
        missing ones named in `Window.missing_ranks`); a file that stays cut short this long is
        left out with a notice.
    once
        Analyse what is there now and end: every window, complete or not, once no file is still
        changing.
    max_windows
        End after this many windows.
    state
        A state file: windows reported are not reported again, a restarted watch resumes
        (`watching.state`). A window counts as reported when the next one is asked for.
    baseline_windows, slower, min_confidence
        The change-point test (`watching.regress`): the job's first `baseline_windows` complete windows
        are its baseline; a window `slower` (0.10 = 10%) than it at `min_confidence` is a step-time
        change.
    on_notice
        Called with each `Notice` (a file left out, the location gone); the watch goes on.
    stop
        A `threading.Event`: the watch ends at the next poll once it is set.
    prediction
        The job's `Prediction` (`tracediag.predict`, or a plan saved by `tracediag predict -o`): each
        window then carries its observed MFU against it (`Window.mfu`), as `analyze --plan` computes it.

    Raises `TypeError` (an argument of the wrong type, `api_types.checked`) or `TracediagError` (a bad
    value, a damaged state file) at the call, before the first window; nothing after.
    """
    if poll_seconds <= 0 or window_timeout < 0:
        msg = "poll_seconds must be above 0 and window_timeout 0 or more"
        raise TracediagError(msg)
    location = str(location)
    saved = load_state(state, location) if state is not None else None
    watcher = Watcher(
        location,
        window_timeout=window_timeout,
        state=saved,
        state_path=state,
        detector=Detector(baseline_windows=baseline_windows, slower=slower, min_confidence=min_confidence),
        step_regex=step_regex,
        thresholds=thresholds,
        rank_from_filename=rank_from_filename,
        rank_map=rank_map,
        storage_options=storage_options,
        on_notice=on_notice,
        prediction=prediction,
    )
    if once:
        watcher.refuse_unmatched_rank_keys()
    return _windows(watcher, poll_seconds=poll_seconds, once=once, max_windows=max_windows, stop=stop)


def _windows(
    watcher: Watcher, *, poll_seconds: float, once: bool, max_windows: int | None, stop: Stop | None
) -> Iterator[Window]:
    """`watch`'s windows, as the watcher finds them; `watch` checked its arguments when it was called."""
    yielded = 0
    while True:
        if stop is not None and stop.is_set():
            return
        due = watcher.poll()
        if once and not due and watcher.quiet:
            due = watcher.poll(flush=True)
        for w in due:
            window = watcher.analyse(w)
            w.parts.clear()  # the tables of the window: no longer needed
            yield window
            watcher.commit(w, window)
            yielded += 1
            if max_windows is not None and yielded >= max_windows:
                return
        if once and watcher.quiet and not watcher.grouper.pending:
            return
        if stop is not None:
            if stop.wait(poll_seconds):
                return
        else:
            time.sleep(poll_seconds)
