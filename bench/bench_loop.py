"""Is an event loop held? The gpulab service's under a year of records and a stream of jobs, and
the hub's REST API with gpulab's spawner beside plain DockerSpawner: each side by side in one
run (issue #32 item 5).

    flock -o /tmp/gpulab-tests.lock .venv/bin/python bench/bench_loop.py \\
        [--only service|hub] [--seconds 60] [--rounds 2] [--clients 50] [--jobs-per-minute 20]

Both parts run with ``c.GpulabSettings.event_loop_watch = 0.02`` (gpulab/loopwatch.py): every
callback of the service's and the hub's event loop is timed, and each that held its loop more
than 20 ms is logged with its duration and what it was. The service also samples its loop's
lag (a timer every 0.1 s, how late it ran: ``gpulab_event_loop_lag_seconds``, read from its
/metrics before and after each phase; p50 and p99 interpolated in the histogram's buckets as
Prometheus' histogram_quantile does, the max from the log's lag samples over 20 ms, else
"< 20 ms").

service: bench_scale's two hubs, "empty" (the benchmark user's ``--small`` ended jobs, plus
as many as the loaded one gives them) and "loaded" (the 100,000 ended jobs of 1,000 users and
200 notebooks of bench/scale_seed.py, from bench_scale's template). On each hub in turn (the
order alternating by round) for ``--seconds``: ``--clients`` threads, each a keep-alive
session through the hub's proxy, send bench_scale's requests round-robin without pause (GET a
job, GET usage, the first page of the user's and of everyone's jobs, the jobs page, the admin
page), while another thread submits ``--jobs-per-minute`` short jobs a minute (``sleep 1`` on
gpulab/python:3.11, no GPU) through the API, which start and end during the phase. Between
phases the phase's jobs are waited for (out of the measure).

hub: two hubs with the same image: "plain" (JupyterHub's DockerSpawner, none of gpulab's
spawner or hooks) and "gpulab" (NotebookSpawner with its hooks, as installed). On each in turn
for ``--seconds``: ``--hub-clients`` threads list the users (GET /hub/api/users, admin token,
``--users`` users) without pause, while ``--spawners`` users each start their server (POST
/hub/api/users/NAME/server), wait until it is ready, stop it (DELETE), and wait until it is
gone, again and again. ``slow_spawn_timeout`` and ``slow_stop_timeout`` are 0 on both, so a
POST or DELETE is answered as soon as the hub has handed the work to its spawner (202): its
latency is the hub's own, not the container's start.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import re
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parent / "src")]
from bench_api import pct  # noqa: E402
from bench_scale import INSTANCE, prepare, serve, template  # noqa: E402
from scale_seed import user_name  # noqa: E402

from tests.support.hub import Hub  # noqa: E402

WATCH = 0.02  # seconds: the bound
COMMON = f"""
c.GpulabSettings.event_loop_watch = {WATCH}
"""
SERVICE = (
    COMMON
    + """
c.GpulabSettings.job_container_retention = 0
c.GpulabSettings.job_quota = {"gpus": None, "jobs": None}
"""
)
IMAGE = "gpulab/python:3.11"
HUB_COMMON = (
    COMMON
    + """
c.JupyterHub.tornado_settings = {"slow_spawn_timeout": 0, "slow_stop_timeout": 0}
c.Spawner.http_timeout = 120
c.Spawner.start_timeout = 300
"""
)
PLAIN = (
    HUB_COMMON
    + f"""
c.JupyterHub.spawner_class = "docker"
c.DockerSpawner.image = "{IMAGE}"
c.DockerSpawner.remove = True
c.DockerSpawner.name_template = "{{prefix}}-{{username}}--{{servername}}"
"""
)
GPULAB_OPTIONS = {"framework": "python", "cpus": 2, "memory": "2G", "gpus": 0}
SMALL = {"gpus": 0, "cpus": 0.25, "memory": "256M"}

HELD = re.compile(
    r"event loop held ([0-9.]+) ms \(CPU ([0-9.]+) ms, ([0-9]+) waits, ([0-9]+) preempted\) by (.*)"
)
LATE = re.compile(r"event loop late by ([0-9.]+) ms")
GC = re.compile(r"garbage collection of generation ([0-9]) took ([0-9.]+) ms \(CPU ([0-9.]+) ms")


def log_since(hub: Hub, offset: int) -> str:
    with open(hub.log_file, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def log_size(hub: Hub) -> int:
    return hub.log_file.stat().st_size


def lag_buckets(hub: Hub, token: str) -> dict[float, float]:
    """The service's lag histogram: cumulative count per upper bound (inf included)."""
    r = requests.get(
        f"{hub.url}/services/gpulab/metrics",
        headers={"Authorization": f"token {token}"},
        timeout=60,
    )
    r.raise_for_status()
    out = {}
    for line in r.text.splitlines():
        m = re.match(r'gpulab_event_loop_lag_seconds_bucket\{le="([^"]+)"\} ([0-9.e+]+)', line)
        if m:
            out[float(m.group(1))] = float(m.group(2))
    return out


