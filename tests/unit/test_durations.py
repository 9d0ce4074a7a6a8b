"""Durations: parsing what users write and formatting seconds back (pure)."""

from __future__ import annotations

import pytest

from gpulab.durations import DurationError, format_duration, parse_duration


@pytest.mark.parametrize(
    "value, seconds",
    [
        (90, 90.0),
        (1.5, 1.5),
        ("90", 90.0),
        ("90s", 90.0),
        ("30m", 1800.0),
        ("2h", 7200.0),
        ("7d", 604800.0),
        ("1h30m", 5400.0),
        ("1h 30m", 5400.0),
        (" 1d12h ", 129600.0),
        ("1.5h", 5400.0),
        ("1d2h3m4s", 93784.0),
        ("2H", 7200.0),
        ("0.5s", 0.5),
    ],
)
def test_parse_accepts_numbers_and_unit_strings(value, seconds):
    assert parse_duration(value, "timeout") == seconds


@pytest.mark.parametrize(
    "value, words",
    [
        (0, "longer than zero"),
        (-5, "longer than zero"),
        ("0s", "longer than zero"),
        ("0h0m", "longer than zero"),
        ("", "duration such as"),
        ("   ", "duration such as"),
        ("soon", "duration such as"),
        ("30m1h", "duration such as"),  # units from the largest to the smallest
        ("1h1h", "duration such as"),
        ("5w", "duration such as"),
        ("-1h", "duration such as"),
        ("1e3", "duration such as"),
        ("h", "duration such as"),
        (True, "duration such as"),
        (None, "duration such as"),
        ([60], "duration such as"),
        (float("inf"), "finite"),
        (float("nan"), "finite"),
        ("9" * 400 + "s", "finite"),
    ],
)
def test_parse_refuses_garbage_naming_the_field(value, words):
    with pytest.raises(DurationError, match=words) as e:
        parse_duration(value, "hang_restart.period")
    assert e.value.field == "hang_restart.period"
    assert "hang_restart.period" in str(e.value)


@pytest.mark.parametrize(
    "seconds, text",
    [
        (0, "0s"),
        (45, "45s"),
        (90, "1m30s"),
        (3600, "1h"),
        (5400, "1h30m"),
        (604800, "7d"),
        (93784, "1d2h3m4s"),
        (86400 + 1, "1d1s"),
        (0.25, "0.25s"),
        (61.5, "1m1.5s"),
        (1.0004, "1s"),
    ],
)
def test_format(seconds, text):
    assert format_duration(seconds) == text


@pytest.mark.parametrize("seconds", [1, 59, 60, 3599, 3600, 86399, 30 * 86400, 12.5, 0.001])
def test_format_then_parse_round_trips(seconds):
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf")])
def test_format_refuses_negative_or_infinite(bad):
    with pytest.raises(ValueError):
        format_duration(bad)
