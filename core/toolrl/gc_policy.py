"""The cyclic garbage collector in a rollout process, which holds thousands of trajectories at once.

CPython's collector pauses the event loop for each collection, and a full one walks every tracked
object alive: the modules, the engine and the routes built at start-up (about 200,000 objects with
OpenEnv's client imported, millions with a model library) and every open trajectory's. Those pauses
are what a step waits behind at 1024 concurrent sessions (docs/benchmarks.md, issue 60). So once a
process has finished start-up, :func:`after_startup` collects what start-up left, freezes what is
alive (``gc.freeze``: the permanent generation, which no later collection walks) and collects the
youngest generation every :data:`YOUNG_THRESHOLD` net allocations instead of CPython's 700: fewer
objects of the trajectories in flight live long enough to reach the older generations, whose
collections are the long pauses. What start-up built lives as long as the process; a frozen object
that dies is still freed by its reference count, and only a cycle among frozen objects would stay.
"""

from __future__ import annotations

import functools
import gc

# Net allocations between collections of the youngest generation (CPython's default: 700). Each
# young collection walks at most these (a few ms); measured in docs/benchmarks.md (issue 60).
YOUNG_THRESHOLD = 10_000


@functools.cache  # once per process: a process that builds rollouts again (a test run) freezes nothing more
def after_startup() -> None:
    """Collect, freeze what is alive and raise the youngest generation's threshold (see the module);
    a threshold set higher already, or 0 (no automatic collection), is kept. Call once a rollout
    process's parts are built, before its first step."""
    gc.collect()
    gc.freeze()
    young, middle, old = gc.get_threshold()
    if young:
        gc.set_threshold(max(young, YOUNG_THRESHOLD), middle, old)
