"""A year of a department's records, for bench/bench_scale.py: ``jobs`` ended jobs (each with
its history, a sync event, a saved log and its billed minutes settled into the monthly
totals) from ``users`` users, and ``notebooks`` notebooks with their histories.

    .venv/bin/python bench/scale_seed.py DB_FILE LOGS_DIR INSTANCE [--jobs N] [--users N]

Through the record layer, in bulk: 100,000 jobs through ``JobRecords.create`` and five
``transition`` calls each are 600,000 transactions (each one a commit of SQLite's write-ahead
log, about 2 ms here: 20 minutes). So each job's row and first event are built by the
record layer's own ``JobRecords._new``, its later states are applied as ``transition``
applies them (state, reason, times, an event each, ``running_since``, the exit code), its
billed minutes are settled by ``gpulab.jobs.usage.settle`` (the function every transition
calls), and a thousand jobs are written per transaction. Notebooks go through
``NotebookRecords.transition`` itself (200 x 4 transactions), each user's recent GPU use
(the fair share's row) through ``RecentUsage.accrue``. The times are spread over the
year before now, so that the monthly totals span twelve months.
"""

from __future__ import annotations

import argparse
import secrets
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

#: seconds each state lasts in a seeded job's life, from its submission
LIFE = (
    ("INITIALIZING", "PLACED", 2),
    ("PENDING", "PULLED", 5),
    ("RUNNING", "STARTED", 9),
    ("FINALIZING", "EXITED", 9 + 137),
    ("DONE", "COMPLETED", 9 + 137 + 4),
)

SPEC = {
    "name": "bench",
    "image": "gpulab/python:3.11",
    "command": ["python", "train.py"],
    "args": [],
    "env": {},
    "labels": {"project": "bench"},
    "resources": {"gpus": 0, "cpus": 0.25, "memory": 268435456},
    "volumes": [],
    "priority": 50,
    "preemptible": False,
    "retries": 0,
    "timeout": 3600,
    "hang_restart": {"enabled": False, "period": 600},
}

LOG = b"".join(b"epoch %d loss %.4f\n" % (i, 1 / (i + 1)) for i in range(40))


def user_name(i: int) -> str:
    return f"u{i:04d}"


def seed_jobs(
    db, instance: str, logs_dir: Path, jobs: int, users: int, batch: int = 1000, owner: str = ""
):
    """``jobs`` ended jobs, round-robin over ``users`` users (or all ``owner``'s), the newest
    ending a minute ago."""
    from gpulab.db import JobEvent
    from gpulab.jobs.records import JobRecords
    from gpulab.jobs.usage import settle
    from gpulab.lifecycle import utcnow

    records = JobRecords(db, instance)
    logs_dir.mkdir(parents=True, exist_ok=True)
    now = utcnow()
    step = timedelta(days=365) / max(jobs, 1)
    done = 0
    while done < jobs:
        with db.session() as s:
            for i in range(done, min(jobs, done + batch)):
                who = owner or user_name(i % users)
                t0 = now - timedelta(minutes=5) - step * (jobs - i)
                job_id = "j" + secrets.token_hex(6)
                spec = {**SPEC, "resources": {**SPEC["resources"], "gpus": i % 2}}
                job = records._new(job_id, who, ("team",), f"job-{job_id[1:]}", spec, t0)
                for state, reason, after in LIFE:
                    at = t0 + timedelta(seconds=after)
                    job.state, job.reason, job.message, job.updated = state, reason, "", at
                    job.running_since = at if state == "RUNNING" else None
                    if state == "DONE":
                        job.exit_code = 0
                        job.container = ""
                    job.events.append(
                        JobEvent(at=at, kind="transition", state=state, reason=reason)
                    )
                    if state == "RUNNING":
                        job.events.append(
                            JobEvent(at=at, kind="sync", state=state, reason="LIVE_PUSH")
                        )
                    if state in ("FINALIZING", "DONE"):  # a billed period closed
                        settle(db, s, job, at)
                s.add(job)
                (logs_dir / f"{job_id}.log").write_bytes(LOG)
        done = min(jobs, done + batch)


def seed_fair_share(db, instance: str, users: int) -> None:
    """Each user's recent GPU use and groups, as the supervisor keeps them (the fair share
    the usage API and the queue read: one row a user)."""
    from gpulab.gpus.recent_usage import RecentUsage
    from gpulab.lifecycle import utcnow

    names = [user_name(i) for i in range(users)]
    RecentUsage(db, instance).accrue(
        {n: 1.0 for n in names}, 3600.0, utcnow(), 7 * 86400.0, {n: ["team"] for n in names}
    )


def seed_notebooks(db, instance: str, notebooks: int, users: int) -> None:
    """``notebooks`` notebooks with a history each (started, ran, stopped)."""
    from gpulab.lifecycle import NotebookState as N
    from gpulab.notebooks.records import NotebookRecords

    records = NotebookRecords(db, instance)
    for i in range(notebooks):
        user, server = user_name(i % users), f"nb{i // users}" if i >= users else ""
        for state in (N.STARTING, N.RUNNING, N.STOPPING, N.STOPPED):
            records.transition(user, server, state, reason="BENCH")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("db", type=Path)
    ap.add_argument("logs", type=Path)
    ap.add_argument("instance")
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--users", type=int, default=1000)
    ap.add_argument("--notebooks", type=int, default=200)
    args = ap.parse_args()
    from gpulab.db import Database

    t = time.perf_counter()
    db = Database(f"sqlite:///{args.db}")
    seed_jobs(db, args.instance, args.logs, args.jobs, args.users)
    seed_notebooks(db, args.instance, args.notebooks, args.users)
    seed_fair_share(db, args.instance, args.users)
    print(f"seeded {args.jobs} jobs, {args.notebooks} notebooks in {time.perf_counter() - t:.0f} s")


if __name__ == "__main__":
    main()
