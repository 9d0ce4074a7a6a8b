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

    @property
    def message(self) -> str:
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
    value = (options or {}).get("idle_timeout") if isinstance(options, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    return float(value) if math.isfinite(value) and value > 0 else 0.0
