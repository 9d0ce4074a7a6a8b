"""How long a process's event loop is held: the gpulab service's (and, on request, the hub's).

And one remedy: :func:`settle_heap`, the start-up's objects out of the garbage collector's
walks.

Two measures, both for ``GpulabSettings.event_loop_watch`` and the metrics:

- the lag (:func:`lag_loop`, always on in the service): a task that sleeps :data:`PERIOD` and
  records how late it woke, the time the loop was busy with other callbacks when it was due
  (``gpulab_event_loop_lag_seconds``). Ten wake-ups a second, each a few microseconds.
- the slow callbacks (:class:`LoopWatch`, only when ``event_loop_watch`` is above 0): every
  callback the loop runs is timed (``asyncio.Handle._run``, which every loop calls for its
  ready callbacks, timers and I/O callbacks alike), and each that held the loop longer than
  the threshold is logged at WARNING with its duration (and how much of it on the CPU, how
  often it waited, how often the machine's other work preempted it) and its name: for a
  task's step, the coroutine and the lines it ran between (where it resumed, where it stopped
  again), else the callback itself. asyncio's debug mode logs the same
  (``loop.slow_callback_duration``), but also records a stack for every callback scheduled,
  which costs more than the work measured; this costs two clock readings and a getrusage per
  callback, and for a task's step a walk of its coroutine chain (at most 32 frames) before
  it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import resource
import time
from collections.abc import Callable
from types import CodeType

from prometheus_client import Counter, Histogram

#: seconds between the lag's samples
PERIOD = 0.1


@functools.cache
def metrics() -> tuple[Histogram, Counter]:
    """The service's loop metrics (registered on first use: the hub, which imports this
    module for its own watch, shows none of them)."""
    lag = Histogram(
        "gpulab_event_loop_lag_seconds",
        "How late the service's event loop ran a timer that was due (sampled every 0.1 s): "
        "the time other callbacks held the loop",
        buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
    )
    slow = Counter(
        "gpulab_event_loop_slow_callbacks",
        "Callbacks that held the service's event loop longer than event_loop_watch (counted "
        "only while that setting is above 0)",
    )
    return lag, slow


log = logging.getLogger("gpulab.loop")


async def lag_loop(
    period: float = PERIOD,
    observe: Callable[[float], None] | None = None,
    late: Callable[[float], None] | None = None,
) -> None:
    """Forever: sleep ``period``, ``observe`` how late the wake-up was (seconds; default the
    lag histogram), and call ``late`` with it as well (the watch's report of a lag over its
    threshold)."""
    observe = observe or metrics()[0].observe
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + period
        await asyncio.sleep(period)
        lag = max(0.0, loop.time() - due)
        observe(lag)
        if late is not None:
            late(lag)


#: this thread's CPU time and context switches (Linux: RUSAGE_THREAD; elsewhere the process's)
_usage = functools.partial(
    resource.getrusage, getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)
)

#: the event loop's own plumbing, named only when nothing else is
_PLUMBING = ("/asyncio/", "/tornado/")


def _innermost(coro) -> tuple[CodeType, int] | None:
    """(code, line) where a suspended coroutine chain waits: its innermost frame outside
    asyncio and tornado (the line of the caller's code that awaited), else its innermost."""
    where = ours = None
    seen = 0
    while coro is not None and seen < 32:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            break
        where = (frame.f_code, frame.f_lineno)
        if not any(m in frame.f_code.co_filename for m in _PLUMBING):
            ours = where
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
        seen += 1
    return ours or where


def _place(where: tuple[CodeType, int] | None) -> str:
    if where is None:
        return "?"
    code, line = where
    path = code.co_filename
    for marker in ("/site-packages/", "/src/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{code.co_qualname} ({path}:{line})"


def _task_of(handle: asyncio.Handle) -> asyncio.Task | None:
    owner = getattr(handle._callback, "__self__", None)
    return owner if isinstance(owner, asyncio.Task) else None


def _callable_name(fn) -> str:
    """A callable's qualified name and where it is defined, never its arguments (a
    ``functools.partial``'s or a handle's arguments may be a token, a URL with one, a line of
    a workload's output: nothing of them reaches a log)."""
    seen = 0
    while isinstance(fn, functools.partial) and seen < 8:
        fn, seen = fn.func, seen + 1
    fn = getattr(fn, "__func__", fn)  # a bound method: its function
    code = getattr(fn, "__code__", None)
    if code is not None:
        return _place((code, code.co_firstlineno))
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{getattr(fn, '__module__', '') or ''}.{name}".lstrip(".")


def describe(handle: asyncio.Handle, before: tuple[CodeType, int] | None) -> str:
    """A callback's name for the log: a task's coroutine and the lines its step ran between,
    else the callback's function (:func:`_callable_name`: never its arguments)."""
    task = _task_of(handle)
    if task is not None:
        coro = task.get_coro()
        name = getattr(coro, "__qualname__", None) or type(coro).__qualname__
        after = _place(_innermost(coro)) if not task.done() else "its end"
        return f"task {name}: from {_place(before)} to {after}"
    return _callable_name(handle._callback)


class LoopWatch:
    """Times every callback of every event loop in this process (one per process: the
    service's, or the hub's) while installed; those over ``threshold`` seconds are logged and
    counted, and the worst kept (:attr:`worst`)."""

    installed: LoopWatch | None = None

    def __init__(self, threshold: float, logger: logging.Logger = log, count=None):
        self.threshold = threshold
        self.log = logger
        #: what counts a slow callback (the service's counter; the hub's watch: none)
        self._counter = count
        self.worst: tuple[float, str] = (0.0, "")
        self.count = 0
        self._original = None
        self._gc_started = (0.0, 0.0)

    def install(self) -> LoopWatch:
        if LoopWatch.installed is not None:
            LoopWatch.installed.uninstall()
        original = asyncio.Handle._run
        watch = self

        def _run(handle: asyncio.Handle) -> None:
            # the measuring never raises: outside Handle._run's own handling, an error here
            # would end the loop, and a setting that measures would stop the service
            try:
                task = _task_of(handle)
                before = _innermost(task.get_coro()) if task is not None else None
                u0 = _usage()
            except Exception:  # noqa: BLE001
                before = u0 = None
            t0 = time.perf_counter()
            try:
                original(handle)
            finally:
                took = time.perf_counter() - t0
                if took > watch.threshold and u0 is not None:
                    try:
                        u1 = _usage()
                        cpu = u1.ru_utime + u1.ru_stime - u0.ru_utime - u0.ru_stime
                        waits = u1.ru_nvcsw - u0.ru_nvcsw
                        preempted = u1.ru_nivcsw - u0.ru_nivcsw
                        watch.slow(took, describe(handle, before), cpu, waits, preempted)
                    except Exception:  # noqa: BLE001
                        pass

        self._original = original
        asyncio.Handle._run = _run  # TimerHandle inherits it
        gc.callbacks.append(self._collected)
        LoopWatch.installed = self
        return self

    def uninstall(self) -> None:
        if self._original is not None:
            asyncio.Handle._run = self._original
            self._original = None
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._collected)
        if LoopWatch.installed is self:
            LoopWatch.installed = None

    def slow(
        self, took: float, name: str, cpu: float = 0.0, waits: int = 0, preempted: int = 0
    ) -> None:
        """A callback that held the loop ``took`` seconds: ``cpu`` of them on the CPU, the
        rest waiting (``waits`` times: for I/O, a lock, the GIL) or ready but not running
        (``preempted`` times: the machine's other work)."""
        self.count += 1
        if self._counter is not None:
            self._counter.inc()
        if took > self.worst[0]:
            self.worst = (took, name)
        self.log.warning(
            "event loop held %.1f ms (CPU %.1f ms, %d waits, %d preempted) by %s",
            took * 1000,
            cpu * 1000,
            waits,
            preempted,
            name,
        )

    def _collected(self, phase: str, info: dict) -> None:
        """gc's callback: a collection that took longer than the threshold (it holds whatever
        thread ran into it, the loop's among them) is logged with its generation."""
        if phase == "start":
            self._gc_started = (time.perf_counter(), time.thread_time())
            return
        took = time.perf_counter() - self._gc_started[0]
        if took > self.threshold:
            self.log.warning(
                "garbage collection of generation %d took %.1f ms (CPU %.1f ms, %d objects "
                "collected)",
                info.get("generation", -1),
                took * 1000,
                (time.thread_time() - self._gc_started[1]) * 1000,
                info.get("collected", 0),
            )

    def late(self, lag: float) -> None:
        """A lag sample (lag_loop's): logged when over the threshold."""
        if lag > self.threshold:
            self.log.warning("event loop late by %.1f ms (lag sample)", lag * 1000)


def settle_heap() -> int:
    """Collect, then move every object now tracked by the garbage collector into its permanent
    generation (``gc.freeze``), which its collections never walk; how many were moved. Called
    once start-up made what lives as long as the process: under load, the service's full
    collections walked all of it (a hundred thousand objects and more: 90 to 120 ms of CPU,
    every second or so, bench/bench_loop.py), holding the GIL, and so the event loop, for as
    long."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def watch_hub_at_start() -> None:
    """Called from the hub's configuration file: once the hub has read all of it, time its
    event loop's callbacks when ``GpulabSettings.event_loop_watch`` is above 0 (logged to the
    hub's log, logger ``gpulab.hub_loop``). Outside the hub's process, nothing (the service
    starts its own)."""
    from .hub_process import starting_hub
    from .settings import GpulabSettings

    starting = starting_hub()
    if starting is None:
        return
    hub, loop = starting

    def start() -> None:
        threshold = GpulabSettings(config=hub.config, check=False).event_loop_watch
        if threshold > 0:
            LoopWatch(threshold, logging.getLogger("gpulab.hub_loop")).install()

    loop.call_soon(start)
