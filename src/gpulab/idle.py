"""Idle notebooks: which running notebooks had no activity for their idle time (pure, no I/O).

A notebook's idle time comes from its flavor (``idle_timeout`` seconds; 0 = never), else from
the default for its kind (``GpulabSettings.gpu_idle_timeout`` for notebooks with GPUs,
``cpu_idle_timeout`` for the others); it is decided at the spawn and kept in the notebook's
recorded options, so the notebook keeps what its form promised. Users cannot set it.

Activity is what the hub records for the server (``last_activity``): the notebook server's own
reports (kernels, terminals, authenticated API use, and a busy kernel through the images'
``gpulab_activity`` extension), its start, and nothing else (gpulab's hub turns off the proxy's
traffic polling, which anyone could feed with requests the notebook refuses).

A reported time in the future cannot keep a notebook forever: an activity time counts from the
moment it was first seen at the latest (``seen``), so a value that never changes ages like any
other. :func:`idle_notebooks` is the decision; :class:`gpulab.service.tasks.idle.IdleStopper`
acts on it.

GPUs left unused (a policy the admin turns on: ``GpulabSettings.gpu_unused_timeout``, or a
flavor's ``gpu_unused_timeout``): a notebook holding GPUs that none of them has used for that
long is stopped the same way, even while its kernel is open and reports activity. A GPU is in
use from :data:`GPU_BUSY_PERCENT` of NVML's utilization (any kernel that ran during its sample
period), the same threshold as a job's hang detection. A notebook whose GPUs cannot be read
(no NVML, a MIG device, a Swarm node) is never stopped for it. :func:`unused_gpu_notebooks`
is that decision; its clock starts at the first look that found the GPUs unused.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from .durations import format_duration
from .resources import Flavor, Resources

#: the reason recorded in a notebook's history when it is stopped for being idle
REASON = "IDLE"
#: a GPU at this utilization (percent) or more is in use (here and in jobs' hang detection)
GPU_BUSY_PERCENT = 1

#: (user, server, the activity time as reported) -> when it was first seen
Seen = Mapping[tuple[str, str, str], datetime]


def idle_timeout_for(
    flavor: Flavor | None, resources: Resources, gpu_default: float, cpu_default: float
) -> float:
    """Seconds without activity after which a notebook is stopped (0: never).

    The flavor's own ``idle_timeout`` holds when the notebook asks for the flavor's GPUs;
    otherwise (no flavor, or more GPUs than a CPU flavor has) the default of its kind, so that
    adding GPUs to a flavor whose idle stop is off does not escape the GPUs' idle stop."""
    own = flavor.idle_timeout if flavor is not None else None
    if own is not None and resources.gpus == flavor.resources.gpus:
        return own
    return gpu_default if resources.gpus > 0 else cpu_default


def gpu_unused_timeout_for(flavor: Flavor | None, resources: Resources, default: float) -> float:
    """Seconds a notebook's GPUs may go unused before it is stopped (0: never; and always 0
    without GPUs): the flavor's own ``gpu_unused_timeout`` when the notebook asks for the
    flavor's GPUs, else the site's."""
    if resources.gpus <= 0:
        return 0.0
    own = flavor.gpu_unused_timeout if flavor is not None else None
    if own is not None and resources.gpus == flavor.resources.gpus:
        return own
    return default


def parse_time(value) -> datetime | None:
    """An ISO time as the hub or gpulab writes it (``...Z``, an offset, or naive UTC)."""
    if not value or not isinstance(value, str):
        return None
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


@dataclass(frozen=True)
class IdleStop:
    """Stop this notebook: it is idle. ``running_since`` is what the decision saw (the
    compare-and-set's expectation: a notebook started again since is another life)."""

    user: str
    server: str
    running_since: str
    idle_for: float
    idle_timeout: float

    #: "activity": no activity for its idle time; "gpu": its GPUs unused for their time
    kind: str = "activity"

    @property
    def message(self) -> str:
        if self.kind == "gpu":
            return (
                f"its GPUs unused for {format_duration(round(self.idle_for))} (its GPUs' "
                f"unused time: {format_duration(self.idle_timeout)}); stopped like a user "
                "stop, workspace pushed"
            )
        return (
            f"no activity for {format_duration(round(self.idle_for))} (its idle time: "
            f"{format_duration(self.idle_timeout)}); stopped like a user stop, workspace pushed"
        )


