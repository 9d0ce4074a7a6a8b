"""A notebook's output as its owner reads it (``GET /api/notebooks/{user}/{server}/logs``,
``gpulab notebook logs``): the tail of its container's log (the editor's and the kernels'
messages), bounded, with credentials scrubbed.

The container is the notebook's while it runs, and kept, stopped, after a FAILED or ERROR end
(so that its log can be read); a stopped notebook's is removed, and so is its log. Every line
goes through :func:`gpulab.logscrub.scrub_text`, the rule of gpulab's own logs: a token in a
URL's query (JupyterHub's and Jupyter Server's websockets carry ``?token=``), an
``Authorization`` header or a cookie becomes ``[secret]``.
"""

from __future__ import annotations

from ..errors import FieldError
from ..logscrub import scrub_text
from ..runtime.base import Runtime, WorkloadGone, read_tail

#: lines asked of the engine by default, and at most
DEFAULT_TAIL_LINES = 200
MAX_TAIL_LINES = 10_000
#: bytes of output answered at most, whatever the lines asked (the last ones, whole lines)
MAX_TAIL_BYTES = 1024 * 1024


class NoOutput(LookupError):
    """The notebook has no container to read (never started, or stopped: its log went with
    its container); the message says which."""


def tail_lines(raw: str | None) -> int:
    """``?tail=N``: 1 to MAX_TAIL_LINES lines (None: DEFAULT_TAIL_LINES); else FieldError
    naming ``tail``."""
    if raw is None:
        return DEFAULT_TAIL_LINES
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 6 or not 1 <= int(raw) <= MAX_TAIL_LINES:
        raise FieldError(
            "tail", f"tail: a whole number of lines from 1 to {MAX_TAIL_LINES}, not {raw[:32]!r}"
        )
    return int(raw)


def read_output(runtime: Runtime, record: dict, lines: int) -> bytes:
    """The last ``lines`` lines of the notebook's output (at most MAX_TAIL_BYTES), each line
    scrubbed of credentials (blocking: call it on a worker thread). :class:`NoOutput` when it
    has no container; an engine's failure comes up as its EngineError."""
    name = record.get("container") or ""
    where = f"notebook {record['server'] or '(default)'} of {record['user']}"
    if not name:
        raise NoOutput(f"{where} has no container yet ({record['state']}): nothing to read")
    try:
        raw = read_tail(runtime, name, MAX_TAIL_BYTES, lines)
    except WorkloadGone:
        raise NoOutput(
            f"{where} has no container now ({record['state']}): a notebook's log goes with "
            "its container when it stops"
        ) from None
    text = raw.decode("utf-8", errors="replace")
    return "".join(scrub_text(line) for line in text.splitlines(keepends=True)).encode()
