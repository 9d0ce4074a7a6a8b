"""gpulab's database on PostgreSQL: the ledger's guarantee, the records, and a whole hub."""

from __future__ import annotations

import concurrent.futures
import time

import pytest
import requests

from gpulab.db import Database
from gpulab.gpus.inventory import GpuDevice
from gpulab.gpus.ledger import GpuLedger, NoGpuAvailable
from gpulab.jobs.records import JobRecords
from gpulab.lifecycle import JobState, NotebookState
from gpulab.notebooks.records import NotebookRecords


def test_ledger_never_hands_a_device_out_twice_on_postgres(postgres_url):
    devices = [GpuDevice(str(i)) for i in range(4)]
    # one engine per "process": separate connection pools racing on the same table
    ledgers = [GpuLedger(Database(postgres_url), "pg", devices) for _ in range(4)]

    def take(i):
        try:
            return ledgers[i % 4].reserve(f"w{i}", "u", "notebook", 1)
        except NoGpuAvailable as e:
            return str(e)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(take, range(16)))
    granted = sorted(r[0] for r in results if isinstance(r, list))
    assert granted == ["0", "1", "2", "3"], results
    assert all("4 of 4 in use" in r for r in results if isinstance(r, str))


def test_disk_quota_never_overshoots_on_postgres(postgres_url):
    """Sixteen volumes of one user booked at once through four connection pools: 3 GiB each
    of a 10 GiB quota (sizes past 2**31: the column is a BIGINT), so exactly three fit."""
    from gpulab.disk_ledger import DiskLedger, DiskQuotaExceeded

    GiB = 1024**3
    ledgers = [DiskLedger(Database(postgres_url), "pg") for _ in range(4)]

    def take(i):
        try:
            return ledgers[i % 4].book("u", f"w{i}", f"vol-{i}", "", 3 * GiB, 10 * GiB).granted
        except DiskQuotaExceeded as e:
            return e

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(take, range(16)))
    assert [r for r in results if isinstance(r, int)] == [3 * GiB] * 3, results
    assert ledgers[0].held("u") == 9 * GiB
    assert ledgers[1].book("other", "w", "vol-x", "", 10 * GiB, 10 * GiB).granted == 10 * GiB


def test_dataset_cache_claims_never_overshoot_a_node_s_cap_on_postgres(postgres_url):
    """Sixteen copies of 6 bytes claimed at once through four connection pools (the hub's and
    the service's processes) under a 20-byte cap: three fit; a pin and an eviction of one
    ready copy, both from the same read, cannot both win."""
    from gpulab.data.datasets import READY, DatasetCopies

    copies = [DatasetCopies(Database(postgres_url), "pg-dc") for _ in range(4)]

    def claim(i):
        return copies[i % 4].claim("n", f"pg-dc-dataset-{i}-6", 6, 20, f"p{i % 4}", {}).outcome

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        outcomes = list(pool.map(claim, range(16)))
    assert outcomes.count("claimed") == 3 and outcomes.count("full") == 13, outcomes
    (first, *_) = copies[0].all("n")
    assert copies[0].change(first, state=READY, holder="", lease_until=None)
    seen = copies[1].get("n", first.volume)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        pin = pool.submit(copies[2].change, seen, pins={"w": time.time() + 60})
        evict = pool.submit(copies[3].change, seen, state="evicting", holder="p3")
        assert sorted([pin.result(), evict.result()]) == [False, True]


def test_shares_and_whole_gpus_at_once_on_postgres(postgres_url):
    """A whole device (share 0) and a slot of it (share k) are different rows to the unique
    constraint: the ledger's transaction-wide lock is what keeps them apart on PostgreSQL."""
    from ..support.ledger import check_ledger_invariants

    sharing = {"0": 4, "1": 2}
    devices = [GpuDevice(str(i)) for i in range(3)]
    ledgers = [GpuLedger(Database(postgres_url), "pg", devices, sharing=sharing) for _ in range(4)]
    asks = [1, 0.5, 0.25, 1, 0.5, 0.75, 1, 0.25, 0.5, 1, 0.25, 0.5, 1, 0.5, 0.25, 1]

    def take(i):
        try:
            return asks[i], ledgers[i % 4].reserve(f"w{i}", f"u{i}", "notebook", asks[i])
        except NoGpuAvailable as e:
            return asks[i], str(e)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(take, range(len(asks))))
    rows = check_ledger_invariants(ledgers[0].db, "pg", sharing)
    assert sum(a for a, r in results if isinstance(r, list)) <= 3, results
    assert {d for d, _, _ in rows} == {"0", "1", "2"}, rows


