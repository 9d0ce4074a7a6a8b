"""The service's reads on a year of records beside the same reads on a new platform, in one run.

    flock -o /tmp/gpulab-tests.lock .venv/bin/python bench/bench_scale.py \\
        [--jobs 100000] [--users 1000] [--notebooks 200] [--small 100] [--clients 50] [--rounds 3]

Two hubs (each with its proxy and the gpulab service it starts), both with as many ended jobs
of the benchmark's user (so a user's pages are as full on both: ``--small`` plus the loaded
hub's share of each user): the "empty" one has nothing else; the "loaded" one also has
``--jobs`` ended jobs (histories, sync events, saved logs, billed minutes settled into the
monthly totals) from ``--users`` users and ``--notebooks`` notebooks with their histories,
seeded through the record layer
(bench/scale_seed.py; once, into a template database that later runs copy and upgrade to the
current revision: seeding 100,000 jobs takes minutes).

Each request is sent by ``--clients`` threads (bench_api's method: each a keep-alive session,
through the hub's proxy), to one hub then the other, the order alternating from round to
round so that this machine's noise falls on both alike: GET a job, GET usage, the first page
of a user's jobs (20), the first page of everyone's (an admin's token, 20), the jobs page, the
admin page, and the admin's month report (GET /api/usage/report). Each line gives p50 / p99
(medians of the rounds) and requests per second on each hub, and the loaded / empty p99.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parent / "src")]
from bench_api import load, pct  # noqa: E402
from scale_seed import seed_jobs, user_name  # noqa: E402

from tests.support.hub import Hub  # noqa: E402

INSTANCE = "bscale"  # the loaded hub's (its template's records are this instance's)
TEMPLATES = Path(tempfile.gettempdir()) / "gpulab-bench-scale"


def template(jobs: int, users: int, notebooks: int) -> Path:
    """The seeded template's directory (gpulab.sqlite, job-logs/), made if missing."""
    where = TEMPLATES / f"seeded-{jobs}-{users}-{notebooks}"
    if (where / "done").exists():
        return where
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    t = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            str(HERE / "scale_seed.py"),
            str(where / "gpulab.sqlite"),
            str(where / "job-logs"),
            INSTANCE,
            f"--jobs={jobs}",
            f"--users={users}",
            f"--notebooks={notebooks}",
        ],
        check=True,
    )
    (where / "done").write_text(f"{time.perf_counter() - t:.0f} s\n")
    return where


def prepare(hub: Hub, seeded: Path | None, user: str, small: int) -> None:
    """``hub``'s data directory: the template's copy (upgraded to this gpulab's revision),
    then ``small`` ended jobs of ``user``, before the hub starts."""
    from gpulab.db import Database, upgrade_database

    data = hub.workdir / "data"
    data.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{data / 'gpulab.sqlite'}"
    if seeded is not None:
        shutil.copyfile(seeded / "gpulab.sqlite", data / "gpulab.sqlite")
        # hard links: 100,000 small files in seconds (the service only reads them)
        subprocess.run(["cp", "-al", str(seeded / "job-logs"), str(data / "job-logs")], check=True)
        upgrade_database(url)
    seed_jobs(Database(url), hub.instance, data / "job-logs", small, 1, owner=user)


def user_job_ids(hub: Hub, user: str, n: int) -> list[str]:
    from gpulab.db import Database
    from gpulab.jobs.records import JobRecords

    records = JobRecords(Database(f"sqlite:///{hub.workdir / 'data' / 'gpulab.sqlite'}"), "")
    records.instance = hub.instance
    rows, _ = records.page(user, None, None, n, 0, True, with_total=False)
    return [r["id"] for r in rows]


#: item 1's requests that are pages (fewer per client: each is a rendered list)
PAGES = ("jobs page", "admin page")


