"""When a running workload's volumes are pushed (pure): the interval, its bounds, the decision.

A live push sends what a running notebook or job wrote to its writable volumes (its
workspace, its rw/rwd volumes) without stopping it, so that a killed container or a lost node
loses at most one interval of work. What a live push takes of each file is the sync engine's
rule (:mod:`gpulab.datasync.live`: settled files only, never a file that changes while it is
read, no deletion); this module says when one runs:

- every ``interval`` seconds (0: never) while the workload runs: the job's own
  ``sync_interval``, else its flavor's, else the site's ``sync_interval``; each is 0 or at
  least the site's floor (``sync_interval_floor``, 60 s by default: a user cannot make the
  platform push their volumes every second) and at most :data:`MAX_INTERVAL_S`;
- on demand (the owner's "push now"), at once, whatever the interval;
- never two at once for one workload, and never once its stop has begun: the stop's own
  push runs last (a live push still running is waited for).
"""

from __future__ import annotations

from .bounds import shown
from .durations import DurationError, format_duration, parse_duration
from .errors import FieldError

#: the longest interval between two live pushes (a day)
MAX_INTERVAL_S = 86400.0
#: the shortest, unless the site says otherwise (``sync_interval_floor``)
DEFAULT_FLOOR_S = 60.0
#: seconds after which a mark of a live push asked or running no longer counts: one left by
#: a process that died during it (a push takes at most the helper's 10 minutes)
STALE_S = 900.0


def check_interval(value: object, field: str, floor: float) -> float:
    """A live push interval in seconds (a number, or a duration such as "15m"): 0 (off), or
    from ``floor`` to :data:`MAX_INTERVAL_S`. FieldError naming ``field`` otherwise."""
    if isinstance(value, str) and len(value) > 32:
        raise FieldError(field, f"{field} is too long: a number of seconds or a duration")
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if (number and value == 0) or (isinstance(value, str) and value.strip() in ("0", "0s")):
        return 0.0
    try:
        seconds = parse_duration(value, field)  # type: ignore[arg-type]
    except DurationError as e:
        raise FieldError(field, f"{e} (0 turns the live push off)") from None
    if seconds < floor:
        raise FieldError(
            field,
            f"{field} must be 0 (off) or at least {format_duration(floor)} (the site's floor, "
            f"so that the store is not pushed to too often), got {shown(value)}",
        )
    if seconds > MAX_INTERVAL_S:
        raise FieldError(
            field, f"{field} must be at most {format_duration(MAX_INTERVAL_S)}, got {shown(value)}"
        )
    return float(seconds)


def interval_for(own: float | None, flavor: float | None, site: float) -> float:
    """The interval of one workload: its own, else its flavor's, else the site's (0: off)."""
    for value in (own, flavor):
        if value is not None:
            return value
    return site


def push_due(
    now: float,
    interval: float,
    running_since: float,
    last_started: float | None,
    in_flight: bool,
    requested: bool,
) -> str | None:
    """Whether a live push starts now, and why ("request" or "interval"), else None.

    ``running_since`` and ``last_started`` (the last live push's start; None: none yet) are
    on the clock of ``now``. The first periodic push comes one interval after the start."""
    if in_flight:
        return None
    if requested:
        return "request"
    if interval <= 0:
        return None
    since = running_since if last_started is None else max(last_started, running_since)
    return "interval" if now - since >= interval else None


def push_busy(
    now: float,
    requested_at: float | None,
    running: bool,
    started_at: float | None,
    stale_s: float = STALE_S,
) -> bool:
    """A live push is asked (``requested_at``) or runs (``running`` since ``started_at``), as
    a workload's record says: an owner's "push now" waits for it (one at a time). A mark
    older than ``stale_s`` seconds does not count."""
    if requested_at is not None and now - requested_at < stale_s:
        return True
    return running and started_at is not None and now - started_at < stale_s


def iso_seconds(iso: str | None) -> float | None:
    """The epoch seconds of an API timestamp ("2026-11-27T09:00:00Z"); None for none or one
    that cannot be read."""
    from datetime import datetime

    try:
        return datetime.fromisoformat(str(iso).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


#: live-push events a record's history keeps: the most recent ones (a workload pushed every
#: minute for a year would otherwise carry half a million of them into every listing)
MAX_LIVE_PUSH_EVENTS = 20
LIVE_PUSH_REASONS = frozenset({"LIVE_PUSH", "LIVE_PUSH_FAILED"})


def trim_live_pushes(events: list) -> None:
    """Drop the oldest live-push events of a history (a list of objects with a ``reason``,
    oldest first) beyond :data:`MAX_LIVE_PUSH_EVENTS`, in place; the record's own
    ``live_push`` keeps the latest outcome."""
    pushes = [e for e in events if e.reason in LIVE_PUSH_REASONS]
    for old in pushes[: max(0, len(pushes) - MAX_LIVE_PUSH_EVENTS)]:
        events.remove(old)


def ended_push(previous: dict | None, at: str, ok: bool, message: str, files: int, nbytes: int):
    """A record's ``live_push`` once a push ended: its outcome over what it held before (the
    trigger, when it began)."""
    return {
        **dict(previous or {}),
        "running": False,
        "at": at,
        "ok": ok,
        "message": message,
        "files": files,
        "bytes": nbytes,
    }