def test_records_on_postgres(postgres_url):
    db = Database(postgres_url)
    jobs = JobRecords(db, "pg")
    job = jobs.create("ann", {"priority": 50}, None, ["team"])
    was = JobState.QUEUED
    for state in (JobState.INITIALIZING, JobState.PENDING, JobState.RUNNING):
        jobs.transition(job["id"], state, expect=was)
        was = state
    got = jobs.get(job["id"])
    assert got["state"] == "RUNNING" and got["groups"] == ["team"] and got["running_since"]
    notebooks = NotebookRecords(db, "pg")
    notebooks.transition("ann", "nb", NotebookState.STARTING)
    notebooks.transition("ann", "nb", NotebookState.RUNNING)
    assert [e["state"] for e in notebooks.get("ann", "nb")["history"]] == ["STARTING", "RUNNING"]


def test_retention_on_postgres(postgres_url):
    """Retention's pick (a read) and its deletion (the picked jobs re-read, rows locked), and
    a notebook's history cut with its billed time kept, on PostgreSQL's SQL."""
    from datetime import timedelta

    from gpulab.lifecycle import utcnow

    db = Database(postgres_url)
    jobs = JobRecords(db, "pg")
    ended, live = (jobs.create("ann", {"priority": 50}, None)["id"] for _ in range(2))
    jobs.transition(ended, JobState.INTERRUPTED, expect=JobState.QUEUED)
    later = utcnow() + timedelta(days=2)
    assert [j["id"] for j in jobs.delete_expired(later, 86400.0, 10)] == [ended]
    assert jobs.get(ended) is None and jobs.get(live) is not None
    notebooks = NotebookRecords(db, "pg")
    life = (NotebookState.STARTING, NotebookState.RUNNING)
    for _ in range(3):
        for state in (*life, NotebookState.STOPPING, NotebookState.STOPPED):
            notebooks.transition("ann", "nb", state)
    minutes = notebooks.billed_minutes("ann")
    # 12 events, the newest 2 kept: the cut ends on the third life's STARTING (not RUNNING)
    assert notebooks.prune_history(later, keep=2) == 9
    assert len(notebooks.get("ann", "nb")["history"]) == 3
    assert notebooks.billed_minutes("ann") == minutes


def test_compare_and_set_queue_cap_and_lease_hold_on_postgres(postgres_url):
    """What SQLite gets from its database-wide write lock, PostgreSQL gets from row locks
    and advisory locks: racing processes (one engine each) never both win."""
    import secrets

    from gpulab.jobs.supervisor.lease import SupervisorLease
    from gpulab.lifecycle import InvalidTransition

    instance = "pg" + secrets.token_hex(3)
    dbs = [Database(postgres_url) for _ in range(4)]
    records = [JobRecords(db, instance) for db in dbs]
    job = records[0].create("ann", {"priority": 50}, None)

    def place(i):  # the scheduler's QUEUED -> INITIALIZING, from 4 "services" at once
        try:
            records[i % 4].transition(job["id"], JobState.INITIALIZING, expect=JobState.QUEUED)
            return "won"
        except InvalidTransition:
            return "lost"

    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        outcomes = list(pool.map(place, range(12)))
    assert outcomes.count("won") == 1, outcomes
    assert [e["state"] for e in records[0].get(job["id"])["history"]] == ["QUEUED", "INITIALIZING"]

    def submit(i):
        try:
            records[i % 4].create("bea", {"priority": 50}, None, max_unfinished=3)
            return "created"
        except Exception as e:
            return type(e).__name__

    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        created = list(pool.map(submit, range(12)))
    assert created.count("created") == 3 and created.count("QueueFull") == 9, created

    leases = [
        SupervisorLease(db, f"{instance}/supervisor", 30, f"svc{i}") for i, db in enumerate(dbs)
    ]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        held = list(pool.map(lambda lease: lease.acquire().held, leases))
    assert held.count(True) == 1, held


