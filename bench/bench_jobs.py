"""Jobs benchmark: submission-to-RUNNING latency, 200 short jobs to DONE beside a bare
``docker run --rm`` loop, API latency.

    .venv/bin/python bench/bench_jobs.py [--latency 10] [--jobs 200] [--concurrency 16]
                                         [--clients 50] [--requests 20] [--only throughput]

A real hub and the gpulab service it starts, the local Docker engine, jobs without GPUs on
gpulab/python:3.11. Latency is measured from the job's own history (QUEUED -> RUNNING
timestamps written by the service) and from the client's side (POST until it reads RUNNING).

Throughput: ``--jobs`` jobs running ``true`` queued at once, ``--concurrency`` at a time (the
user's max_job_workers), until the last is DONE; beside it, in the same run, the anchor a
user would pick instead: the same number of ``docker run --rm`` of the same image with the
same limits (CPUs, memory, user), ``--concurrency`` at a time from a thread pool, timed before
and after gpulab's run (the ratio is against their mean, so that a machine that drifts during
the run weighs on both sides).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.hub import Hub  # noqa: E402

SMALL = {"gpus": 0, "cpus": 0.25, "memory": "256M"}
IMAGE = "gpulab/python:3.11"
#: what a user would type for one of the jobs: the same image, limits and user
BARE = ["docker", "run", "--rm", "--cpus", "0.25", "--memory", "256m", "--user", "1000:100"]


#: the network of its own each of gpulab's users' workloads joins (runtime/network.py), made
#: for the isolated loop
BARE_NETWORK = "gpulab-bench-isolated"
#: the same, isolated as gpulab isolates a job (runtime/objects.py): a user-defined bridge of
#: its own instead of the default bridge, no capabilities, no new privileges, a process cap,
#: a rotated log
ISOLATED = [
    *BARE,
    "--network",
    BARE_NETWORK,
    "--cap-drop",
    "ALL",
    "--security-opt",
    "no-new-privileges:true",
    "--pids-limit",
    "4096",
    "--log-opt",
    "max-size=10m",
    "--log-opt",
    "max-file=3",
]


def bare_loop(jobs: int, concurrency: int, command: list[str] = BARE) -> float:
    """Seconds for ``jobs`` ``docker run --rm IMAGE true``, ``concurrency`` at a time."""

    def one(_: int) -> None:
        subprocess.run([*command, IMAGE, "true"], check=True, capture_output=True, timeout=300)

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(jobs)))
    return time.perf_counter() - t0


def ts(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[max(0, min(len(values) - 1, round(p / 100 * (len(values) - 1))))]


def latency(args, submit, wait, s: requests.Session, api: str) -> None:
    server_side, client_side = [], []
    submit(["true"])  # warm-up
    for _ in range(args.latency):
        t0 = time.perf_counter()
        job_id = submit(["sleep", "30"])
        job = wait(job_id, {"RUNNING", "FAILED", "ERROR"})
        client_side.append(time.perf_counter() - t0)
        hist = {e["state"]: ts(e["at"]) for e in job["history"]}
        server_side.append(hist["RUNNING"] - hist["QUEUED"])
        s.post(f"{api}/jobs/{job_id}/interrupt", timeout=60)
    print(f"\nSubmission to RUNNING ({args.latency} jobs, one at a time, no data)")
    print(
        f"  server side (history): median {statistics.median(server_side):.3f} s, "
        f"max {max(server_side):.3f} s"
    )
    print(
        f"  client side (POST until RUNNING is read): median "
        f"{statistics.median(client_side):.3f} s   (target: median under 1 s)"
    )


def throughput(args, hub: Hub) -> None:
    """``--jobs`` short jobs of a user of their own (so that the counts are theirs only),
    queued at once, until every one ended; the bare loop and the isolated one before and
    after (in reverse order after: each pair's mean is taken at the same middle time)."""
    bare_loop(args.concurrency, args.concurrency)  # warm-up: the image's layers in the cache
    subprocess.run(["docker", "network", "create", BARE_NETWORK], capture_output=True)
    try:
        bare_before = bare_loop(args.jobs, args.concurrency)
        isolated_before = bare_loop(args.jobs, args.concurrency, ISOLATED)
        gpulab(args, hub, bare_before, isolated_before)
    finally:
        subprocess.run(["docker", "network", "rm", BARE_NETWORK], capture_output=True)


def gpulab(args, hub: Hub, bare_before: float, isolated_before: float) -> None:
    s = requests.Session()
    s.headers["Authorization"] = f"token {hub.create_user('burst')}"
    api = f"{hub.url}/services/gpulab/api"

    def submit(_: int) -> str:
        body = {"command": ["true"], "resources": SMALL}
        r = s.post(f"{api}/jobs", json=body, timeout=60)
        r.raise_for_status()
        return r.json()["id"]

    def ended(states: str) -> int:
        r = s.get(f"{api}/jobs", params={"state": states, "limit": 1}, timeout=120)
        r.raise_for_status()
        return r.json()["total"]

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(submit, range(args.jobs)))
    submitted = time.perf_counter() - t0
    while ended("DONE,FAILED,ERROR") < args.jobs:
        time.sleep(0.2)
    wall = time.perf_counter() - t0
    ok = ended("DONE")
    isolated_after = bare_loop(args.jobs, args.concurrency, ISOLATED)
    bare_after = bare_loop(args.jobs, args.concurrency)
    bare = (bare_before + bare_after) / 2
    isolated = (isolated_before + isolated_after) / 2
    rate, bare_rate = args.jobs / wall * 60, args.jobs / bare * 60
    isolated_rate = args.jobs / isolated * 60
    print(f"\n{args.jobs} short jobs queued at once, {args.concurrency} at a time")
    print(
        f"  gpulab: submitted in {submitted:.1f} s; all ended in {wall:.1f} s; {ok} DONE; "
        f"{rate:.0f} jobs/min"
    )
    print(
        f"  bare docker run --rm loop: {bare_before:.1f} s before, {bare_after:.1f} s after; "
        f"{bare_rate:.0f} jobs/min"
    )
    print(
        f"  the same loop isolated as gpulab isolates a job (own network, no capabilities): "
        f"{isolated_before:.1f} s before, {isolated_after:.1f} s after; "
        f"{isolated_rate:.0f} jobs/min"
    )
    print(f"  gpulab / bare: {rate / bare_rate:.2f}x   (target: at least 0.9x)")
    print(f"  isolated loop / bare: {isolated_rate / bare_rate:.2f}x")
    print(f"  gpulab / isolated loop: {rate / isolated_rate:.2f}x")
    phases(s, api, ids, args.concurrency)


