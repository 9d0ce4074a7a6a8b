"""Storage stays bounded (issue #32 item 3), three measurements in one run on SQLite:

    .venv/bin/python bench/bench_storage.py [--jobs 100000] [--round 10] [--rounds 2]
        [--wal-seconds 60] [--short-jobs 10000] [--only delay,wal,short]

delay: a database seeded with ``--jobs`` ended jobs, all past the site's retention
    (bench/scale_seed.py: through the record layer, each with its history, events and saved
    log); a thread submits jobs through ``JobRecords.create`` (what POST /api/jobs writes) at
    20 a second, each timed; rounds of ``--round`` seconds take turns: no sweep, the service's
    real ``sweep`` (batches of 100, 0.1 s pause) with the pick before revision 0011 (a copy of
    it below: the pick inside the write transaction), and with today's. Each batch's hold of
    the write lock is timed too.
wal: ``--wal-seconds`` of steady writes (20 submissions a second, each job taken through its
    life to DONE by a second thread, the sweep every second with a 5 s retention) beside 4
    threads reading pages of jobs without pause; the WAL file's size sampled every 20 ms.
short: ``--short-jobs`` jobs through the real JobSupervisor on the fake engine
    (tests/support/fake_runtime.py: each container "runs" at once and exits 0), each job's
    log 100 lines of training output (7,400 bytes, saved at its end as the real service
    saves it); once with ``job_retention`` 30 s (the sweep every 5 s), once with None (kept).
    Reports the database (+WAL), the log directory and the rows of each table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import types
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from scale_seed import SPEC, seed_jobs  # noqa: E402

from gpulab.db import WAL_SIZE_LIMIT, Database, Job, JobEvent  # noqa: E402
from gpulab.jobs import records as records_module  # noqa: E402
from gpulab.jobs.records import JobRecords  # noqa: E402
from gpulab.lifecycle import JobState as J  # noqa: E402
from gpulab.service.tasks import checkpoint  # noqa: E402
from gpulab.service.tasks import retention as task  # noqa: E402

INSTANCE = "bench"
SUBMIT_RATE = 20.0
LOG_LINE = "epoch {e:3d}/100 step {s:6d} loss {l:.6f} acc {a:.4f} lr 1.0e-04 time 0.{t:03d}s\n"
JOB_LOG = "".join(
    LOG_LINE.format(e=i, s=i * 120, l=1 / (i + 1), a=1 - 1 / (i + 2), t=i) for i in range(100)
).encode()


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[max(0, min(len(values) - 1, round(p / 100 * (len(values) - 1))))]


def old_delete_expired(self, now, default, limit):
    """The pick before revision 0011 (gpulab 27d4ce5): inside the write transaction, ordered
    by ``updated`` with an OR on ``delete_at``, rows locked; kept here to compare."""
    from sqlalchemy import delete, or_, select

    due = [Job.delete_at <= now]
    if default is not None:
        due.append(Job.delete_at.is_(None) & (Job.updated <= now - timedelta(seconds=default)))
    with self.db.session() as s:
        rows = s.execute(
            select(Job.id, Job.node, Job.spec, Job.owner, Job.container, Job.kind)
            .where(
                Job.instance == self.instance,
                Job.state.in_(records_module._RETAINED_VALUES),
                Job.kind != "task",
                or_(*due),
            )
            .order_by(Job.updated)
            .limit(limit)
            .with_for_update()
        ).all()
        rows = self._with_tasks_retained(s, rows)
        if not rows:
            return []
        ids = [r.id for r in rows]
        s.execute(delete(JobEvent).where(JobEvent.job_id.in_(ids)))
        s.execute(delete(Job).where(Job.id.in_(ids)))
    return [{"id": r.id, "node": r.node or "", "spec": r.spec, "owner": r.owner} for r in rows]


def timed_writes(db: Database, holds: list[float]) -> None:
    """Time each write transaction (the write lock's hold on SQLite) of every thread but
    the main one (the submitter's): the sweep's."""
    real = db.session
    main = threading.main_thread()

    @contextlib.contextmanager
    def session():
        if threading.current_thread() is main:
            with real() as s:
                yield s
            return
        with real() as s:
            t = time.perf_counter()
            yield s
        holds.append(time.perf_counter() - t)

    db.session = session


def run_sweeps(records: JobRecords, logs: Path, retention: float, stop: threading.Event) -> None:
    """The service's sweep, again and again until ``stop`` (on a loop of this thread)."""
    settings = SimpleNamespace(job_retention=retention, job_retention_batch=100)
    sup = SimpleNamespace(records=records, saved_logs=lambda i: [logs / f"{i}.log"])

    async def sweeps():
        while True:
            await task.sweep(settings, sup)
            await asyncio.sleep(0.1)

    async def main():  # a sweep of 100,000 jobs takes minutes: stopped where it is
        sweeping = asyncio.create_task(sweeps())
        while not stop.is_set():
            await asyncio.sleep(0.05)
        sweeping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sweeping

    asyncio.run(main())


def submitter(records: JobRecords, seconds: float, out: list[float], ids: list[str] | None = None):
    """Submit at SUBMIT_RATE for ``seconds``, each submission's time in ``out``."""
    start = time.perf_counter()
    n = 0
    while (now := time.perf_counter()) - start < seconds:
        due = start + n / SUBMIT_RATE
        if now < due:
            time.sleep(due - now)
        t = time.perf_counter()
        job = records.create(f"u{n % 50:04d}", SPEC, None)
        out.append(time.perf_counter() - t)
        if ids is not None:
            ids.append(job["id"])
        n += 1


def bench_delay(args, tmp: Path) -> None:
    db_file, logs = tmp / "delay.sqlite", tmp / "delay-logs"
    template = tmp / "delay-seeded.sqlite"
    t = time.perf_counter()
    db = Database(f"sqlite:///{db_file}")
    seed_jobs(db, INSTANCE, logs, args.jobs, 1000)
    db.checkpoint()
    db.engine.dispose()
    shutil.copy(db_file, template)
    print(
        f"\n## delay: seeded {args.jobs} ended jobs in {time.perf_counter() - t:.0f} s: "
        f"{template.stat().st_size / 2**20:.0f} MiB of database; each round with a sweep "
        f"starts from a copy of it"
    )
    lat: dict[str, list[float]] = {"none": [], "before": [], "now": []}
    holds: dict[str, list[float]] = {"before": [], "now": []}
    deleted: dict[str, int] = {"before": 0, "now": 0}
    for _ in range(args.rounds):
        for mode in ("none", "before", "now"):
            if mode != "none":  # a fresh copy of the expired jobs
                for suffix in ("", "-wal", "-shm"):
                    Path(f"{db_file}{suffix}").unlink(missing_ok=True)
                shutil.copy(template, db_file)
            db = Database(f"sqlite:///{db_file}")
            records = JobRecords(db, INSTANCE)
            stop = threading.Event()
            sweeper = None
            before_rows = None
            if mode != "none":
                with db.read() as s:
                    before_rows = s.query(Job).count()
                if mode == "before":
                    records.delete_expired = types.MethodType(old_delete_expired, records)
                sweeper = threading.Thread(target=run_sweeps, args=(records, logs, 60.0, stop))
                timed_writes(db, holds[mode])
                sweeper.start()
                time.sleep(0.5)  # its first batch under way
            already = len(lat[mode])
            submitter(records, args.round, lat[mode])
            stop.set()
            if sweeper is not None:
                sweeper.join()
                db.__dict__.pop("session", None)
                with db.read() as s:
                    after_rows = s.query(Job).count()
                deleted[mode] += before_rows - after_rows + len(lat[mode]) - already
            db.engine.dispose()
    print(
        "| sweep | submissions | p50 ms | p99 ms | max ms | max - max without | "
        "write lock per batch p50 / max ms | jobs deleted |"
    )
    base = max(lat["none"])
    for mode, name in (("none", "none"), ("before", "pick in the write tx"), ("now", "read pick")):
        v = lat[mode]
        hold = (
            f"{pct(holds[mode], 50) * 1000:.1f} / {max(holds[mode]) * 1000:.1f}"
            if mode != "none" and holds[mode]
            else "-"
        )
        print(
            f"| {name} | {len(v)} | {pct(v, 50) * 1000:.1f} | {pct(v, 99) * 1000:.1f} | "
            f"{max(v) * 1000:.1f} | {(max(v) - base) * 1000:+.1f} | {hold} | "
            f"{deleted.get(mode, '-')} |"
        )
    for mode in ("before", "now"):
        print(
            f"ratio p99 {mode}/none: {pct(lat[mode], 99) / pct(lat['none'], 99):.2f}x, "
            f"max {max(lat[mode]) / base:.2f}x"
        )


def wal_size(db_file: Path) -> int:
    try:
        return (db_file.parent / (db_file.name + "-wal")).stat().st_size
    except FileNotFoundError:
        return 0


def walk_life(records: JobRecords, ids: list[str], stop: threading.Event) -> None:
    """Take each submitted job through its life to DONE (6 transactions, as the supervisor)."""
    path = [J.INITIALIZING, J.PENDING, J.RUNNING, J.FINALIZING, J.DONE]
    done = 0
    while not stop.is_set() or done < len(ids):
        if done >= len(ids):
            time.sleep(0.01)
            continue
        state = J.QUEUED
        for new in path:
            records.transition(ids[done], new, expect=state)
            state = new
        done += 1


def wal_round(args, tmp: Path, checkpoints: bool) -> dict:
    db_file, logs = tmp / f"wal-{checkpoints}.sqlite", tmp / f"wal-{checkpoints}-logs"
    db = Database(f"sqlite:///{db_file}")
    seed_jobs(db, INSTANCE, logs, 2_000, 100)
    db.checkpoint()
    records = JobRecords(db, INSTANCE)
    stop = threading.Event()
    ids: list[str] = []
    sizes: list[int] = []
    reads = [0]
    held: list[float] = []
    gave_up = [0]

    def reader():
        while not stop.is_set():
            records.page(None, None, None, 20, 0, newest_first=True, with_total=False)
            reads[0] += 1

    def sampler():
        while not stop.is_set():
            sizes.append(wal_size(db_file))
            time.sleep(0.02)

    def checkpointer():  # the service's checkpoint_loop, its pass timed
        while not stop.wait(checkpoint.INTERVAL):
            answer = asyncio.run(checkpoint.checkpoint_once(db))
            if answer is not None:
                held.append(answer[2])
                gave_up[0] += answer[0]

    threads = [
        threading.Thread(target=walk_life, args=(records, ids, stop)),
        threading.Thread(target=run_sweeps, args=(records, logs, 5.0, stop)),
        threading.Thread(target=sampler),
        *(threading.Thread(target=reader) for _ in range(4)),
        *([threading.Thread(target=checkpointer)] if checkpoints else []),
    ]
    for th in threads:
        th.start()
    lat: list[float] = []
    submitter(records, args.wal_seconds, lat, ids)
    stop.set()
    for th in threads:
        th.join()
    with db.read() as s:
        jobs = s.query(Job).count()
    return {
        "lat": lat,
        "sizes": sizes,
        "reads": reads[0],
        "jobs": jobs,
        "end": wal_size(db_file),
        "held": held,
        "gave_up": gave_up[0],
    }


def bench_wal(args, tmp: Path) -> None:
    out = {cp: wal_round(args, tmp, cp) for cp in (False, True)}
    mib = 1024 * 1024
    print(
        f"\n## wal: {args.wal_seconds:.0f} s a round: 20 submissions/s, each run to DONE (6 "
        f"writes), the sweep (retention 5 s) deleting them and 2,000 seeded jobs, 4 threads "
        f"reading pages without pause; WAL_SIZE_LIMIT {WAL_SIZE_LIMIT / mib:.0f} MiB"
    )
    print(
        "| service checkpoints | jobs | page reads | WAL max MiB | WAL median MiB | WAL at the "
        "end MiB | submission p99 / max ms | checkpoints: n, write lock max ms, gave up |"
    )
    for cp, r in out.items():
        held = f"{len(r['held'])}, {max(r['held'], default=0) * 1000:.1f}, {r['gave_up']}"
        print(
            f"| {'on' if cp else 'off'} | {len(r['lat'])} | {r['reads']} | "
            f"{max(r['sizes']) / mib:.2f} | {statistics.median(r['sizes']) / mib:.2f} | "
            f"{r['end'] / mib:.2f} | {pct(r['lat'], 99) * 1000:.1f} / "
            f"{max(r['lat']) * 1000:.1f} | {held if cp else '-'} |"
        )


def table_rows(db: Database) -> dict[str, int]:
    from sqlalchemy import text

    with db.engine.connect() as c:
        names = [
            r[0]
            for r in c.exec_driver_sql("SELECT name FROM sqlite_master WHERE type='table'")
            if r[0] != "alembic_version"
        ]
        return {n: c.execute(text(f"SELECT count(*) FROM {n}")).scalar() for n in names}


async def short_round(n: int, retention: float | None, tmp: Path) -> dict:
    from gpulab.jobs.supervisor.supervisor import JobSupervisor
    from gpulab.settings import GpulabSettings
    from tests.support.fake_runtime import FakeRuntime

    class Engine(FakeRuntime):
        """Each container writes its log and exits 0 as soon as it starts."""

        announcing = True

        def _start(self, w):
            w.logs = JOB_LOG
            self._pending_exits[w.name] = (0, False)
            super()._start(w)

        async def remove(self, name: str) -> bool:
            w = self.workloads.pop(name, None)
            return w is not None

    settings = GpulabSettings(
        instance=INSTANCE,
        discover_gpus=False,
        supervisor_interval=0.05,
        job_container_retention=0.0,
        job_retention=retention,
        job_retention_interval=5.0,
    )
    db_file = tmp / f"short-{retention}.sqlite"
    db = Database(f"sqlite:///{db_file}")
    rt = Engine(images={SPEC["image"]})
    logs = tmp / f"short-{retention}-logs"
    sv = JobSupervisor(settings, db, rt, logs, holder="bench")
    await sv.start()
    loop_task = asyncio.create_task(task.retention_loop(settings, sv))
    records = sv.records
    spec = {**SPEC, "resources": {"gpus": 0, "cpus": 0.1, "memory": 64 * 1024 * 1024}}
    t0 = time.perf_counter()
    submitted = 0
    ended = 0
    while ended < n:
        counts = await asyncio.to_thread(records.counts)
        live = sum(v for k, v in counts.items() if k not in ("DONE", "FAILED", "ERROR"))
        ended = submitted - live  # the ended ones retention deleted included
        if submitted < n and live < 64:
            for _ in range(min(64 - live, n - submitted)):
                await asyncio.to_thread(records.create, f"u{submitted % 50:04d}", spec, None)
                submitted += 1
        await asyncio.sleep(0.1)
    wall = time.perf_counter() - t0
    loop_task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await loop_task
    await sv.stop()
    states = await asyncio.to_thread(records.counts)
    rows = table_rows(db)
    with db.engine.connect() as c:
        free = c.exec_driver_sql("PRAGMA freelist_count").scalar()
        page = c.exec_driver_sql("PRAGMA page_size").scalar()
    out = {"db": db_file.stat().st_size, "wal": wal_size(db_file)}  # before the last close
    db.engine.dispose()
    files = list(logs.iterdir()) if logs.exists() else []
    return {
        **out,
        "wall": wall,
        "states": states,
        "free": free * page,
        "logs": sum(f.stat().st_size for f in files),
        "logs_disk": sum(f.stat().st_blocks * 512 for f in files),
        "log_files": len(files),
        "rows": rows,
    }


def bench_short(args, tmp: Path) -> None:
    print(
        f"\n## short: {args.short_jobs} jobs through the supervisor on the fake engine, each "
        f"log {len(JOB_LOG)} bytes"
    )
    out = {}
    kept = args.short_retention
    for retention in (kept, None):
        out[retention] = asyncio.run(short_round(args.short_jobs, retention, tmp))
    kib = 1024
    print(f"| | job_retention {kept:.0f} s | None (kept) | ratio kept / retained |")
    print("| --- | --- | --- | --- |")
    a, b = out[kept], out[None]
    print(f"| wall | {a['wall']:.0f} s | {b['wall']:.0f} s | |")
    for key in ("db", "free", "wal", "logs", "logs_disk"):
        ratio = b[key] / a[key] if a[key] else float("nan")
        print(f"| {key} | {a[key] / kib:,.0f} KiB | {b[key] / kib:,.0f} KiB | {ratio:.1f}x |")
    print(f"| log files | {a['log_files']} | {b['log_files']} | |")
    for table in sorted(b["rows"]):
        print(f"| rows {table} | {a['rows'].get(table)} | {b['rows'][table]} | |")
    print(f"states: retained {a['states']}, kept {b['states']}")
    print("(db: the file; free: its pages free for reuse; logs_disk: the blocks they take)")
    n = args.short_jobs
    print(
        f"kept: {(b['db'] + b['wal']) / n:,.0f} bytes of database and "
        f"{b['logs'] / n:,.0f} bytes of log per job"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--round", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--wal-seconds", type=float, default=60.0)
    ap.add_argument("--short-jobs", type=int, default=10_000)
    ap.add_argument("--short-retention", type=float, default=30.0, help="seconds")
    ap.add_argument("--only", default="delay,wal,short")
    args = ap.parse_args()
    only = set(args.only.split(","))
    os.system("uptime")
    tmp = Path(tempfile.mkdtemp(prefix="gpulab-bench-storage-"))
    try:
        if "delay" in only:
            bench_delay(args, tmp)
        if "wal" in only:
            bench_wal(args, tmp)
        if "short" in only:
            bench_short(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    os.system("uptime")


if __name__ == "__main__":
    main()