@pytest.mark.docker
@pytest.mark.hub
def test_hub_and_service_on_postgres(hub_with, postgres_url):
    hub = hub_with(
        f'c.GpulabSettings.database_url = "{postgres_url}"\n'
        "c.GpulabSettings.supervisor_interval = 0.2\n",
        fresh=True,
    )
    token = hub.create_user("pat")
    hub.spawn("pat", "pg", {}, token=token)
    hub.wait_ready("pat", "pg")
    assert hub.wait_state("pat", "pg", "RUNNING")["options"]["framework"] == "python"
    api = f"{hub.url}/services/gpulab/api"
    headers = {"Authorization": f"token {token}"}
    r = requests.post(
        f"{api}/jobs",
        headers=headers,
        timeout=30,
        json={"command": ["echo", "on-postgres"], "resources": {"gpus": 0}},
    )
    assert r.status_code == 201, r.text
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        job = requests.get(f"{api}/jobs/{r.json()['id']}", headers=headers, timeout=30).json()
        if job["state"] == "DONE":
            break
        time.sleep(0.3)
    assert job["state"] == "DONE", job
    hub.stop_server("pat", "pg")
    assert hub.notebook("pat", "pg").json()["state"] == "STOPPED"


def test_backup_and_restore_on_postgres(postgres_url, postgres_server, tmp_path, monkeypatch):
    """`gpulab admin backup` dumps a PostgreSQL database with pg_dump, given the URL as libpq
    takes it (no SQLAlchemy driver; the password in PGPASSWORD, never on the command line),
    and restore loads the dump into an empty database with psql, refusing one with tables."""
    import secrets as stdlib_secrets
    from urllib.parse import unquote

    import psycopg

    from gpulab.admin import backup as b

    db = Database(postgres_url)
    jobs = JobRecords(db, "pg")
    job = jobs.create("alice", {"priority": 50}, None, ["team"])
    jobs.transition(job["id"], JobState.INITIALIZING, expect=JobState.QUEUED)
    GpuLedger(db, "pg", [GpuDevice("0")]).reserve(job["id"], "alice", "job", 1)
    db.engine.dispose()

    calls = []
    real_run = b.subprocess.run

    def spy(argv, env=None, **kw):
        calls.append((list(argv), {k: env[k] for k in ("PGPASSWORD",) if env and k in env}))
        return real_run(argv, env=env, **kw)

    monkeypatch.setattr(b.subprocess, "run", spy)
    manifest = b.backup(tmp_path / "bk", [b.Source("gpulab", postgres_url)], b.KeyPlace(), False)
    dump = [argv for argv, _ in calls if argv[0] == "pg_dump"]
    name = postgres_url.split("///")[1].split("?")[0]
    # libpq's URI, percent-encoded (libpq decodes it): no "+psycopg", the same database
    assert dump and unquote(dump[0][-1]) == f"postgresql:///{name}?host=/var/run/postgresql"
    assert manifest["databases"]["gpulab"]["kind"] == "postgresql"
    assert (tmp_path / "bk" / "gpulab.sql").read_text().count("CREATE TABLE") >= 5
    # a password goes to pg_dump's environment, not its arguments
    url, env = b.libpq("postgresql+psycopg://u:s3cret@db.example:5433/g")
    assert url == "postgresql://u@db.example:5433/g" and env == {"PGPASSWORD": "s3cret"}

    other = "gpulab_test_" + stdlib_secrets.token_hex(4)
    with psycopg.connect(f"dbname=postgres {postgres_server}", autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {other}")
    target = f"postgresql+psycopg:///{other}?host=/var/run/postgresql"
    try:
        with pytest.raises(b.BackupError, match="--gpulab-db"):
            b.restore(tmp_path / "bk", tmp_path / "data", {}, None)
        with pytest.raises(b.BackupError, match="holds tables"):
            b.restore(tmp_path / "bk", tmp_path / "data", {"gpulab": postgres_url}, None)
        done = b.restore(tmp_path / "bk", tmp_path / "data", {"gpulab": target}, None)
        assert any(line.startswith("gpulab database: ") for line in done), done
        back = Database(target)
        got = JobRecords(back, "pg").get(job["id"])
        assert got["state"] == "INITIALIZING" and [e["state"] for e in got["history"]] == [
            "QUEUED",
            "INITIALIZING",
        ]
        held = GpuLedger(back, "pg", [GpuDevice("0")]).held_by(job["id"])
        assert held == ["0"], held
        back.engine.dispose()
    finally:
        with psycopg.connect(f"dbname=postgres {postgres_server}", autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {other} WITH (FORCE)")
