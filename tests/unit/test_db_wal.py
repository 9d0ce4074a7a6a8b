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
