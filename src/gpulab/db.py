"""gpulab's own tables (SQLAlchemy): notebooks and their history, and the GPU ledger.

The hub process (spawner) and the service process share this database. SQLite is the embedded
default: WAL mode and a busy timeout let both processes write; writers that must not race (GPU
reservations) take SQLite's write lock up front with BEGIN IMMEDIATE.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from sqlalchemy import (
    BigInteger,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    inspect,
    text,
)
from sqlalchemy.engine import Engine
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    Session,
    mapped_column,
    relationship,
    sessionmaker,
)
from sqlalchemy.types import TypeDecorator

from .lifecycle import utcnow


class UTCDateTime(TypeDecorator):
    """Store naive UTC, hand back aware UTC (SQLite keeps no time zone)."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect):
        return value.replace(tzinfo=None) if value is not None and value.tzinfo else value

    def process_result_value(self, value: datetime | None, dialect):
        from datetime import UTC

        return value.replace(tzinfo=UTC) if value is not None else None


class JSONText(TypeDecorator):
    impl = Text
    cache_ok = True

    def process_bind_param(self, value, dialect):
        return json.dumps(value) if value is not None else None

    def process_result_value(self, value, dialect):
        return json.loads(value) if value else None


class Base(DeclarativeBase):
    pass


class Notebook(Base):
    __tablename__ = "notebooks"
    __table_args__ = (UniqueConstraint("instance", "user", "server"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    instance: Mapped[str] = mapped_column(String(64))
    user: Mapped[str] = mapped_column(String(255), index=True)
    server: Mapped[str] = mapped_column(String(255))
    state: Mapped[str] = mapped_column(String(32))
    options: Mapped[dict | None] = mapped_column(JSONText, nullable=True)
    # the raw user_options, kept so that a restart can spawn the notebook as it was
    user_options: Mapped[dict | None] = mapped_column(JSONText, nullable=True)
    container: Mapped[str] = mapped_column(String(255), default="")
    # the cluster node it runs (or last ran) on ("" on one host): its volumes live there
    node: Mapped[str] = mapped_column(String(255), default="", server_default="")
    created: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    running_since: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # why the next stop happens, when someone other than the owner asks for it
    stop_reason: Mapped[str] = mapped_column(String(64), default="")
    stop_message: Mapped[str] = mapped_column(Text, default="")
    # an owner's "push now" not yet started, and the last live push (gpulab.live_push)
    push_requested: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    live_push: Mapped[dict | None] = mapped_column(JSONText, nullable=True)
    # billed time (microseconds) of the history that retention deleted (closed periods only:
    # gpulab.notebooks.records.prune_history), which its usage adds to what the kept history
    # bills (revision 0011)
    billed_pruned_us: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")

    events: Mapped[list[NotebookEvent]] = relationship(
        back_populates="notebook", order_by="NotebookEvent.id", cascade="all, delete-orphan"
    )


class NotebookEvent(Base):
    __tablename__ = "notebook_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    notebook_id: Mapped[int] = mapped_column(ForeignKey("notebooks.id"), index=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    state: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str] = mapped_column(String(64), default="")
    message: Mapped[str] = mapped_column(Text, default="")
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)

    notebook: Mapped[Notebook] = relationship(back_populates="events")


class GpuAllocation(Base):
    """One row per (device, share) held by a workload: the uniqueness is the ledger's guarantee."""

    __tablename__ = "gpu_allocations"
    __table_args__ = (UniqueConstraint("instance", "device", "share"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    instance: Mapped[str] = mapped_column(String(64))
    device: Mapped[str] = mapped_column(String(128))
    # 0 for a whole device; 1..n for fractions of a shared device
    share: Mapped[int] = mapped_column(Integer, default=0)
    workload: Mapped[str] = mapped_column(String(255), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    owner: Mapped[str] = mapped_column(String(255))
    since: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class DiskBooking(Base):
    """Bytes one workload's Docker volume holds on a node, against its owner's disk quota
    (gpulab/disk_ledger.py): one row per (volume, node), from before the pull until the
    volume is removed."""

    __tablename__ = "disk_bookings"
    __table_args__ = (UniqueConstraint("instance", "node", "volume"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    instance: Mapped[str] = mapped_column(String(64))
    owner: Mapped[str] = mapped_column(String(255), index=True)
    workload: Mapped[str] = mapped_column(String(255), index=True)
    volume: Mapped[str] = mapped_column(String(255))
    node: Mapped[str] = mapped_column(String(255), default="")
    # "pull" (a volume pulled from a store) or "git" (a clone; while it runs, its bound)
    kind: Mapped[str] = mapped_column(String(16), default="pull")
    bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    since: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class DatasetCopy(Base):
    """A node's copy of a read-only dataset in the dataset cache (gpulab/data/datasets.py),
    shared by the hub's notebooks and the service's jobs: one row per (node, volume) from the
    moment a process claims its pull until the volume is removed. ``state``: "pulling" (by
    ``holder``, whose claim lapses at ``lease_until`` unless renewed), "ready" (pulled
    complete and checked: trusted after any restart), "evicting" (``holder`` removes it).
    ``pins``: {workload: until (epoch seconds)}, the workloads handed the copy whose
    containers do not hold it yet (renewed by their process until they do). Every write is a
    compare-and-set on the state (and ``version``) it read."""

    __tablename__ = "dataset_copies"
    __table_args__ = (UniqueConstraint("instance", "node", "volume"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    instance: Mapped[str] = mapped_column(String(64))
    node: Mapped[str] = mapped_column(String(255), default="")
    volume: Mapped[str] = mapped_column(String(255))
    bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    state: Mapped[str] = mapped_column(String(16))
    holder: Mapped[str] = mapped_column(String(255), default="")
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    pins: Mapped[dict | None] = mapped_column(JSONText, nullable=True)
    last_used: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    version: Mapped[int] = mapped_column(Integer, default=1)


def make_engine(url: str, upgrade: bool = False) -> Engine:
    """An engine on ``url`` whose schema is this gpulab's (:func:`prepare_schema`)."""
    engine = connect(url)
    prepare_schema(engine, upgrade=upgrade)
    return engine


def upgrade_database(url: str) -> tuple[str | None, str]:
    """Run the revisions ``url``'s database lacks (``gpulab admin upgrade-db``): the revision
    it was at, and the one it is at now."""
    engine = connect(url)
    try:
        return prepare_schema(engine, upgrade=True)
    finally:
        engine.dispose()


#: bytes SQLite's write-ahead log is cut back to once a checkpoint has copied it into the
#: database (``PRAGMA journal_size_limit``). SQLite checkpoints by itself every 1000 pages
#: (4 MiB) but only resets the log where no reader still needs it, and never shrinks the file
#: without this: a burst of writes beside a long read (a backup, a big report) left a log as
#: large as the burst on disk for good.
WAL_SIZE_LIMIT = 16 * 1024 * 1024
#: the most a checkpoint of :meth:`Database.checkpoint` waits for the reads that still use
#: the log (milliseconds; it holds the write lock meanwhile): past it, it gives up until the
#: next one
CHECKPOINT_WAIT_MS = 20


def connect(url: str) -> Engine:
    """An engine on ``url``, SQLite's pragmas and write lock set, the schema left as it is."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):
            # let pysqlite leave transaction control to us (BEGIN IMMEDIATE below)
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute(f"PRAGMA journal_size_limit={int(WAL_SIZE_LIMIT)}")
            cur.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn):
            # writers take the write lock up front (no upgrade deadlocks); readers do not:
            # in WAL mode they read a snapshot beside the writer instead of queueing for it
            if conn.get_execution_options().get("gpulab_read_only"):
                conn.exec_driver_sql("BEGIN")
            else:
                conn.exec_driver_sql("BEGIN IMMEDIATE")

    else:
        engine = create_engine(url, pool_pre_ping=True)
    return engine


# --- the schema's revision (Alembic; src/gpulab/migrations) -----------------------------------

#: the revisions' directory (each one a frozen step; see gpulab/migrations/__init__.py)
MIGRATIONS = Path(__file__).parent / "migrations"
#: the revision of the first release's schema, which a database made before revisions has
FIRST_REVISION = "0001"
#: the key of the advisory lock that keeps two processes from preparing the schema at once
_SCHEMA_LOCK = 0x6770756C6162  # "gpulab"


class SchemaMismatch(RuntimeError):
    """The database's schema is not this gpulab's: older (run ``gpulab admin upgrade-db``
    after a backup) or newer (made by a later gpulab). The message says which and what to do."""


def _scripts():
    from alembic.script import ScriptDirectory

    return ScriptDirectory(str(MIGRATIONS))


def head_revision() -> str:
    """The newest revision: the schema the models declare."""
    return _scripts().get_current_head()


def _complete(conn, metadata) -> bool:
    have = inspect(conn)
    for table in metadata.sorted_tables:
        if not have.has_table(table.name):
            return False
        present = {c["name"] for c in have.get_columns(table.name)}
        if any(c.name not in present for c in table.columns):
            return False
    return True


def _first_schema():
    """Revision 0001's own tables (its frozen copy), to recognise a database made before
    revisions."""
    import importlib.util

    path = MIGRATIONS / "versions" / "0001_gpulab_0_1_0.py"
    spec = importlib.util.spec_from_file_location("gpulab_revision_0001", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.tables()


def _known(scripts, revision: str) -> bool:
    from alembic.util import CommandError

    try:
        return scripts.get_revision(revision) is not None
    except CommandError:
        return False


def prepare_schema(engine: Engine, upgrade: bool = False) -> tuple[str | None, str]:
    """Make the database's schema this gpulab's, as JupyterHub does with its own: a database
    without gpulab's tables is made from the models and stamped with the newest revision; one
    that gpulab 0.1.0 made (no revision yet, every table and column of revision 0001) is
    stamped 0001; one at an older revision is upgraded only when ``upgrade`` says so (``gpulab
    admin upgrade-db``), else refused with :class:`SchemaMismatch`, like one made by a newer
    gpulab. One process at a time: SQLite's write lock, PostgreSQL's advisory lock (the hub
    and the service start together). Returns (the revision found, the revision now)."""
    from alembic.config import Config
    from alembic.runtime.environment import EnvironmentContext
    from alembic.runtime.migration import MigrationContext

    scripts = _scripts()
    head = scripts.get_current_head()
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _SCHEMA_LOCK})
        found = MigrationContext.configure(conn).get_current_revision()
        if found is None:
            ours = set(inspect(conn).get_table_names()) & set(Base.metadata.tables)
            if not ours:
                Base.metadata.create_all(conn)
                MigrationContext.configure(conn).stamp(scripts, head)
                return None, head
            if _complete(conn, _first_schema()):  # made by gpulab 0.1.0, before revisions
                MigrationContext.configure(conn).stamp(scripts, FIRST_REVISION)
                found = FIRST_REVISION
                if head == FIRST_REVISION:
                    return None, head
        if found == head:
            return found, head
        if found is not None and not _known(scripts, found):
            raise SchemaMismatch(
                f"gpulab's database {shown_url(str(engine.url))} is at schema revision "
                f"{found}, which this gpulab (revision {head}) does not know: a newer gpulab "
                "made it. Run that gpulab, or restore the backup taken before its upgrade"
            )
        if not upgrade:
            raise SchemaMismatch(
                f"gpulab's database {shown_url(str(engine.url))} is at schema revision "
                f"{found or 'none (older than gpulab 0.1.0)'}, this gpulab needs {head}: back it "
                "up (gpulab admin backup DEST), then run `gpulab admin upgrade-db` "
                "(docs/upgrading.md)"
            )

        def steps(rev, _context):
            return scripts._upgrade_revs(head, rev)

        with EnvironmentContext(Config(), scripts, fn=steps, destination_rev=head) as env:
            env.configure(connection=conn, target_metadata=Base.metadata)
            env.run_migrations()
        return found, head


def schema_revision(url: str) -> str | None:
    """The revision ``url``'s database is at, read without changing anything (None: none)."""
    from alembic.runtime.migration import MigrationContext

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


#: one lock per SQLite database file in this process, in front of SQLite's own write lock
_WRITE_LOCKS: dict[str, threading.RLock] = {}
_WRITE_LOCKS_GUARD = threading.Lock()


def _write_lock(url: str) -> threading.RLock:
    with _WRITE_LOCKS_GUARD:
        return _WRITE_LOCKS.setdefault(url, threading.RLock())


class Database:
    """A session factory; each unit of work is one short transaction.

    On SQLite, this process's writers queue on a lock of its own before they ask for the
    database's write lock: SQLite's busy handler makes a writer that finds the lock taken
    sleep (1, 2, 5 ... 100 ms) instead of waking it when the lock is free, which under many
    writers stretched a write's p99 to 3 or 4 times what the queue gives
    (``bench/bench_db_writes.py``). Writers of other processes (the hub's) still meet at
    SQLite's lock, as before."""

    def __init__(self, url: str, upgrade: bool = False):
        self.engine = make_engine(url, upgrade=upgrade)
        self._writing = (
            _write_lock(str(self.engine.url)) if self.engine.dialect.name == "sqlite" else None
        )
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        read_options: dict = {"gpulab_read_only": True}
        if self.engine.dialect.name == "postgresql":  # one snapshot for the whole read
            read_options["isolation_level"] = "REPEATABLE READ"
        self._readers = sessionmaker(
            self.engine.execution_options(**read_options), expire_on_commit=False
        )

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A unit of work that may write (on SQLite it holds the write lock throughout)."""
        if self._writing is None:
            with self._sessions() as s, s.begin():
                yield s
            return
        with self._writing, self._sessions() as s, s.begin():
            yield s

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A unit of work that only reads: one consistent snapshot, taken without the write
        lock (API reads no longer queue behind one another and the supervisor's writes)."""
        with self._readers() as s, s.begin():
            yield s

    def wal_bytes(self) -> int:
        """The size of SQLite's write-ahead log file (0: none, or not SQLite)."""
        if self._writing is None or not self.engine.url.database:
            return 0
        try:
            return Path(self.engine.url.database + "-wal").stat().st_size
        except OSError:
            return 0

    def checkpoint(self) -> tuple[int, int, float] | None:
        """Copy SQLite's write-ahead log into the database and cut the file to nothing:
        SQLite's own checkpoints (every 4 MiB of writes) copy what no read still needs but
        start the log over only at a moment when no read uses it, which reads without pause
        (API clients, pages) never leave: under a steady load beside them the file grew past
        ``WAL_SIZE_LIMIT`` by every write (``bench/bench_storage.py``). First a passive
        checkpoint, beside the writers, copies what it can; then, holding the write lock
        (this process's and SQLite's), ``PRAGMA wal_checkpoint(TRUNCATE)`` copies the rest
        and cuts the file, waiting at most :data:`CHECKPOINT_WAIT_MS` for the reads still on
        the log (each a page's read) and giving up rather than wait longer. (busy: 1 when it
        gave up, pages in the log, seconds the write lock was held); None on PostgreSQL."""
        if self._writing is None:
            return None
        with self.engine.connect() as conn:
            raw = conn.connection.driver_connection
            raw.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            (was,) = raw.execute("PRAGMA busy_timeout").fetchone()  # the connection's own
            raw.execute(f"PRAGMA busy_timeout={CHECKPOINT_WAIT_MS}")
            try:
                with self._writing:
                    start = time.perf_counter()
                    busy, pages, _ = raw.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                    held = time.perf_counter() - start
            finally:
                raw.execute(f"PRAGMA busy_timeout={int(was)}")
        return busy, pages, held

    @staticmethod
    def serialize(s: Session, *key: str) -> None:
        """Make the rest of this transaction exclusive among those that serialize on ``key``
        (a check followed by an insert, e.g. a user's queue cap or GPU quota).

        SQLite needs nothing: every transaction already holds the write lock (BEGIN
        IMMEDIATE). PostgreSQL takes a transaction-scoped advisory lock on a 64-bit hash of
        the key, released at commit or rollback.
        """
        if s.get_bind().dialect.name != "postgresql":
            return
        digest = hashlib.blake2b("\x00".join(key).encode(), digest_size=8).digest()
        s.execute(
            text("SELECT pg_advisory_xact_lock(:k)"),
            {"k": int.from_bytes(digest, "big", signed=True)},
        )


class Job(Base):
    """A training job: its submission (spec), where it is in its life, and what it holds."""

    __tablename__ = "jobs"
    # what the pages and lists read, each a walk of one index that stops at the page's end
    # or counts without the rows (revision 0010): the newest jobs (everyone's, a user's), a
    # user's jobs by state (their counts, the admin's page of users), everyone's counts by
    # state and the live jobs; and retention's pick of the jobs that ended longest ago
    # (revision 0011)
    __table_args__ = (
        Index("ix_jobs_instance_updated", "instance", "updated"),
        Index("ix_jobs_instance_submitted", "instance", "submitted", "id"),
        Index("ix_jobs_instance_owner_submitted", "instance", "owner", "submitted", "id"),
        Index("ix_jobs_instance_owner_state", "instance", "owner", "state", "kind"),
        Index("ix_jobs_instance_state", "instance", "state", "kind"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    instance: Mapped[str] = mapped_column(String(64), index=True)
    owner: Mapped[str] = mapped_column(String(255), index=True)
    name: Mapped[str] = mapped_column(String(63))
    spec: Mapped[dict] = mapped_column(JSONText)
    state: Mapped[str] = mapped_column(String(32), index=True)
    priority: Mapped[int] = mapped_column(Integer, default=50)
    submitted: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # the current run: when it entered RUNNING (for the time-out), its container and devices
    running_since: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    container: Mapped[str] = mapped_column(String(255), default="")
    devices: Mapped[str] = mapped_column(String(255), default="")
    # the cluster node it was placed on ("" on one host): its volumes live there
    node: Mapped[str] = mapped_column(String(255), default="", server_default="")
    over_quota: Mapped[int] = mapped_column(Integer, default=0)
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    hang_restarts: Mapped[int] = mapped_column(Integer, default=0)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    reason: Mapped[str] = mapped_column(String(64), default="")
    message: Mapped[str] = mapped_column(Text, default="")
    # what the user (or the scheduler) asked for next: "", "interrupt" or "preempt"
    request: Mapped[str] = mapped_column(String(32), default="")
    # in FINALIZING and SYNC_FAILED: the state the job ends in once its output is pushed
    outcome: Mapped[str] = mapped_column(String(32), default="", server_default="")
    groups: Mapped[str] = mapped_column(Text, default="")  # the owner's groups at submission
    # billed minutes already added to its owner's monthly totals (BilledMonth): the
    # commenced minutes of its closed billed periods (gpulab.billing.settled_minutes)
    settled_minutes: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # when the retention sweep deletes it, for an ended job that set its own
    # auto_delete_after (None: the site's job_retention from its end, or kept)
    delete_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True, index=True)
    # "job"; "array": a sweep, whose state is derived from its tasks' (it runs nothing itself);
    # "task": one of an array's, ``parent`` its array and ``task_index`` its index
    kind: Mapped[str] = mapped_column(String(8), default="job", server_default="job")
    parent: Mapped[str] = mapped_column(String(32), default="", server_default="", index=True)
    task_index: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # an owner's "push now" not yet started, and the last live push of its rw/rwd volumes
    # while it ran: {"running", "trigger", "started", "at", "ok", "message", "files", "bytes"}
    push_requested: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    live_push: Mapped[dict | None] = mapped_column(JSONText, nullable=True)

    events: Mapped[list[JobEvent]] = relationship(
        back_populates="job", order_by="JobEvent.id", cascade="all, delete-orphan"
    )


class BilledMonth(Base):
    """A user's billed job minutes settled in one month (UTC), kept apart from the job
    records so that deleting records (retention, a user's delete) never changes what was
    billed: each row grows in the same transaction as a job's billed period closes
    (gpulab.jobs.records; the rule is gpulab.billing's)."""

    __tablename__ = "billed_months"
    # a month's report pages through its users by name (revision 0010)
    __table_args__ = (
        UniqueConstraint("instance", "owner", "month"),
        Index("ix_billed_months_instance_month", "instance", "month", "owner"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    instance: Mapped[str] = mapped_column(String(64))
    owner: Mapped[str] = mapped_column(String(255), index=True)
    month: Mapped[str] = mapped_column(String(7))  # "2026-11"
    # minutes billed (per commenced minute of each job's running time), and those times
    # every worker's GPUs
    minutes: Mapped[int] = mapped_column(BigInteger, default=0)
    gpu_minutes: Mapped[int] = mapped_column(BigInteger, default=0)


class Lease(Base):
    """Who may act on this instance's jobs: one supervisor at a time (see jobs/lease.py)."""

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    holder: Mapped[str] = mapped_column(String(255))
    expires: Mapped[datetime] = mapped_column(UTCDateTime)
    # bumped at each take-over: a holder can tell that the lease changed hands meanwhile
    term: Mapped[int] = mapped_column(Integer, default=1)


class GpuWait(Base):
    """A notebook waiting for GPUs in the queue it shares with jobs (gpus/waits.py): the job
    supervisor plans it with the queued jobs, books its GPUs in the ledger when its turn
    comes and marks it ``granted``; its spawn, which polls the row, then goes on. ``place``
    and ``message`` are what the supervisor last said of its place in line."""

    __tablename__ = "gpu_waits"

    instance: Mapped[str] = mapped_column(String(64), primary_key=True)
    workload: Mapped[str] = mapped_column(String(255), primary_key=True)
    owner: Mapped[str] = mapped_column(String(255), index=True)
    groups: Mapped[str] = mapped_column(Text, default="[]")
    gpus: Mapped[int] = mapped_column(Integer)
    since: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    until: Mapped[datetime] = mapped_column(UTCDateTime)
    granted: Mapped[int] = mapped_column(Integer, default=0)
    place: Mapped[int] = mapped_column(Integer, default=0)
    message: Mapped[str] = mapped_column(Text, default="")
    #: the GPU model and node pool it waits for ("" for any)
    gpu_model: Mapped[str] = mapped_column(String(64), default="", server_default="")
    node_pool: Mapped[str] = mapped_column(String(64), default="", server_default="")


class FairShareUsage(Base):
    """A user's recent GPU use, for the fair share (gpulab.fairshare): GPU-seconds decayed
    with the half-life as of ``as_of`` (read later, they decay further), and the groups the
    user was last seen in (a JSON list)."""

    __tablename__ = "fair_share_usage"

    instance: Mapped[str] = mapped_column(String(64), primary_key=True)
    user: Mapped[str] = mapped_column(String(255), primary_key=True)
    gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    as_of: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    groups: Mapped[str] = mapped_column(Text, default="[]")


class JobEvent(Base):
    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # "transition", or "fault-recovery" for a hang restart (the state does not change)
    kind: Mapped[str] = mapped_column(String(32), default="transition")
    state: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str] = mapped_column(String(64), default="")
    message: Mapped[str] = mapped_column(Text, default="")
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)

    job: Mapped[Job] = relationship(back_populates="events")


class UserSecret(Base):
    """A user's named secret, as a Fernet token (gpulab/secrets.py): never in clear."""

    __tablename__ = "user_secrets"
    __table_args__ = (UniqueConstraint("instance", "owner", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    instance: Mapped[str] = mapped_column(String(64))
    owner: Mapped[str] = mapped_column(String(255), index=True)
    name: Mapped[str] = mapped_column(String(64))
    token: Mapped[str] = mapped_column(Text)
    created: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


# --- what `gpulab doctor` reads of a database --------------------------------------------------


def expected_schema() -> dict[str, frozenset[str]]:
    """The tables this gpulab declares, each with its columns."""
    return {t.name: frozenset(c.name for c in t.columns) for t in Base.metadata.sorted_tables}


def read_schema(url: str) -> dict[str, frozenset[str]] | None:
    """The tables ``url``'s database has, each with its columns, read without changing
    anything (no table made, no revision applied: :func:`make_engine` does that at start-up);
    None for a SQLite file that does not exist yet. Raises when the database does not answer."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        path = parsed.database or ""
        on_disk = path and path != ":memory:" and not path.startswith("file:")
        if on_disk and not Path(path).exists():
            return None
    engine = create_engine(url)
    try:
        have = inspect(engine)
        return {
            name: frozenset(c["name"] for c in have.get_columns(name))
            for name in have.get_table_names()
        }
    finally:
        engine.dispose()


def shown_url(url: str) -> str:
    """``url`` with its password hidden, to print."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "(an unreadable database URL)"
