"""Writes to gpulab's SQLite database from many threads of one process: this process's own
queue in front of SQLite's write lock (gpulab.db.Database.session) against SQLite's busy
handler alone (what a user's plain SQLAlchemy session does), in one run, rounds alternating.

    .venv/bin/python bench/bench_db_writes.py [--threads 8] [--writes 40] [--rounds 3]

Each write is the record layer's own ``JobRecords.note`` (one event row and a job update, in
one transaction) on one of 64 jobs; ``--threads`` threads write ``--writes`` each.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from scale_seed import SPEC  # noqa: E402  (bench/: the benchmarks' one seeded job spec)

from gpulab.db import Database  # noqa: E402
from gpulab.jobs.records import JobRecords  # noqa: E402


def one_round(queued: bool, threads: int, writes: int) -> tuple[float, list[float]]:
    """(writes a second, each write's seconds) on a fresh database."""
    db = Database(f"sqlite:///{tempfile.mkdtemp(prefix='gpulab-bench-db-')}/b.sqlite", True)
    if not queued:  # SQLite's busy handler alone
        db._writing = contextlib.nullcontext()
    records = JobRecords(db, "bench")
    ids = [records.create(f"u{i % 4}", SPEC, None)["id"] for i in range(64)]
    seconds: list[float] = []

    def writer(k: int) -> None:
        for j in range(writes):
            t = time.perf_counter()
            records.note(ids[(k * writes + j) % len(ids)], "progress", "BENCH", f"step {j}")
            seconds.append(time.perf_counter() - t)

    workers = [threading.Thread(target=writer, args=(k,)) for k in range(threads)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return len(seconds) / (time.perf_counter() - t0), sorted(seconds)


def pct(values: list[float], p: float) -> float:
    return values[max(0, min(len(values) - 1, round(p / 100 * (len(values) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--writes", type=int, default=40, help="writes per thread and round")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    runs: dict[bool, list[tuple[float, list[float]]]] = {True: [], False: []}
    for _ in range(args.rounds):
        for queued in (False, True):
            runs[queued].append(one_round(queued, args.threads, args.writes))
    print(f"\n{args.threads} threads x {args.writes} writes, {args.rounds} rounds (medians)")
    for queued, name in ((False, "SQLite's busy handler alone"), (True, "gpulab's queue first")):
        rate = statistics.median(r for r, _ in runs[queued])
        p50 = statistics.median(pct(s, 50) for _, s in runs[queued]) * 1000
        p99 = statistics.median(pct(s, 99) for _, s in runs[queued]) * 1000
        print(f"  {name:28s} {rate:5.0f} writes/s  p50 {p50:6.1f} ms  p99 {p99:6.1f} ms")


if __name__ == "__main__":
    main()
