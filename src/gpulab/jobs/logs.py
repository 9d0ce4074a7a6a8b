"""A job's output as its users read it: the tail kept of each rank's (bounded, however much
it printed), timestamped rank logs merged into one, and the cap on the log streams open at
once (a user's, and everyone's)."""

from __future__ import annotations

import contextlib
import heapq
import re
from collections.abc import Iterator, Sequence

from ..runtime.base import Runtime
from ..runtime.base import read_tail as tail_of
from .refusals import Busy

#: the bytes of a job's output kept (saved at its end, or merged for a reader)
LOG_KEEP_BYTES = 10 * 1024 * 1024
LOG_KEEP_LINES = 200_000  # asked of the engine: the tail, not the whole log
#: log streams one user may hold open at once, and all users together (each holds a thread
#: of the service's log pool while it lasts)
MAX_LOG_STREAMS_PER_USER = 8
MAX_LOG_STREAMS = 64

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


def rank_log_share(workers: int) -> int:
    """Bytes of each rank's output kept (saved, or merged for a reader): the job's total
    stays LOG_KEEP_BYTES however many workers it has, at least 64 KiB a rank."""
    return max(LOG_KEEP_BYTES // max(1, workers), 64 * 1024)


def read_tail(runtime: Runtime, name: str, keep: int, timestamps: bool = False) -> bytes:
    """The last ``keep`` bytes of a job's output, from whole lines, asked of the engine as its
    last LOG_KEEP_LINES lines (blocking; :func:`gpulab.runtime.base.read_tail`). Raises
    WorkloadGone."""
    return tail_of(runtime, name, keep, LOG_KEEP_LINES, timestamps)


def merged_tail(runtime: Runtime, names: Sequence[str]) -> bytes:
    """The tail of every rank's output (``names``, rank 0 first) merged in time order, each
    line prefixed ``[rank K]`` (blocking): LOG_KEEP_BYTES in all, whatever the workers.
    Raises WorkloadGone."""
    share = rank_log_share(len(names))
    return merge_logs([read_tail(runtime, n, share, timestamps=True) for n in names])


class LogStreams:
    """The job log streams open at once: at most ``per_user`` for a user, ``total`` in all.
    A distributed job's ranks followed together take one stream each."""

    def __init__(self, per_user: int = MAX_LOG_STREAMS_PER_USER, total: int = MAX_LOG_STREAMS):
        self.per_user, self.total = per_user, total
        self.open: dict[str, int] = {}

    @contextlib.contextmanager
    def held(self, user: str, workers: int, rank: int | None, follow: bool) -> Iterator[None]:
        """Count the streams ``user``'s read of a job's log takes (all of a ``workers``-rank
        job's, or one ``rank``'s, ``follow``ed or not) while it lasts; :class:`Busy` over
        either cap. Counted before anything waits: a follower waiting for its job to start
        holds its streams too."""
        cost = workers if workers > 1 and rank is None and follow else 1
        mine = self.open.get(user, 0)
        if mine + cost > self.per_user:
            more = (
                f" (following all {workers} ranks takes {cost}: follow one with ?rank=K, "
                "or gpulab job logs --rank K)"
                if cost > 1
                else ""
            )
            raise Busy(
                f"you have {mine} of {self.per_user} job log streams open; close one first{more}"
            )
        if sum(self.open.values()) + cost > self.total:
            raise Busy(f"the service has {self.total} log streams open; try again later")
        self.open[user] = mine + cost
        try:
            yield
        finally:
            self.open[user] -= cost
            if not self.open[user]:
                del self.open[user]