def serve(name: str, hub: Hub, user: str) -> tuple[str, dict[str, tuple[list[str], str]]]:
    """Start ``hub`` (saying how long it took) and make ``user`` there: their token, and
    item 1's requests, each name with its URLs and the token it is sent with (the user's, or
    the hub's admin's)."""
    t = time.perf_counter()
    hub.start(timeout=180)
    print(f"{name} hub serving in {time.perf_counter() - t:.1f} s")
    token = hub.create_user(user)
    admin = hub.admin_token
    api = f"{hub.url}/services/gpulab/api"
    pages = f"{hub.url}/services/gpulab"
    ids = user_job_ids(hub, user, 50)
    return token, {
        "GET a job": ([f"{api}/jobs/{j}" for j in ids], token),
        "GET usage": ([f"{api}/usage"], token),
        "user's jobs, 1st page": ([f"{api}/jobs?limit=20"], token),
        "admin's jobs, 1st page": ([f"{api}/jobs?all=true&limit=20"], admin),
        "jobs page": ([f"{pages}/jobs"], token),
        "admin page": ([f"{pages}/admin"], admin),
        "month report (admin)": ([f"{api}/usage/report"], admin),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=100_000, help="ended jobs on the loaded hub")
    ap.add_argument("--users", type=int, default=1000, help="their owners")
    ap.add_argument("--notebooks", type=int, default=200, help="notebooks on the loaded hub")
    ap.add_argument("--small", type=int, default=100, help="the user's ended jobs, on both")
    ap.add_argument("--clients", type=int, default=50, help="concurrent clients")
    ap.add_argument("--requests", type=int, default=20, help="API requests per client and round")
    ap.add_argument("--page-requests", type=int, default=6, help="page requests per client")
    ap.add_argument("--rounds", type=int, default=3, help="rounds (the hubs take turns)")
    ap.add_argument("--only", default="", help="run only the requests whose name has this")
    args = ap.parse_args()

    user = user_name(7)  # one of the seeded users: on the loaded hub, 100 jobs of theirs more
    seeded = template(args.jobs, args.users, args.notebooks)
    print(f"template {seeded}: seeded in {(seeded / 'done').read_text().strip()}")
    root = Path(tempfile.mkdtemp(prefix="gpulab-bench-scale-"))
    hubs = {
        "empty": Hub(workdir=root / "empty"),
        "loaded": Hub(workdir=root / "loaded", instance=INSTANCE),
    }
    try:
        t = time.perf_counter()
        # the user's pages as full on both: their seeded jobs and --small more
        prepare(hubs["empty"], None, user, args.small + args.jobs // args.users)
        prepare(hubs["loaded"], seeded, user, args.small)
        print(f"copied, upgraded and topped up in {time.perf_counter() - t:.0f} s")
        plans = {}
        for name, hub in hubs.items():
            _, requests_ = serve(name, hub, user)
            plans[name] = {
                k: (urls, tok, args.page_requests if k in PAGES else args.requests)
                for k, (urls, tok) in requests_.items()
            }
        names = [k for k in plans["empty"] if args.only in k]
        for name in names:  # warm-up: connections, token caches, templates
            for hub_name in hubs:
                urls, tok, _ = plans[hub_name][name]
                load(urls, tok, 5, 4)
        results: dict = {(n, h): [] for n in names for h in hubs}
        for r in range(args.rounds):
            order = list(hubs) if r % 2 == 0 else list(reversed(hubs))
            for name in names:
                for hub_name in order:
                    urls, tok, per_client = plans[hub_name][name]
                    results[(name, hub_name)].append(load(urls, tok, args.clients, per_client))
        print(
            f"\n{args.clients} clients, {args.rounds} rounds (medians of rounds), through each "
            f"hub's proxy; both: {args.small + args.jobs // args.users} ended jobs of {user}; "
            f"loaded: also the rest of {args.jobs} "
            f"ended jobs of {args.users} users and {args.notebooks} notebooks"
        )
        print(
            f"  {'request':24s} {'empty p50/p99 ms':>17s} {'req/s':>6s}  "
            f"{'loaded p50/p99 ms':>18s} {'req/s':>6s}  p99 ratio"
        )
        for name in names:
            cols = []
            p99s = {}
            for hub_name in hubs:
                runs = results[(name, hub_name)]
                p50 = statistics.median(pct(lat, 50) for lat, _ in runs) * 1000
                p99 = statistics.median(pct(lat, 99) for lat, _ in runs) * 1000
                rps = statistics.median(len(lat) / wall for lat, wall in runs)
                p99s[hub_name] = p99
                cols.append(f"{p50:7.0f} /{p99:7.0f} {rps:6.0f}")
            ratio = p99s["loaded"] / p99s["empty"]
            print(f"  {name:24s} {cols[0]:>24s}  {cols[1]:>25s}  {ratio:5.2f}x")
    finally:
        for hub in hubs.values():
            hub.stop()
            hub.remove_workloads()


if __name__ == "__main__":
    main()
