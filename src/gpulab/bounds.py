"""Caps on what one request may carry, and the sane range of every number a user sends.

Every list and string that reaches gpulab from a user (a job submission to the service, a
notebook's ``user_options`` to the hub) has a cap here, and every caller checks it *before*
any work whose cost grows with the input: before parsing each volume, before comparing mount
paths, before resolving resources. An over-cap request is refused with a
:class:`~gpulab.errors.FieldError` that names the field and the cap, e.g.
``volumes: at most 32 entries (got 4000)`` (HTTP 400; an oversized body is a 413).

The caps are chosen so that machine-learning use never meets them (32 data volumes, 128
environment variables of up to 32 KiB, a 64 KiB command line...) while the work of validating
one request stays bounded: a request with every cap at its limit validates in about a
millisecond, so no request can hold the hub's or the service's event loop. The request body
cap is operator-configurable (``GpulabSettings.max_request_body``); the others are constants,
listed for operators in docs/limits.md.

The number ranges keep what reaches the engine meaningful: a CPU quota that rounds to zero is
"no limit" for Docker, so cpus start at 0.01 (a quota of 1 ms per 100 ms period, the engine's
own minimum); NaN and infinities are refused wherever a number is read.
"""

from __future__ import annotations

import re
import reprlib

from .errors import FieldError

KiB, MiB = 1024, 1024**2

# --- request body (the gpulab service) ------------------------------------------------------
#: default of ``GpulabSettings.max_request_body``: the largest body the service reads
MAX_REQUEST_BODY = 1 * MiB
#: the service's HTTP server stops reading a body this many times over the cap (tornado's
#: ``max_body_size``: a bare 400 and a closed connection); below that a JSON 413 says the cap
BODY_BACKSTOP_FACTOR = 4

# --- strings ----------------------------------------------------------------------------------
#: a job's name (also a DNS-label-like identifier)
MAX_NAME_CHARS = 63
#: an image reference (``registry/name:tag`` or ``@sha256:...``)
MAX_IMAGE_CHARS = 512
#: a catalog id: framework, version, editor, flavor (ids longer than this cannot be chosen)
MAX_ID_CHARS = 128
#: a number or size written as a string: ``"0.5"``, ``"16G"``, ``"1h30m"``
MAX_NUMBER_CHARS = 32

# --- lists and maps ---------------------------------------------------------------------------
#: a job's command and args together: entries, and UTF-8 bytes (each + 1 for its NUL)
MAX_COMMAND_ITEMS = 256
MAX_COMMAND_BYTES = 64 * KiB
#: a job's environment: variables, name length, one value, all names and values together
MAX_ENV = 128
MAX_ENV_NAME_CHARS = 255
MAX_ENV_VALUE_BYTES = 32 * KiB
MAX_ENV_BYTES = 256 * KiB
#: a job's labels: count, key and value length
MAX_LABELS = 64
MAX_LABEL_KEY_CHARS = 63
MAX_LABEL_VALUE_CHARS = 63
#: data volumes of a job or notebook, and the length of one ``container@store/...`` spec
MAX_VOLUMES = 32
MAX_VOLUME_SPEC_CHARS = 1024
#: git repositories cloned for one job (``git``), the length of a repository's URL and of
#: a branch, tag or commit name (git's own refs are far shorter in practice)
MAX_GIT_SOURCES = 8
MAX_GIT_URL_CHARS = 2048
MAX_GIT_REF_CHARS = 255

# --- numbers ----------------------------------------------------------------------------------
#: cpus: 0.01 is a CPU quota of 1 ms per 100 ms period, the engine's minimum; less would
#: round to 0, which Docker reads as "no CPU limit"
MIN_CPUS = 0.01
MAX_CPUS = 1024.0
#: memory: below this no framework image starts; above it is no machine
MIN_MEMORY = 32 * MiB
MAX_MEMORY = 1024**5
MAX_GPUS = 1024
#: the engine's CPU period (µs) and smallest quota (µs) that gpulab sends
CPU_PERIOD = 100_000
MIN_CPU_QUOTA = 1_000

# --- pages of a list (the REST API's ``?limit=`` and ``?offset=``) ---------------------------
#: list endpoints answer pages of this many items (``?limit=`` up to MAX_PAGE)
DEFAULT_PAGE, MAX_PAGE = 100, 500
#: the largest ``?offset=`` (nine digits)
MAX_OFFSET = 999_999_999
_DIGITS = re.compile(r"[0-9]{1,9}")

_repr = reprlib.Repr()
_repr.maxstring = 60
_repr.maxother = 60
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 4
_repr.maxlevel = 2


def shown(value: object) -> str:
    """``repr`` for an error message, cut short: a refused 1 MiB value is not echoed back."""
    return _repr.repr(value)


def size_text(n: int) -> str:
    """``1048576`` -> ``"1 MiB"``, ``32768`` -> ``"32 KiB"``, ``100`` -> ``"100 bytes"``."""
    for unit, size in (("MiB", MiB), ("KiB", KiB)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"


def check_count(
    error: type[FieldError], field: str, count: int, cap: int, what: str = "entries"
) -> None:
    """Refuse more than ``cap`` entries: ``volumes: at most 32 entries (got 4000)``."""
    if count > cap:
        raise error(field, f"{field}: at most {cap} {what} (got {count})")


def check_chars(error: type[FieldError], field: str, text: str, cap: int) -> None:
    """Refuse a string longer than ``cap`` characters."""
    if len(text) > cap:
        raise error(field, f"{field}: at most {cap} characters (got {len(text)})")


def body_too_large(size: int, cap: int) -> str | None:
    """The message of a 413 for a body of ``size`` bytes, or None when it is within ``cap``."""
    if size <= cap:
        return None
    return (
        f"the request body is {size} bytes; at most {cap} bytes ({size_text(cap)}) are "
        "accepted (max_request_body): pass large inputs through a volume"
    )


def body_backstop(cap: int) -> int:
    """What the service's HTTP server reads at most (tornado's ``max_body_size``)."""
    return cap * BODY_BACKSTOP_FACTOR


def page_window(limit: str | None, offset: str | None) -> tuple[int, int]:
    """A list's page as its reader asked for it: ``limit`` (1 to MAX_PAGE; None: DEFAULT_PAGE)
    and ``offset`` (0 or more; None: 0), each the text of a query argument. A FieldError names
    the argument at fault (``limit`` first)."""
    out = []
    for name, raw, default, top in (
        ("limit", limit, DEFAULT_PAGE, MAX_PAGE),
        ("offset", offset, 0, MAX_OFFSET),
    ):
        raw = str(default) if raw is None else raw
        low = 1 if name == "limit" else 0
        # ASCII digits only: str.isdigit() also takes "²", which int() refuses
        if not _DIGITS.fullmatch(raw) or not low <= int(raw) <= top:
            most = f" and at most {top}" if top < MAX_OFFSET else ""
            raise FieldError(name, f"{name} must be a whole number of at least {low}{most}")
        out.append(int(raw))
    return out[0], out[1]
