"""SQLite's write-ahead log stays bounded: a burst of writes beside a long read grows it, and
the next checkpoint after the read ends cuts it back to WAL_SIZE_LIMIT (db.connect's
journal_size_limit), where without the limit the file kept the burst's size for good."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from gpulab import db

#: SQLite's automatic checkpoint: every 1000 pages of 4 KiB
AUTOCHECKPOINT = 1000 * 4096


def _burst_beside_a_reader(path, monkeypatch, limit: int | None) -> tuple[int, int]:
    """(the log's size after 6 MiB written beside an open read, its size once the read has
    ended and a write has checkpointed it)."""
    if limit is not None:
        monkeypatch.setattr(db, "WAL_SIZE_LIMIT", limit)
    engine = db.connect(f"sqlite:///{path}")
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE t (x BLOB)"))
        reader = engine.connect().execution_options(gpulab_read_only=True)
        reader.begin()
        reader.execute(text("SELECT count(*) FROM t")).scalar()  # holds its snapshot
        for _ in range(96):
            with engine.begin() as conn:
                conn.execute(text("INSERT INTO t VALUES (randomblob(65536))"))
        grown = (path.parent / (path.name + "-wal")).stat().st_size
        reader.close()
        for _ in range(80):  # past the next automatic checkpoint (1000 pages)
            with engine.begin() as conn:
                conn.execute(text("DELETE FROM t WHERE rowid = (SELECT min(rowid) FROM t)"))
                conn.execute(text("INSERT INTO t VALUES (randomblob(65536))"))
        return grown, (path.parent / (path.name + "-wal")).stat().st_size
    finally:
        engine.dispose()


@pytest.mark.parametrize("limit", [None, 1024 * 1024])
def test_the_log_is_cut_back_after_a_burst_beside_a_long_read(tmp_path, monkeypatch, limit):
    grown, after = _burst_beside_a_reader(tmp_path / "x.sqlite", monkeypatch, limit)
    assert grown > 6 * 1024 * 1024  # the open read kept every page of the burst in the log
    if limit is None:  # the default limit (16 MiB) is above this burst: nothing to cut
        assert after >= grown
    else:  # cut back at the checkpoint, then grown again by at most one checkpoint's pages
        assert after < grown / 2 and after <= AUTOCHECKPOINT + 2 * 65536 + 8192, (grown, after)


def test_without_a_limit_the_log_keeps_the_bursts_size(tmp_path, monkeypatch):
    """What the limit is for: SQLite's own default (-1) never shrinks the file."""
    monkeypatch.setattr(db, "WAL_SIZE_LIMIT", -1)
    grown, after = _burst_beside_a_reader(tmp_path / "y.sqlite", monkeypatch, None)
    assert after >= grown


def test_reads_that_overlap_keep_the_log_growing_and_the_services_checkpoint_cuts_it(tmp_path):
    """SQLite starts its log over only when no read uses it: reads that overlap (two here,
    taking turns, as API clients do) keep it growing past WAL_SIZE_LIMIT whatever its own
    checkpoints do. Database.checkpoint cuts it to nothing once the reads on it have ended,
    and gives up (busy) within its short wait while an older read still holds it, never
    holding the write lock for SQLite's 30 s busy timeout."""
    from gpulab.service.tasks import checkpoint as task
    from tests.conftest import run_async

    base = db.Database(f"sqlite:///{tmp_path / 'z.sqlite'}")
    wal = tmp_path / "z.sqlite-wal"
    with base.engine.begin() as conn:
        conn.execute(text("CREATE TABLE t (x BLOB)"))

    def reader():
        conn = base.engine.connect().execution_options(gpulab_read_only=True)
        conn.begin()
        conn.execute(text("SELECT count(*) FROM t")).scalar()  # holds its snapshot
        return conn

    readers = [reader()]
    for i in range(400):  # 25 MiB, a reader always open on the log
        with base.session() as s:
            s.execute(text("INSERT INTO t VALUES (randomblob(65536))"))
        if i % 10 == 9:
            readers.append(reader())
            readers.pop(0).close()
    grown = wal.stat().st_size
    assert grown > db.WAL_SIZE_LIMIT
    assert run_async(task.checkpoint_once(base)) is not None  # past the threshold: it acts
    busy, pages, held = base.checkpoint()
    assert busy == 1 and pages > 0 and held < 1.0  # the open read: given up, not waited for
    assert wal.stat().st_size >= grown
    readers.pop(0).close()
    busy, _, held = base.checkpoint()
    assert (busy, wal.stat().st_size) == (0, 0) and held < 1.0
    assert run_async(task.checkpoint_once(base)) is None  # nothing to do below the threshold
    with base.read() as s:
        assert s.execute(text("SELECT count(*) FROM t")).scalar() == 400
    base.engine.dispose()