def phases(s: requests.Session, api: str, ids: list[str], concurrency: int) -> None:
    """Where a slot's time goes, from the jobs' histories: each phase's median and p90, and
    the hand-over (a slot freed by a job's end until the next job is PENDING in it)."""
    hists = []
    for job_id in ids:
        events = s.get(f"{api}/jobs/{job_id}/events", timeout=60).json()["events"]
        first: dict[str, float] = {}
        for e in events:
            first.setdefault(e["state"], ts(e["at"]))
        hists.append(first)
    print("  phases (median / p90, from the jobs' histories):")
    for a, b in (("PENDING", "RUNNING"), ("RUNNING", "FINALIZING"), ("FINALIZING", "DONE")):
        d = [h[b] - h[a] for h in hists if a in h and b in h]
        if d:
            print(f"    {a} -> {b}: {statistics.median(d):.2f} s / {pct(d, 90):.2f} s")
    pending = sorted(h["PENDING"] for h in hists if "PENDING" in h)
    done = sorted(h["DONE"] for h in hists if "DONE" in h)
    hand = [p - d for p, d in zip(pending[concurrency:], done, strict=False)]
    if hand:
        print(
            f"    a slot freed (DONE) -> the next job PENDING: {statistics.median(hand):.2f} s / "
            f"{pct(hand, 90):.2f} s"
        )


