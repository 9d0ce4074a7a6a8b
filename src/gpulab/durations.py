"""Durations as users write them: ``90``, ``"90s"``, ``"30m"``, ``"2h"``, ``"7d"``, ``"1h30m"``.

Pure code. A number is a count of seconds; a string is either a number of seconds (``"90"``)
or one or more ``<number><unit>`` parts with units ``d``, ``h``, ``m``, ``s``, each at most once
and from the largest to the smallest (``"1d12h"``, ``"1h 30m"``, ``"1.5h"``). Zero, negative,
infinite and unparsable values are refused with a :class:`DurationError` naming the field.
"""

from __future__ import annotations

import math
import re

from .bounds import shown
from .errors import FieldError

__all__ = ["DurationError", "format_duration", "parse_duration"]

_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_NUMBER = r"\d+(?:\.\d+)?"
_PLAIN_RE = re.compile(rf"^{_NUMBER}$")
_PARTS_RE = re.compile(
    rf"^(?:(?P<d>{_NUMBER})d)?\s*(?:(?P<h>{_NUMBER})h)?\s*"
    rf"(?:(?P<m>{_NUMBER})m)?\s*(?:(?P<s>{_NUMBER})s)?$"
)
_HELP = "a number of seconds or a duration such as 90s, 30m, 2h, 7d or 1h30m"


class DurationError(FieldError):
    """An invalid duration; ``field`` names the option, the message says what is allowed."""


def parse_duration(value: int | float | str, field: str = "duration") -> float:
    """Seconds (> 0, finite) from a number of seconds or a duration string."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise DurationError(field, f"{field} must be {_HELP}, not {shown(value)}")
    if isinstance(value, str):
        text = value.strip().lower()
        if _PLAIN_RE.fullmatch(text):
            seconds = float(text)
        else:
            m = _PARTS_RE.fullmatch(text)
            if not text or not m or not any(m.groupdict().values()):
                raise DurationError(field, f"{field} must be {_HELP}, not {shown(value)}")
            seconds = sum(float(n) * _UNIT_SECONDS[unit] for unit, n in m.groupdict().items() if n)
    else:
        try:
            seconds = float(value)
        except OverflowError:  # an int beyond float range (JSON allows it): not a 500
            seconds = math.inf
    if not math.isfinite(seconds):
        raise DurationError(field, f"{field} must be a finite duration, not {shown(value)}")
    if seconds <= 0:
        raise DurationError(field, f"{field} must be longer than zero, got {shown(value)}")
    return seconds


def format_duration(seconds: float) -> str:
    """``5400`` -> ``"1h30m"``, ``90`` -> ``"1m30s"``, ``0.25`` -> ``"0.25s"``, ``0`` -> ``"0s"``.

    Milliseconds are kept, finer fractions rounded; :func:`parse_duration` reads the result back.
    """
    if isinstance(seconds, bool) or not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"cannot format {seconds!r} as a duration")
    millis = round(seconds * 1000)
    whole, frac = divmod(millis, 1000)
    parts = []
    for unit in ("d", "h", "m"):
        n, whole = divmod(whole, _UNIT_SECONDS[unit])
        if n:
            parts.append(f"{n}{unit}")
    if whole or frac or not parts:
        secs = f"{whole}.{frac:03d}".rstrip("0").rstrip(".") if frac else str(whole)
        parts.append(f"{secs}s")
    return "".join(parts)