def quantile(buckets: dict[float, float], q: float) -> float:
    """Prometheus' histogram_quantile on cumulative ``buckets`` (a delta of two scrapes)."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    if total <= 0:
        return 0.0
    rank, lower, below = q * total, 0.0, 0.0
    for b in bounds:
        if buckets[b] >= rank:
            if b == float("inf"):
                return lower
            return lower + (b - lower) * (rank - below) / max(buckets[b] - below, 1e-9)
        lower, below = b, buckets[b]
    return lower


class Phase:
    """What one hub's phase gave: request latencies by name, the log's slow callbacks and lag
    samples, the lag histogram's delta."""

    def __init__(self) -> None:
        self.latency: dict[str, list[float]] = collections.defaultdict(list)
        self.errors = 0
        #: (ms, CPU ms, waits, preempted, what) of each callback over the watch's threshold
        self.held: list[tuple[float, float, int, int, str]] = []
        self.late: list[float] = []
        #: (generation, ms, CPU ms) of each garbage collection over the watch's threshold
        self.gc: list[tuple[int, float, float]] = []
        self.buckets: dict[float, float] = {}
        self.jobs = 0
        self.wall = 0.0

    def read_log(self, text: str, logger: str) -> None:
        """The lines of ``logger`` (the service's gpulab.loop, the hub's gpulab.hub_loop: both
        write to the hub's log)."""
        for line in text.splitlines():
            if f" {logger}]" not in line and f" {logger} " not in line:
                continue
            if m := HELD.search(line):
                ms, cpu, waits, preempted, what = m.groups()
                self.held.append((float(ms), float(cpu), int(waits), int(preempted), what.strip()))
            elif m := LATE.search(line):
                self.late.append(float(m.group(1)))
            elif m := GC.search(line):
                self.gc.append((int(m.group(1)), float(m.group(2)), float(m.group(3))))


def hammer(plan: list[tuple[str, str, str]], clients: int, until: float, phase: Phase) -> None:
    """``clients`` threads sending ``plan``'s (name, url, token) round-robin until ``until``."""

    def client(i: int) -> None:
        s = requests.Session()
        k = i
        while time.monotonic() < until:
            name, url, token = plan[k % len(plan)]
            k += 1
            t = time.perf_counter()
            try:
                r = s.get(url, headers={"Authorization": f"token {token}"}, timeout=60)
                ok = r.ok
            except requests.RequestException:
                ok = False
            took = time.perf_counter() - t
            if ok:
                phase.latency[name].append(took)
            else:
                phase.errors += 1

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))


def submit_jobs(api: str, token: str, per_minute: float, until: float, ids: list[str]) -> None:
    s = requests.Session()
    s.headers["Authorization"] = f"token {token}"
    step = 60 / per_minute
    nxt = time.monotonic()
    while nxt < until:
        r = s.post(f"{api}/jobs", json={"command": ["sleep", "1"], "resources": SMALL}, timeout=60)
        r.raise_for_status()
        ids.append(r.json()["id"])
        nxt += step
        time.sleep(max(0.0, nxt - time.monotonic()))


def wait_ended(api: str, token: str, ids: list[str], timeout: float = 120) -> int:
    """How many of ``ids`` are DONE once all ended (or ``timeout``)."""
    s = requests.Session()
    s.headers["Authorization"] = f"token {token}"
    deadline = time.monotonic() + timeout
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        for j in ids:
            if states.get(j) not in ("DONE", "FAILED", "ERROR", "CANCELLED"):
                states[j] = s.get(f"{api}/jobs/{j}", timeout=60).json()["state"]
        if all(states[j] in ("DONE", "FAILED", "ERROR", "CANCELLED") for j in ids):
            break
        time.sleep(1)
    return sum(states.get(j) == "DONE" for j in ids)


