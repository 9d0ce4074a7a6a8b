"""The gpulab service's REST API under concurrent clients, beside its own ceiling.

    .venv/bin/python bench/bench_api.py [--clients 50] [--requests 40] [--jobs 200] [--rounds 3]

A real hub (its proxy, the gpulab service it starts), ``--jobs`` ended jobs in the database
(each with its history). ``--clients`` threads, each with its own keep-alive session, send
``--requests`` requests each, in the same run and rounds taking turns:

- ceiling: GET /services/gpulab/api/health through the hub's proxy: the same proxy, the same
  tornado process, no token, no database: what the path costs without gpulab's own work;
- api: GET /api/jobs/ID and GET /api/usage (alternating) with a user's token: token check,
  database reads, JSON;
- list: GET /api/jobs?limit=20 (a page of the user's jobs).

Each line gives p50 / p99 latency and requests per second; the api lines also their share of
the ceiling's throughput. The clients run on the same cores as the server: the ceiling pays
the same client cost, which is why the ratio, not the absolute figure, is the result.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from scale_seed import SPEC  # noqa: E402  (bench/: the benchmarks' one seeded job spec)

from tests.support.hub import Hub  # noqa: E402


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[max(0, min(len(values) - 1, round(p / 100 * (len(values) - 1))))]


def seed_jobs(hub: Hub, owner: str, n: int) -> list[str]:
    """``n`` ended jobs with a realistic history, written straight into the database."""
    from gpulab.db import Database
    from gpulab.jobs.records import JobRecords
    from gpulab.lifecycle import JobState as J

    records = JobRecords(
        Database(f"sqlite:///{hub.workdir / 'data' / 'gpulab.sqlite'}"), hub.instance
    )
    spec = SPEC
    ids = []
    path = [
        (J.INITIALIZING, J.QUEUED),
        (J.PENDING, J.INITIALIZING),
        (J.RUNNING, J.PENDING),
        (J.FINALIZING, J.RUNNING),
        (J.DONE, J.FINALIZING),
    ]
    for _ in range(n):
        job_id = records.create(owner, spec, None)["id"]
        for state, was in path:
            records.transition(job_id, state, expect=was, reason="BENCH")
        ids.append(job_id)
    return ids


def load(urls: list[str], token: str | None, clients: int, per_client: int) -> tuple[list, float]:
    def client(i: int) -> list[float]:
        c = requests.Session()
        if token:
            c.headers["Authorization"] = f"token {token}"
        out = []
        for k in range(per_client):
            url = urls[(i + k) % len(urls)]
            t = time.perf_counter()
            c.get(url, timeout=60).raise_for_status()
            out.append(time.perf_counter() - t)
        return out

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        lat = [x for r in pool.map(client, range(clients)) for x in r]
    return lat, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--clients", type=int, default=50, help="concurrent clients")
    ap.add_argument("--requests", type=int, default=40, help="requests per client and round")
    ap.add_argument("--jobs", type=int, default=200, help="ended jobs in the database")
    ap.add_argument("--rounds", type=int, default=3, help="rounds (the scenarios take turns)")
    ap.add_argument("--only", default="", help="run only the scenarios whose name has this")
    args = ap.parse_args()

    hub = Hub(workdir=Path(tempfile.mkdtemp(prefix="gpulab-bench-api-")))
    try:
        hub.start()
        token = hub.create_user("bench")
        ids = seed_jobs(hub, "bench", args.jobs)
        base = f"{hub.url}/services/gpulab/api"
        scenarios = {
            "ceiling (health)": ([f"{base}/health"], None),
            "api (job / usage)": (
                [u for j in ids[:50] for u in (f"{base}/jobs/{j}", f"{base}/usage")],
                token,
            ),
            "list (20 a page)": ([f"{base}/jobs?limit=20"], token),
        }
        scenarios = {k: v for k, v in scenarios.items() if args.only in k}
        for urls, tok in scenarios.values():  # warm-up: connections, token cache, imports
            load(urls, tok, 5, 4)
        results: dict[str, list[tuple[list[float], float]]] = {k: [] for k in scenarios}
        for _ in range(args.rounds):
            for name, (urls, tok) in scenarios.items():
                results[name].append(load(urls, tok, args.clients, args.requests))
        print(
            f"\n{args.clients} clients x {args.requests} requests, {args.rounds} rounds "
            f"(medians of rounds), {args.jobs} jobs in the database, through the hub's proxy"
        )
        ceiling_rps = None
        for name, runs in results.items():
            p50 = statistics.median(pct(lat, 50) for lat, _ in runs) * 1000
            p99 = statistics.median(pct(lat, 99) for lat, _ in runs) * 1000
            rps = statistics.median(len(lat) / wall for lat, wall in runs)
            ceiling_rps = ceiling_rps or rps
            share = (
                f"  {rps / ceiling_rps:.0%} of the ceiling's throughput"
                if rps != ceiling_rps
                else ""
            )
            print(f"  {name:20s} p50 {p50:6.0f} ms  p99 {p99:6.0f} ms  {rps:6.0f} req/s{share}")
    finally:
        hub.stop()
        hub.remove_workloads()


if __name__ == "__main__":
    main()