def api_latency(args, hub: Hub, token: str) -> None:
    api = f"{hub.url}/services/gpulab/api"
    s = requests.Session()
    s.headers["Authorization"] = f"token {token}"
    listed = s.get(f"{api}/jobs", params={"limit": args.clients}, timeout=60).json()["jobs"]
    sample = [j["id"] for j in listed] or [""]

    def client(i: int) -> list[float]:
        c = requests.Session()
        c.headers["Authorization"] = f"token {token}"
        out = []
        for k in range(args.requests):
            url = f"{api}/jobs/{sample[(i + k) % len(sample)]}" if k % 2 else f"{api}/usage"
            t = time.perf_counter()
            c.get(url, timeout=60).raise_for_status()
            out.append(time.perf_counter() - t)
        return out

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
        lat = [x for r in pool.map(client, range(args.clients)) for x in r]
    wall = time.perf_counter() - t0
    print(
        f"\nAPI latency, {args.clients} concurrent clients x {args.requests} requests "
        "(GET a job / GET usage, through the hub's proxy)"
    )
    print(
        f"  p50 {pct(lat, 50) * 1000:.0f} ms, p99 {pct(lat, 99) * 1000:.0f} ms, "
        f"{len(lat) / wall:.0f} requests/s"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--latency", type=int, default=10, help="jobs timed one by one")
    ap.add_argument("--jobs", type=int, default=200, help="short jobs queued at once")
    ap.add_argument(
        "--concurrency", type=int, default=16, help="the user's jobs at once (max_job_workers)"
    )
    ap.add_argument("--clients", type=int, default=50, help="concurrent API clients")
    ap.add_argument("--requests", type=int, default=20, help="requests per client")
    ap.add_argument(
        "--interval", type=float, default=0.1, help="the supervisor's interval (seconds)"
    )
    ap.add_argument(
        "--only", default="", help="run only this part: latency, throughput or api (default: all)"
    )
    args = ap.parse_args()
    part = {"latency", "throughput", "api"} if not args.only else {args.only}

    config = (
        f"c.GpulabSettings.supervisor_interval = {args.interval}\n"
        "c.GpulabSettings.job_container_retention = 0\n"
        # the quota counts QUEUED jobs: none here, and max_job_workers caps what runs at once
        'c.GpulabSettings.job_quota = {"gpus": None, "jobs": None}\n'
        f"c.GpulabSettings.max_job_workers = {args.concurrency}\n"
    )
    hub = Hub(workdir=Path(tempfile.mkdtemp(prefix="gpulab-bench-jobs-")), extra_config=config)
    try:
        hub.start()
        token = hub.create_user("bench")
        s = requests.Session()
        s.headers["Authorization"] = f"token {token}"
        api = f"{hub.url}/services/gpulab/api"

        def submit(command: list[str]) -> str:
            r = s.post(f"{api}/jobs", json={"command": command, "resources": SMALL}, timeout=60)
            r.raise_for_status()
            return r.json()["id"]

        def wait(job_id: str, states: set[str], poll: float = 0.02) -> dict:
            while True:
                job = s.get(f"{api}/jobs/{job_id}", timeout=60).json()
                if job["state"] in states:
                    return job
                time.sleep(poll)

        # 1. submission to RUNNING, one at a time
        if "latency" in part:
            latency(args, submit, wait, s, api)

        # 2. many short jobs queued at once, beside the bare docker run loop
        if "throughput" in part:
            throughput(args, hub)

        # 3. API latency under concurrent clients
        if "api" in part:
            api_latency(args, hub, token)
    finally:
        hub.stop()
        hub.remove_workloads()


if __name__ == "__main__":
    main()