def report_loop(phases: dict[str, list[Phase]], sides: list[str]) -> None:
    """The loop's figures per side: lag p50/p99/max, slow callbacks, the worst and the most
    frequent ones."""
    print(f"\n  {'event loop':28s}" + "".join(f"{s:>22s}" for s in sides))
    rows: dict[str, list[str]] = collections.defaultdict(list)
    for side in sides:
        runs = phases[side]
        merged: dict[float, float] = collections.Counter()
        for p in runs:
            for b, n in p.buckets.items():
                merged[b] += n
        samples = merged.get(float("inf"), 0)
        late = [x for p in runs for x in p.late]
        held = [h for p in runs for h in p.held]
        rows["lag samples"].append(f"{samples:.0f}")
        if merged:
            rows["lag p50 (ms)"].append(f"{quantile(merged, 0.5) * 1000:.1f}")
            rows["lag p99 (ms)"].append(f"{quantile(merged, 0.99) * 1000:.1f}")
        rows["lag max (ms)"].append(f"{max(late):.1f}" if late else f"< {WATCH * 1000:.0f}")
        rows[f"callbacks > {WATCH * 1000:.0f} ms"].append(str(len(held)))
        own = [h for h in held if h[1] > WATCH * 1000]
        rows[f"  of which CPU > {WATCH * 1000:.0f} ms"].append(str(len(own)))
        gcs = [(ms, cpu) for p in runs for _, ms, cpu in p.gc]
        rows[f"collections > {WATCH * 1000:.0f} ms"].append(
            f"{len(gcs)}, max {max(gcs)[0]:.0f} (CPU {max(gcs)[1]:.0f})" if gcs else "0"
        )
        worst = max(held) if held else None
        rows["worst callback (ms)"].append(
            f"{worst[0]:.1f} (CPU {worst[1]:.1f})" if worst else "none"
        )
    for name, cols in rows.items():
        print(f"  {name:28s}" + "".join(f"{c:>22s}" for c in cols))
    for side in sides:
        print_held(side, [h for p in phases[side] for h in p.held])


