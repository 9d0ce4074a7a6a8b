"""Keeps SQLite's write-ahead log bounded under a steady load: every :data:`INTERVAL`
seconds, once the log is past SQLite's own checkpoint size, the service checkpoints it and
cuts it to nothing (:meth:`gpulab.db.Database.checkpoint`). A checkpoint that finds reads
still on the log gives up at once (it holds the write lock while it waits): beside reads
that never pause, about half of them did in ``bench/bench_storage.py``, so it looks again
every second rather than wait longer. Nothing on PostgreSQL (a look is a ``stat``)."""

from __future__ import annotations

import asyncio
import logging

from ...db import Database

log = logging.getLogger(__name__)

#: seconds between two looks at the log's size
INTERVAL = 1.0
#: bytes of log past which the service checkpoints: SQLite's own checkpoint size (1000
#: pages of 4 KiB), which a log below it needs no help with
THRESHOLD = 1000 * 4096


async def checkpoint_once(db: Database) -> tuple[int, int, float] | None:
    """Checkpoint the log if it is past :data:`THRESHOLD` (off the event loop): what
    :meth:`~gpulab.db.Database.checkpoint` answers, or None when there was nothing to do."""
    if db.wal_bytes() <= THRESHOLD:
        return None
    return await asyncio.to_thread(db.checkpoint)


async def checkpoint_loop(db: Database) -> None:
    """:func:`checkpoint_once` every :data:`INTERVAL` seconds, in every service (the
    standby's too: the log is the file's, whoever writes it)."""
    while True:
        await asyncio.sleep(INTERVAL)
        try:
            await checkpoint_once(db)
        except Exception:
            log.exception("checkpoint of the database's log failed")
