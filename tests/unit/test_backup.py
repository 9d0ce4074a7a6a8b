"""gpulab.admin.backup on SQLite files: a consistent copy while a writer goes on, the
manifest, the secrets key kept apart unless asked, and a restore that refuses to overwrite."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading

import pytest

from gpulab.admin import backup as b
from gpulab.db import Database
from gpulab.jobs.records import JobRecords
from gpulab.lifecycle import JobState


def count(path, table: str) -> int:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    finally:
        conn.close()


def test_an_online_copy_while_a_writer_goes_on(tmp_path):
    url = f"sqlite:///{tmp_path / 'gpulab.sqlite'}"
    jobs = JobRecords(Database(url), "t")
    hub = tmp_path / "jupyterhub.sqlite"
    with sqlite3.connect(hub) as conn:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO users (name) VALUES ('ann')")
    stop = threading.Event()

    def write():
        while not stop.is_set():  # each job and its first event in one transaction
            job = jobs.create("ann", {"priority": 50}, None, [])
            jobs.transition(job["id"], JobState.INITIALIZING, expect=JobState.QUEUED)

    jobs.create("ann", {"priority": 50}, None, [])
    writer = threading.Thread(target=write)
    writer.start()
    try:
        key = tmp_path / "secrets.key"
        key.write_text("k\n")
        sources = [b.Source("hub", f"sqlite:///{hub}"), b.Source("gpulab", url)]
        manifest = b.backup(tmp_path / "bk", sources, b.KeyPlace(str(key)), with_key=False)
    finally:
        stop.set()
        writer.join()
    copy = tmp_path / "bk" / "gpulab.sqlite"
    assert count(copy, "jobs") > 0
    # every job in the copy has its QUEUED event: no half-written transaction
    assert count(copy, "job_events") >= count(copy, "jobs")
    assert manifest["databases"]["hub"] == {
        "kind": "sqlite",
        "file": "jupyterhub.sqlite",
        "source": f"sqlite:///{hub}",
        "revision": None,
    }
    assert json.loads((tmp_path / "bk" / "manifest.json").read_text()) == manifest
    assert not (tmp_path / "bk" / "secrets.key").exists()
    advice = b.key_advice(manifest)
    assert "NOT in this backup" in advice and str(key) in advice
    assert (copy.stat().st_mode & 0o777) == 0o600

    with pytest.raises(b.BackupError, match="not empty"):
        b.backup(tmp_path / "bk", sources, b.KeyPlace(str(key)), with_key=False)
    with_key = b.backup(tmp_path / "bk2", sources, b.KeyPlace(str(key)), with_key=True)
    assert (tmp_path / "bk2" / "secrets.key").read_text() == "k\n"
    assert "is in this backup" in b.key_advice(with_key)

    data = tmp_path / "data"
    done = b.restore(tmp_path / "bk", data, {}, None)
    assert count(data / "jupyterhub.sqlite", "users") == 1
    assert count(data / "gpulab.sqlite", "jobs") == count(copy, "jobs")
    assert "NOT restored" in done[-1] and not (data / "secrets.key").exists()
    with pytest.raises(b.BackupError, match="not empty"):
        b.restore(tmp_path / "bk", data, {}, None)
    b.restore(tmp_path / "bk2", tmp_path / "data2", {}, None)  # the backup's own key
    assert (tmp_path / "data2" / "secrets.key").stat().st_mode & 0o777 == 0o600
    with pytest.raises(b.BackupError, match="restores into a SQLite file"):
        b.restore(tmp_path / "bk", tmp_path / "d3", {"gpulab": "postgresql:///x"}, None)
    with pytest.raises(b.BackupError, match="not a gpulab backup"):
        b.restore(tmp_path, tmp_path / "d4", {}, None)


def test_gpulab_admin_is_its_own_program():
    done = subprocess.run(
        [sys.executable, "-m", "gpulab.cli", "admin", "backup", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "--with-key" in done.stdout


def test_a_postgresql_url_as_libpq_takes_it():
    """pg_dump and psql get no SQLAlchemy driver and never the password on their command line
    (where ps shows it): it goes in PGPASSWORD."""
    url, env = b.libpq("postgresql+psycopg://u:s3cret@db.example:5433/g")
    assert url == "postgresql://u@db.example:5433/g" and env == {"PGPASSWORD": "s3cret"}
    url, env = b.libpq("postgresql+psycopg:///g?host=/var/run/postgresql")
    assert url.startswith("postgresql:///g?host=") and env == {}
