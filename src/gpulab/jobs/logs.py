"""A job's output as its users read it: timestamped rank logs merged into one (pure)."""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterator, Sequence

_STAMP = re.compile(rb"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?Z ")


def strip_stamps(log: bytes) -> bytes:
    """A timestamped log (``timestamps=True``) as its command printed it."""
    return b"".join(
        line.partition(b" ")[2] if _STAMP.match(line) else line
        for line in log.splitlines(keepends=True)
    )


def _lines(rank: int, log: bytes) -> Iterator[tuple[bytes, int, int, bytes]]:
    """(stamp key, rank, line number, prefixed line) of one rank's log, in its order; a line
    without a stamp (cut, or not from the engine) keeps the key of the line before it."""
    key = b""
    prefix = b"[rank %d] " % rank
    lines = log.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()
    for i, line in enumerate(lines):
        # "2026-11-23T10:00:00.123Z text": byte checks, no regex (hundreds of thousands)
        sp = line.find(b" ", 19, 32)
        if sp > 0 and line[sp - 1] == 90 and line[10] == 84:  # 'Z', 'T'
            whole, _, frac = line[: sp - 1].partition(b".")
            key, line = whole + b"." + frac.ljust(9, b"0"), line[sp + 1 :]
        yield key, rank, i, prefix + line + b"\n"


def merge_logs(per_rank: Sequence[bytes]) -> bytes:
    """All ranks' timestamped logs as one, in time order (rank order for equal times), each
    line prefixed ``[rank K] `` and without its stamp. Each rank's log is already in time
    order: a k-way merge (linear; the caller bounds each rank's bytes)."""
    merged = heapq.merge(*(_lines(rank, log) for rank, log in enumerate(per_rank)))
    return b"".join(x[3] for x in merged)
