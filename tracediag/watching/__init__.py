"""Following a running job's trace files: one analysed `Window` per profiler window (docs/watch.md).

`watch(location)` yields the windows (`watching.loop`); `Window` and `Change` are the records
(`watching.result`); the files, the grouping across ranks, the change-point tests and the restart
state each have their module (`files`, `windows`, `regress`, `state`).
"""

from tracediag.watching.loop import Notice, Watcher, watch
from tracediag.watching.result import Change, Window

__all__ = ["Change", "Notice", "Watcher", "Window", "watch"]
