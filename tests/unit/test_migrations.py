"""gpulab's schema revisions (Alembic, src/gpulab/migrations): a new database is made at the
newest revision; the previous release's database (tests/support/schemas/gpulab-0.1.0.sql:
the tables gpulab 0.1.0's models made, db.py at commit 7f83243, with rows of every table) is
taken up with its data; an older one is refused at start-up until ``upgrade-db`` runs the
revisions, and one made by a newer gpulab is refused. After each, the schema is exactly what
the models declare (Alembic's comparison finds nothing).

The fixture was made by running 7f83243's db.py (``git show 7f83243:src/gpulab/db.py``) on a
new SQLite file, inserting the rows, and writing ``sqlite3``'s ``iterdump()``; its secret is
encrypted with KEY below (framed ``owner\\0name\\0value`` as gpulab/secrets.py does)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from gpulab.db import Base, Database, SchemaMismatch, head_revision, schema_revision
from gpulab.disk_ledger import DiskLedger
from gpulab.gpus.inventory import GpuDevice
from gpulab.gpus.ledger import GpuLedger
from gpulab.jobs.records import JobRecords
from gpulab.notebooks.records import NotebookRecords
from gpulab.secrets import SecretStore

FIXTURE = Path(__file__).parents[1] / "support" / "schemas" / "gpulab-0.1.0.sql"
KEY = b"yH0Bq3Jm6yVZb3kQmF3m0lS3iX1v8m2G9l0Jt8y0e2A="


def differences(db: Database) -> list:
    with db.engine.connect() as conn:
        return compare_metadata(MigrationContext.configure(conn), Base.metadata)


def previous_release(path: Path, drop: tuple[tuple[str, str], ...] = ()) -> str:
    conn = sqlite3.connect(path)
    conn.executescript(FIXTURE.read_text())
    for table, column in drop:  # what builds before 0.1.0 lacked
        conn.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    conn.commit()
    conn.close()
    return f"sqlite:///{path}"


def check_data(db: Database) -> None:
    jobs = JobRecords(db, "lab")
    job = jobs.get("J0001")
    assert job["state"] == "RUNNING" and job["groups"] == ["team"] and job["restarts"] == 1
    assert [(e["kind"], e["state"]) for e in job["history"]] == [
        ("transition", "QUEUED"),
        ("transition", "INITIALIZING"),
        ("transition", "PENDING"),
        ("transition", "RUNNING"),
        ("fault-recovery", "RUNNING"),
    ]
    done = jobs.get("J0002")
    assert done["state"] == "DONE" and done["exit_code"] == 0
    notebook = NotebookRecords(db, "lab").get("ann", "nb")
    assert notebook["state"] == "RUNNING"
    assert [e["state"] for e in notebook["history"]] == ["STARTING", "RUNNING"]
    ledger = GpuLedger(db, "lab", [GpuDevice("0"), GpuDevice("1")])
    assert ledger.held_by("J0001") == ["0"] and ledger.held_by("ann/nb") == ["1"]
    assert DiskLedger(db, "lab").held("ann") == 5 * 1024**3
    assert SecretStore(db, "lab", [KEY]).reveal("ann", "hf") == "s3cret-value"


def test_a_new_database_is_made_at_the_newest_revision(tmp_path):
    url = f"sqlite:///{tmp_path / 'new.sqlite'}"
    db = Database(url)
    assert schema_revision(url) == head_revision()
    assert differences(db) == []
    Database(url)  # a second start finds it current


def test_the_previous_release_database_is_taken_up_with_its_data(tmp_path):
    url = previous_release(tmp_path / "g.sqlite")
    assert schema_revision(url) is None
    # recognised as 0.1.0's (revision 0001), older than this gpulab: upgraded when asked
    with pytest.raises(SchemaMismatch, match="revision 0001, .*gpulab admin upgrade-db"):
        Database(url)  # what the hub and the service do at their start
    assert schema_revision(url) is None  # refused: nothing changed
    db = Database(url, upgrade=True)
    assert schema_revision(url) == head_revision()
    assert differences(db) == []
    check_data(db)


def test_the_billing_totals_are_filled_from_the_records_found(tmp_path):
    """Revision 0004 settles every closed billed period of the jobs it finds in the month
    it closed (one job across a month boundary, a gang of 2 x 2 GPUs, one still running),
    so that usage reads the same before and after the upgrade."""
    path = tmp_path / "g.sqlite"
    url = previous_release(path)
    conn = sqlite3.connect(path)
    spec = '{"command": ["x"], "resources": {"gpus": 2}, "workers": 2}'
    jobs = {
        # Oct 31 23:59:30 to Nov 1 00:01:00, re-queued, then 30 s more in November: 2 min
        "J0003": [
            ("2026-10-31 23:59:00", "QUEUED"),
            ("2026-10-31 23:59:30", "RUNNING"),
            ("2026-10-31 23:59:50", "QUEUED"),  # 20 s: 1 minute settled in October
            ("2026-11-01 00:00:00", "RUNNING"),
            ("2026-11-01 00:01:10", "FINALIZING"),  # 90 s in all: 2 minutes, 1 more
            ("2026-11-01 00:02:00", "DONE"),
        ],
    }
    for job_id, events in jobs.items():
        conn.execute(
            "INSERT INTO jobs VALUES(?,'lab','bob','t',?,?,50,?,?,NULL,'','','',0,0,0,0,'',"
            "'','','','')",
            (job_id, spec, events[-1][1], events[0][0], events[-1][0]),
        )
        for at, state in events:
            conn.execute(
                "INSERT INTO job_events (job_id, at, kind, state, reason, message) "
                "VALUES (?, ?, 'transition', ?, '', '')",
                (job_id, at + ".000000", state),
            )
    conn.commit()
    conn.close()
    db = Database(url, upgrade=True)
    records = JobRecords(db, "lab")
    assert records.month_usage("2026-10") == [
        {"user": "bob", "jobs_billed_minutes": 1, "jobs_billed_gpu_minutes": 4}
    ]
    assert records.month_usage("2026-11", "bob") == [
        {"user": "bob", "jobs_billed_minutes": 1, "jobs_billed_gpu_minutes": 4}
    ]
    assert records.usage("bob")["jobs_billed_minutes"] == records.get("J0003")["billed_minutes"]
    assert records.usage("ann")["jobs_billed_minutes"] == records.get("J0001")["billed_minutes"]


def test_an_older_database_is_refused_until_upgraded(tmp_path):
    drop = (("jobs", "outcome"), ("jobs", "node"), ("notebooks", "node"))
    url = previous_release(tmp_path / "g.sqlite", drop)
    with pytest.raises(SchemaMismatch, match="gpulab admin upgrade-db"):
        Database(url)
    assert schema_revision(url) is None  # refused: nothing changed
    db = Database(url, upgrade=True)
    assert schema_revision(url) == head_revision()
    assert differences(db) == []
    check_data(db)
    assert JobRecords(db, "lab").get("J0001")["node"] == ""


def test_a_newer_gpulab_database_is_refused(tmp_path):
    url = f"sqlite:///{tmp_path / 'g.sqlite'}"
    Database(url)
    conn = sqlite3.connect(tmp_path / "g.sqlite")
    conn.execute("UPDATE alembic_version SET version_num = 'f00d'")
    conn.commit()
    conn.close()
    with pytest.raises(SchemaMismatch, match="a newer gpulab made it"):
        Database(url, upgrade=True)


def test_gpulab_admin_upgrade_db(tmp_path):
    """The operator's command, with the hub's configuration: the older database upgraded,
    then found current."""
    url = previous_release(tmp_path / "g.sqlite", (("jobs", "outcome"),))
    config = tmp_path / "config.py"
    config.write_text(f"c.GpulabSettings.database_url = {url!r}\n")

    def upgrade_db():
        return subprocess.run(
            [sys.executable, "-m", "gpulab.admin", "upgrade-db", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
        )

    done = upgrade_db()
    assert done.returncode == 0, done.stderr
    assert f"schema revision none -> {head_revision()}" in done.stdout
    again = upgrade_db()
    assert again.returncode == 0 and f"{head_revision()}, current" in again.stdout
    check_data(Database(url))


def test_a_spawn_on_an_older_database_is_a_503_saying_what_to_run(tmp_path):
    """The service stops at start-up on such a database; the hub's spawner answers a spawn
    with a 503 that says what to run, not a 500 with a traceback."""
    from tornado import web
    from traitlets.config import Config

    from gpulab.notebooks.spawner import NotebookSpawner

    url = previous_release(tmp_path / "g.sqlite", (("jobs", "outcome"),))
    c = Config()
    c.GpulabSettings.database_url = url
    with pytest.raises(web.HTTPError) as e:
        NotebookSpawner(config=c).gpulab_db  # noqa: B018
    assert e.value.status_code == 503
    assert "gpulab admin upgrade-db" in e.value.log_message
    assert schema_revision(url) is None  # nothing changed
