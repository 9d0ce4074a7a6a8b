"""The value checks that every job spec field uses (pure): text, whole numbers, booleans and
durations, each refused with a :class:`JobSpecError` naming the field and saying what is
allowed."""

from __future__ import annotations

from collections.abc import Mapping

from ..bounds import (
    MAX_COMMAND_ITEMS,
    MAX_ID_CHARS,
    MAX_NUMBER_CHARS,
    check_chars,
    shown,
)
from ..durations import DurationError, format_duration, parse_duration
from ..errors import FieldError

#: what a text field takes for "absent" (None and "", as :func:`_optional_text` reads them)
ABSENT_TEXT = [None, ""]


class JobSpecError(FieldError):
    """An invalid submission; ``field`` names the (dotted) field, the message what is allowed."""


def _type_name(value: object) -> str:
    return type(value).__name__ if value is not None else "null"


def _key_text(key: object) -> str:
    """An unknown or invalid key as it appears in ``field``: cut to 64 characters."""
    text = str(key)
    return text if len(text) <= 64 else text[:64] + "..."


def _first_unknown(value: Mapping, known: frozenset[str]) -> object | None:
    """The first key (in the body's order) that is not ``known``; stops there, whatever the
    number of keys (no set difference or sort of a huge object)."""
    return next((k for k in value if k not in known), None)


def _optional_text(raw: Mapping, key: str, cap: int = MAX_ID_CHARS) -> str | None:
    """None and "" mean absent; anything else must be a string of at most ``cap`` characters."""
    value = raw.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise JobSpecError(key, f"{key} must be a string, not {_type_name(value)} {shown(value)}")
    check_chars(JobSpecError, key, value, cap)
    return value


def _whole(value: object) -> object:
    """A float with a whole value (``45.0``) as the integer it is: JSON (and JSON Schema's
    ``integer``) does not tell ``45.0`` from ``45``. Anything else as it came."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _integer(value: object, key: str, low: int, high: int) -> int:
    value = _whole(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise JobSpecError(
            key, f"{key} must be a whole number from {low} to {high}, not {shown(value)}"
        )
    if not low <= value <= high:
        raise JobSpecError(key, f"{key} must be from {low} to {high}, got {shown(value)}")
    return value


def _boolean(value: object, key: str) -> bool:
    if not isinstance(value, bool):
        raise JobSpecError(key, f"{key} must be true or false, not {shown(value)}")
    return value


def _duration(value: object, key: str, low: float, high: float) -> float:
    if isinstance(value, str):
        check_chars(JobSpecError, key, value, MAX_NUMBER_CHARS)
    try:
        seconds = parse_duration(value, key)  # type: ignore[arg-type]
    except DurationError as e:
        raise JobSpecError(e.field, str(e)) from None
    if seconds < low:
        raise JobSpecError(
            key, f"{key} must be at least {format_duration(low)}, got {shown(value)}"
        )
    if seconds > high:
        raise JobSpecError(
            key, f"{key} must be at most {format_duration(high)}, got {shown(value)}"
        )
    return seconds


def _strings(value: object, key: str, room: int) -> tuple[str, ...]:
    """A list of at most ``room`` strings without NUL characters."""
    if not isinstance(value, list | tuple):
        raise JobSpecError(key, f"{key} must be a list of strings, not {shown(value)}")
    if len(value) > room:
        raise JobSpecError(
            key,
            f"{key}: at most {MAX_COMMAND_ITEMS} entries in command and args together "
            f"(got {MAX_COMMAND_ITEMS - room + len(value)})",
        )
    for s in value:
        if not isinstance(s, str):
            raise JobSpecError(key, f"{key} must be a list of strings, not {shown(value)}")
        if "\0" in s:
            raise JobSpecError(key, f"{key} must not contain NUL characters")
    return tuple(value)