def last_activity(record: Mapping, server: Mapping | None) -> datetime | None:
    """The latest of the hub's recorded activity, the hub's start and gpulab's RUNNING time."""
    times = [parse_time(record.get("running_since"))]
    if server:
        times += [parse_time(server.get("last_activity")), parse_time(server.get("started"))]
    times = [t for t in times if t is not None]
    return max(times) if times else None


def idle_notebooks(
    records: list[Mapping],
    servers: Mapping[tuple[str, str], Mapping | None],
    now: datetime,
    seen: Seen,
) -> tuple[list[IdleStop], dict[tuple[str, str, str], datetime]]:
    """The notebooks to stop for being idle, and the new ``seen`` map.

    ``records``: gpulab's RUNNING notebooks ({user, server, running_since, options}, where
    options holds ``idle_timeout``); ``servers``: the hub's model of each one's server (None
    when the hub does not run it). A notebook whose server the hub does not show as ready, or
    shows starting or stopping, is left alone: a start or a stop is under way."""
    stops: list[IdleStop] = []
    new_seen: dict[tuple[str, str, str], datetime] = {}
    for nb in records:
        if nb.get("state", "RUNNING") != "RUNNING":
            continue
        user, name = nb["user"], nb["server"]
        timeout = _timeout(nb.get("options"))
        server = servers.get((user, name))
        if not timeout or not server or not server.get("ready") or server.get("pending"):
            continue
        last = last_activity(nb, server)
        if last is None:
            continue
        key = (user, name, last.isoformat())
        first = seen.get(key, now)
        new_seen[key] = first
        idle_for = (now - min(last, first)).total_seconds()
        if idle_for >= timeout:
            stops.append(IdleStop(user, name, nb.get("running_since") or "", idle_for, timeout))
    return stops, new_seen


def _timeout(options) -> float:
    """The recorded idle time; anything but a positive finite number means never."""
    return _seconds(options, "idle_timeout")


def _seconds(options, key: str) -> float:
    """A recorded time in seconds; anything but a positive finite number means never."""
    value = options.get(key) if isinstance(options, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    return float(value) if math.isfinite(value) and value > 0 else 0.0


#: (user, server, running_since) -> when its GPUs were first seen unused (since last in use)
Unused = Mapping[tuple[str, str, str], datetime]


def unused_gpu_notebooks(
    records: list[Mapping],
    busiest: Mapping[tuple[str, str], int | None],
    now: datetime,
    unused_since: Unused,
) -> tuple[list[IdleStop], dict[tuple[str, str, str], datetime]]:
    """The notebooks to stop because their GPUs went unused for their time, and the new
    ``unused_since`` map.

    ``records``: gpulab's RUNNING notebooks (options hold ``gpu_unused_timeout``);
    ``busiest``: (user, server) -> the highest utilization (percent) of its GPUs now, None
    (or absent) when it cannot be read. A reading in use, or none, clears the notebook's
    clock; a notebook stops once its GPUs read unused at every look for its whole time."""
    stops: list[IdleStop] = []
    new: dict[tuple[str, str, str], datetime] = {}
    for nb in records:
        if nb.get("state", "RUNNING") != "RUNNING":
            continue
        user, name = nb["user"], nb["server"]
        timeout = _seconds(nb.get("options"), "gpu_unused_timeout")
        percent = busiest.get((user, name))
        if not timeout or percent is None or percent >= GPU_BUSY_PERCENT:
            continue
        key = (user, name, nb.get("running_since") or "")
        since = new[key] = unused_since.get(key, now)
        unused_for = (now - since).total_seconds()
        if unused_for >= timeout:
            stops.append(
                IdleStop(user, name, nb.get("running_since") or "", unused_for, timeout, "gpu")
            )
    return stops, new