def print_held(side: str, held: list[tuple[float, float, int, int, str]]) -> None:
    """The callbacks over the threshold by what they were, the worst first."""
    if not held:
        return
    by_name: dict[str, list[tuple]] = collections.defaultdict(list)
    for h in held:
        by_name[h[4]].append(h)
    print(
        f"\n  {side}: callbacks over {WATCH * 1000:.0f} ms, by what they were (worst first, at "
        "most 12): the worst's ms, CPU ms, waits, preemptions; how many; CPU p50 of all"
    )
    for name, v in sorted(by_name.items(), key=lambda kv: -max(kv[1])[0])[:12]:
        ms, cpu, waits, preempted, _ = max(v)
        median_cpu = sorted(h[1] for h in v)[len(v) // 2]
        print(
            f"    {ms:7.1f} ms (CPU {cpu:5.1f}, {waits:3d} w, {preempted:3d} p) {len(v):4d}x "
            f"(CPU p50 {median_cpu:5.1f})  {name[:200]}"
        )


def report_latency(phases: dict[str, list[Phase]], sides: list[str], names: list[str]) -> None:
    print(
        f"\n  {'request (all rounds)':28s}"
        + "".join(f"{s + ' p50/p99 ms  n':>26s}" for s in sides)
        + "  p99 ratio"
    )
    for name in names:
        cols, p99s = [], []
        for side in sides:
            lat = [x for p in phases[side] for x in p.latency.get(name, [])]
            if not lat:
                cols.append(f"{'-':>26s}")
                p99s.append(None)
                continue
            p50, p99 = pct(lat, 50) * 1000, pct(lat, 99) * 1000
            p99s.append(p99)
            cols.append(f"{p50:8.0f} /{p99:6.0f} {len(lat):7d}")
        ratio = f"{p99s[1] / p99s[0]:6.2f}x" if all(p99s) else ""
        print(f"  {name:28s}" + "".join(f"{c:>26s}" for c in cols) + f"  {ratio}")
    for side in sides:
        errors = sum(p.errors for p in phases[side])
        if errors:
            print(f"  {side}: {errors} requests failed")


def service_part(args) -> None:
    user = user_name(7)
    seeded = template(args.jobs, args.users, args.notebooks)
    root = Path(tempfile.mkdtemp(prefix="gpulab-bench-loop-"))
    hubs = {
        "empty": Hub(workdir=root / "empty", extra_config=SERVICE),
        "loaded": Hub(workdir=root / "loaded", instance=INSTANCE, extra_config=SERVICE),
    }
    try:
        prepare(hubs["empty"], None, user, args.small + args.jobs // args.users)
        prepare(hubs["loaded"], seeded, user, args.small)
        plans, tokens = {}, {}
        for name, hub in hubs.items():
            token, requests_ = serve(name, hub, user)
            requests_.pop("month report (admin)")  # (not among item 5's)
            jobs, _ = requests_.pop("GET a job")
            plan = [("GET a job", url, token) for url in jobs[:8]]
            plan += [(k, url, tok) for k, (urls, tok) in requests_.items() for url in urls] * 2
            plans[name], tokens[name] = plan, token
            hammer(plan, 5, time.monotonic() + 3, Phase())  # warm-up
        phases: dict[str, list[Phase]] = {n: [] for n in hubs}
        for r in range(args.rounds):
            order = list(hubs) if r % 2 == 0 else list(reversed(hubs))
            for name in order:
                hub, phase = hubs[name], Phase()
                api = f"{hub.url}/services/gpulab/api"
                before, offset = lag_buckets(hub, hub.admin_token), log_size(hub)
                until = time.monotonic() + args.seconds
                ids: list[str] = []
                submitter = threading.Thread(
                    target=submit_jobs,
                    args=(api, tokens[name], args.jobs_per_minute, until, ids),
                )
                t0 = time.perf_counter()
                submitter.start()
                hammer(plans[name], args.clients, until, phase)
                submitter.join()
                phase.wall = time.perf_counter() - t0
                after = lag_buckets(hub, hub.admin_token)
                phase.buckets = {b: after[b] - before.get(b, 0) for b in after}
                phase.read_log(log_since(hub, offset), "gpulab.loop")
                phase.jobs = wait_ended(api, tokens[name], ids)
                print(
                    f"round {r + 1} {name}: {sum(map(len, phase.latency.values()))} requests, "
                    f"{len(ids)} jobs submitted ({phase.jobs} DONE), "
                    f"{len(phase.held)} callbacks > {WATCH * 1000:.0f} ms"
                )
                phases[name].append(phase)
        print(
            f"\nservice: {args.clients} clients without pause and {args.jobs_per_minute:g} "
            f"short jobs a minute, {args.rounds} x {args.seconds:g} s per hub; loaded: "
            f"{args.jobs} ended jobs of {args.users} users, {args.notebooks} notebooks"
        )
        names = list(dict.fromkeys(n for n, _, _ in plans["empty"]))
        report_latency(phases, list(hubs), names)
        report_loop(phases, list(hubs))
    finally:
        for hub in hubs.values():
            hub.stop()
            hub.remove_workloads()
            # the copied database and logs (hundreds of MB): only the hub's log is kept
            shutil.rmtree(hub.workdir / "data", ignore_errors=True)
        print(f"the hubs' logs: {root}/*/hub.log")


def hub_part(args) -> None:
    root = Path(tempfile.mkdtemp(prefix="gpulab-bench-loop-hub-"))
    hubs = {
        "plain": (Hub(workdir=root / "plain", extra_config=PLAIN), {}),
        "gpulab": (Hub(workdir=root / "gpulab", extra_config=HUB_COMMON), GPULAB_OPTIONS),
    }
    spawners = [f"s{i}" for i in range(args.spawners)]
    try:
        for hub, _ in hubs.values():
            hub.start()
            for i in range(args.hub_users):
                hub.request("POST", f"/users/{user_name(i)}")
            for u in spawners:
                hub.create_user(u)
        phases: dict[str, list[Phase]] = {n: [] for n in hubs}
        for r in range(args.rounds):
            order = list(hubs) if r % 2 == 0 else list(reversed(hubs))
            for name in order:
                hub, options = hubs[name]
                phase, offset = Phase(), log_size(hub)
                until = time.monotonic() + args.seconds
                plan = [("GET /hub/api/users", f"{hub.api}/users", hub.admin_token)]
                cycles = [0]

                def cycle(user, hub=hub, options=options, phase=phase, until=until, cycles=cycles):
                    s = requests.Session()
                    s.headers["Authorization"] = f"token {hub.admin_token}"
                    url = f"{hub.api}/users/{user}/server"
                    while time.monotonic() < until:
                        t = time.perf_counter()
                        r = s.post(url, json={"user_options": options}, timeout=60)
                        phase.latency["POST .../server (start)"].append(time.perf_counter() - t)
                        if r.status_code not in (201, 202):
                            raise RuntimeError(f"start {user}: {r.status_code} {r.text}")
                        hub.wait_ready(user, "", timeout=180)
                        t = time.perf_counter()
                        r = s.delete(url, timeout=60)
                        phase.latency["DELETE .../server (stop)"].append(time.perf_counter() - t)
                        if r.status_code not in (202, 204):
                            raise RuntimeError(f"stop {user}: {r.status_code} {r.text}")
                        hub.wait_stopped(user, "", timeout=180)
                        cycles[0] += 1

                t0 = time.perf_counter()
                with concurrent.futures.ThreadPoolExecutor(len(spawners) + 1) as pool:
                    spawning = [pool.submit(cycle, u) for u in spawners]
                    pool.submit(hammer, plan, args.hub_clients, until, phase).result()
                    for f in spawning:
                        f.result()
                phase.wall = time.perf_counter() - t0
                phase.read_log(log_since(hub, offset), "gpulab.hub_loop")
                print(
                    f"round {r + 1} {name}: {len(phase.latency['GET /hub/api/users'])} lists, "
                    f"{cycles[0]} start/stop cycles in {phase.wall:.0f} s, "
                    f"{len(phase.held)} hub callbacks > {WATCH * 1000:.0f} ms"
                )
                phases[name].append(phase)
        print(
            f"\nhub: {args.hub_clients} clients listing {args.hub_users + args.spawners} users "
            f"without pause, {args.spawners} users starting and stopping their server, "
            f"{args.rounds} x {args.seconds:g} s per hub, image {IMAGE}"
        )
        report_latency(
            phases,
            list(hubs),
            ["GET /hub/api/users", "POST .../server (start)", "DELETE .../server (stop)"],
        )
        for side in hubs:
            held = [h for p in phases[side] for h in p.held]
            own = [h for h in held if h[1] > WATCH * 1000]
            worst = f", the worst {max(held)[0]:.1f} ms (CPU {max(held)[1]:.1f})" if held else ""
            gcs = [ms for p in phases[side] for _, ms, _ in p.gc]
            print(
                f"  {side} hub's event loop: {len(held)} callbacks over "
                f"{WATCH * 1000:.0f} ms ({len(own)} of them on the CPU that long){worst}; "
                f"{len(gcs)} garbage collections over it"
                + (f" (max {max(gcs):.0f} ms)" if gcs else "")
            )
        for side in hubs:
            print_held(side, [h for p in phases[side] for h in p.held])
    finally:
        for hub, _ in hubs.values():
            hub.stop()
            hub.remove_workloads()
        import docker  # plain DockerSpawner's containers carry no gpulab label: by name

        for c in docker.from_env().containers.list(all=True, filters={"name": "jupyter-s"}):
            c.remove(force=True)
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--only", choices=["service", "hub"], help="one part (default: both)")
    ap.add_argument("--seconds", type=float, default=60, help="each phase's length")
    ap.add_argument("--rounds", type=int, default=2, help="rounds (the hubs take turns)")
    ap.add_argument("--clients", type=int, default=50, help="the service's concurrent clients")
    ap.add_argument("--jobs-per-minute", type=float, default=20, help="short jobs submitted")
    ap.add_argument("--jobs", type=int, default=100_000, help="ended jobs on the loaded hub")
    ap.add_argument("--users", type=int, default=1000, help="their owners")
    ap.add_argument("--notebooks", type=int, default=200, help="notebooks on the loaded hub")
    ap.add_argument("--small", type=int, default=100, help="the user's ended jobs, on both")
    ap.add_argument("--hub-clients", type=int, default=20, help="clients listing the hub's users")
    ap.add_argument("--hub-users", type=int, default=100, help="users of each hub (hub part)")
    ap.add_argument("--spawners", type=int, default=4, help="users starting and stopping")
    args = ap.parse_args()
    if args.only in (None, "service"):
        service_part(args)
    if args.only in (None, "hub"):
        hub_part(args)


if __name__ == "__main__":
    main()
