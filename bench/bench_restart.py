"""Restart benchmark: the gpulab service (then the whole hub) killed with SIGKILL while it
runs 200 jobs and up to 100 notebooks on one engine; how soon the new service answers, how
soon it has confirmed every job, and that nothing was lost or started twice.

    .venv/bin/python bench/bench_restart.py [--jobs 200] [--notebooks 100] [--users 10]
                                            [--anchor 2] [--no-hub-kill]

A real hub and the gpulab service it starts, on this machine's Docker engine. ``--users``
users (one network each: the engine's default pools hold ~31), each with their own token,
share the jobs (``sleep 3600`` on gpulab/debian:bookworm, 0.1 CPU, 64 MiB, no GPU) and the
notebooks (named servers spawned through the hub's REST API, 0.5 CPU, 256 MiB, in waves of
``--wave``; the waves stop early when the machine's available memory would fall under
``--reserve`` GiB, and the figure says how many ran and what each cost).

Side by side in one run:
- anchor: the same hub, before any workload: the service killed ``--anchor`` times;
- loaded: with every job RUNNING and every notebook ready, the service killed once.

Each kill: SIGKILL to the service's process; JupyterHub's poll of its managed service
(``jupyterhub/services/service.py`` ``_proc_stopped``: every 30 s, ±10 %) starts a new one.
Timed from that new process's start (its /proc start time): the first 200 of
``GET /api/jobs`` and of ``GET /api/jobs/<id>`` through the hub's proxy with a user's token;
then, with the API polled every 0.2 s meanwhile (its worst answer reported), the moment the
supervisor lease was taken (the dead one's runs out after ``supervisor_lease_ttl``) and the
moment the last job's state was confirmed against the engine (the service's log line
``job X: the service restarted in RUNNING, container running: attach``, one per job).

Invariants after each restart: every job RUNNING (API) with the same container (id, created,
started-at, restart count unchanged on the engine), no other container of the instance, every
job confirmed exactly once, the GPU ledger's rows consistent (tests/support/ledger.py) and
none held by a CPU job, every notebook ready in the hub and RUNNING in the service, its
container the same. Then (unless --no-hub-kill) the hub, its proxy and the service are killed
together and the hub started again; the same figures and invariants. Everything the run made
(containers, volumes, networks) is removed at the end, on failure too.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import re
import signal
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import docker
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.hub import Hub  # noqa: E402

IMAGE = "gpulab/debian:bookworm"
SMALL = {"gpus": 0, "cpus": 0.1, "memory": "64M"}
#: a notebook's CPU limit only matters while it starts (idle, it uses none): at 0.1 CPU on this
#: 2-core machine under load the editor missed the spawner's 30 s http_timeout
NOTEBOOK = {"gpus": 0, "cpus": 0.5, "memory": "256M"}
COMMAND = ["sleep", "3600"]
CONFIRMED = re.compile(
    r"^\[I (\S+ \S+) gpulab\.jobs\S*\] job (\S+): the service restarted in (\w+), "
    r"container (\w+): (\S+)"
)
LEASE = re.compile(r"^\[I (\S+ \S+) gpulab\.jobs\.supervisor\] supervisor lease taken")
LISTENING = re.compile(r"^\[I (\S+ \S+) gpulab\.service\] gpulab service \S+ listening")


def log_time(stamp: str) -> float:
    """The service's log timestamp (logging's asctime, local time) as epoch seconds."""
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def proc_start(pid: int) -> float:
    """When process ``pid`` started, epoch seconds (its /proc stat, in clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[19])  # starttime: field 22 of stat, 20th after the command's ")"
    btime = next(
        int(line.split()[1])
        for line in Path("/proc/stat").read_text().splitlines()
        if line.startswith("btime")
    )
    return btime + ticks / os.sysconf("SC_CLK_TCK")


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable")


def container_rss(api: docker.APIClient, instance: str, kind: str) -> list[int]:
    """Each running container of ``kind``'s resident memory, from its cgroup (v1: memory.stat
    total_rss; v2: memory.current), in bytes; [] where the cgroup is not readable here."""
    out = []
    for c in api.containers(
        filters={"label": [f"org.gpulab.instance={instance}", f"org.gpulab.kind={kind}"]}
    ):
        v1 = Path(f"/sys/fs/cgroup/memory/docker/{c['Id']}/memory.stat")
        v2 = Path(f"/sys/fs/cgroup/system.slice/docker-{c['Id']}.scope/memory.current")
        with contextlib.suppress(OSError, StopIteration):
            if v1.exists():
                stat = v1.read_text().splitlines()
                out.append(int(next(x.split()[1] for x in stat if x.startswith("total_rss "))))
            elif v2.exists():
                out.append(int(v2.read_text()))
    return out


def load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def engine_view(api: docker.APIClient, instance: str) -> dict[str, tuple]:
    """Every job's and notebook's container of the instance: name -> (id, created, started
    at, restarts, running)."""
    out = {}
    for c in api.containers(all=True, filters={"label": f"org.gpulab.instance={instance}"}):
        if c["Labels"].get("org.gpulab.kind") not in ("job", "notebook"):
            continue  # a sync helper comes and goes with a live push
        info = api.inspect_container(c["Id"])
        out[info["Name"].lstrip("/")] = (
            info["Id"],
            info["Created"],
            info["State"]["StartedAt"],
            info["RestartCount"],
            info["State"]["Running"],
        )
    return out


class Bench:
    def __init__(self, hub: Hub, tokens: dict[str, str]):
        self.hub, self.tokens = hub, tokens
        self.api = f"{hub.url}/services/gpulab/api"
        self.users = sorted(tokens)

    def get(self, path: str, user: str, **kw) -> requests.Response:
        return requests.get(
            f"{self.api}{path}",
            headers={"Authorization": f"token {self.tokens[user]}"},
            timeout=kw.pop("timeout", 60),
            **kw,
        )

    # --- workloads -------------------------------------------------------------------------

    def submit_jobs(self, n: int) -> dict[str, str]:
        """``n`` sleep jobs, spread over the users; job id -> owner, once all are RUNNING."""

        def one(i: int) -> tuple[str, str]:
            user = self.users[i % len(self.users)]
            body = {"image": IMAGE, "command": COMMAND, "resources": SMALL}
            r = requests.post(
                f"{self.api}/jobs",
                json=body,
                headers={"Authorization": f"token {self.tokens[user]}"},
                timeout=120,
            )
            r.raise_for_status()
            return r.json()["id"], user

        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            jobs = dict(pool.map(one, range(n)))
        deadline = time.monotonic() + 400
        while self.running_jobs() < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"not all {n} jobs RUNNING after 400 s:\n{self.hub.tail(40)}")
            time.sleep(1)
        print(f"{n} jobs RUNNING after {time.perf_counter() - t0:.0f} s ({load()})", flush=True)
        return jobs

    def running_jobs(self) -> int:
        total = 0
        for user in self.users:
            r = self.get("/jobs", user, params={"state": "RUNNING", "limit": 1})
            r.raise_for_status()
            total += r.json()["total"]
        return total

    def spawn_notebooks(self, n: int, wave: int, reserve: int, budget: float) -> list[tuple]:
        """Up to ``n`` named servers, ``wave`` at a time, each wave ready before the next;
        stops before a wave that would leave less than ``reserve`` bytes available (by what
        the waves so far cost) or once ``budget`` seconds are spent."""
        hub, servers, failed = self.hub, [], 0
        before = mem_available()
        t0 = time.perf_counter()
        while len(servers) < n:
            per = (before - mem_available()) / len(servers) if servers else 0
            k = min(wave, n - len(servers))
            if servers and mem_available() - k * per < reserve:
                print(f"notebooks: stopping at {len(servers)}: memory reserve reached")
                break
            if time.perf_counter() - t0 > budget:
                print(f"notebooks: stopping at {len(servers)}: time budget of {budget:.0f} s")
                break
            batch = [
                (self.users[i % len(self.users)], f"nb{i // len(self.users)}")
                for i in range(len(servers), len(servers) + k)
            ]

            def one(server: tuple[str, str]) -> bool:
                r = hub.spawn(*server, NOTEBOOK)  # the hub answers after up to 10 s
                if r.status_code not in (201, 202):
                    print(f"  {server}: {r.status_code} {r.text[:300]}")
                    return False
                try:
                    hub.wait_ready(*server, timeout=300)
                except Exception as e:
                    print(f"  {server}: not ready: {str(e)[:300]}")
                    return False
                return True

            with concurrent.futures.ThreadPoolExecutor(len(batch)) as pool:
                ready = list(pool.map(one, batch))
            failed += ready.count(False)
            servers += [b for b, ok in zip(batch, ready, strict=True) if ok]
            if failed:
                print(f"notebooks: stopping at {len(servers)}: {failed} spawns failed")
                break
            print(
                f"  {len(servers)} notebooks ready after {time.perf_counter() - t0:.0f} s; "
                f"{(before - mem_available()) / len(servers) / 2**20:.0f} MiB each; "
                f"{mem_available() / 2**30:.1f} GiB available ({load()})",
                flush=True,
            )
        cost = (before - mem_available()) / max(1, len(servers))
        return servers, cost

    # --- one restart -----------------------------------------------------------------------

    def restart(
        self, jobs: dict[str, str], kill_hub: bool, notebooks: list[tuple] = ()
    ) -> dict[str, float]:
        hub = self.hub
        log_from = hub.log_file.stat().st_size
        user = self.users[0]
        sample = next((j for j, u in jobs.items() if u == user), None)
        old = hub.service_pid()
        t_kill = time.time()
        if kill_hub:
            hub.kill()
            hub.start(timeout=180, service=False)
        else:
            os.kill(old, signal.SIGKILL)
        # the new process (the hub's poll of its managed service starts it)
        deadline = time.monotonic() + 120
        pid = None
        while pid is None:
            with contextlib.suppress(RuntimeError):
                found = hub.service_pid()
                if found != old:
                    pid = found
            if time.monotonic() > deadline:
                raise TimeoutError(f"no new service process:\n{hub.tail(40)}")
            time.sleep(0.05)
        started = proc_start(pid)
        paths = ["/jobs?limit=20"] + ([f"/jobs/{sample}"] if sample else [])
        first: dict[str, float] = {}
        while len(first) < len(paths):
            for p in paths:
                if p in first:
                    continue
                with contextlib.suppress(requests.RequestException):
                    if self.get(p, user, timeout=5).status_code == 200:
                        first[p] = time.time()
            if time.monotonic() > deadline:
                raise TimeoutError(f"the API did not answer:\n{hub.tail(40)}")
            time.sleep(0.02)
        serving = max(first.values()) - started
        # meanwhile the API keeps answering: polled until every job is confirmed
        worst, lease_at, done_at = 0.0, None, None
        deadline = time.monotonic() + 180
        while True:
            confirmed: dict[str, list] = {}  # the log read again from the kill on
            t = time.perf_counter()
            r = self.get(paths[-1], user, timeout=30)
            assert r.status_code == 200, (r.status_code, r.text[:200])
            worst = max(worst, time.perf_counter() - t)
            with open(hub.log_file, "rb") as f:
                f.seek(log_from)
                text = f.read().decode(errors="replace")
            for line in text.splitlines():
                if m := LEASE.match(line):
                    lease_at = log_time(m.group(1))
                elif m := CONFIRMED.match(line):
                    confirmed.setdefault(m.group(2), []).append((log_time(m.group(1)), m.groups()))
            if lease_at is not None and all(j in confirmed for j in jobs):
                done_at = max([lease_at, *(v[0][0] for v in confirmed.values())])
                break
            if time.monotonic() > deadline:
                missing = [j for j in jobs if j not in confirmed]
                raise TimeoutError(f"{len(missing)} jobs not confirmed:\n{hub.tail(40)}")
            time.sleep(0.2)
        twice = {j: v for j, v in confirmed.items() if len(v) > 1}
        assert not twice, f"jobs confirmed more than once: {twice}"
        steps = {v[0][1][2:] for v in confirmed.values()}
        assert steps <= {("RUNNING", "running", "attach")}, steps
        return {
            "restart_delay": started - t_kill,
            "serving": serving,
            "lease": lease_at - started,
            "reconciled": done_at - started,
            "after_lease": done_at - lease_at,
            "worst_get": worst,
        }

    # --- invariants ------------------------------------------------------------------------

    def check(self, jobs: dict[str, str], notebooks: list[tuple], before: dict) -> None:
        hub = self.hub
        after = engine_view(docker.APIClient(), hub.instance)
        assert after == before, {
            n: (before.get(n), after.get(n))
            for n in set(before) | set(after)
            if before.get(n) != after.get(n)
        }
        assert all(v[4] for v in after.values()), "a container is not running"
        for job_id, user in jobs.items():
            j = self.get(f"/jobs/{job_id}", user).json()
            assert j["state"] == "RUNNING", (job_id, j["state"], j["message"])
            runs = [
                e for e in j["history"] if e["state"] == "RUNNING" and e["kind"] == "transition"
            ]
            assert len(runs) == 1, (job_id, "RUNNING entered", len(runs), "times")
        for user, name in notebooks:
            model = hub.server_model(user, name)
            assert model and model.get("ready"), (user, name, model)
            nb = self.get(f"/notebooks/{user}/{name}", user).json()
            assert nb["state"] == "RUNNING", (user, name, nb["state"])
        # the ledger's rows: consistent, and none for these CPU-only workloads
        from gpulab.db import Database
        from tests.support.ledger import check_ledger_invariants

        found = sorted(hub.workdir.rglob("gpulab.sqlite"))
        assert len(found) == 1, found
        db = Database(f"sqlite:///{found[0]}")
        rows = check_ledger_invariants(db, hub.instance, {})
        assert rows == [], rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=200, help="running jobs")
    ap.add_argument("--notebooks", type=int, default=100, help="running notebooks (at most)")
    ap.add_argument("--users", type=int, default=10, help="users sharing them")
    ap.add_argument("--wave", type=int, default=10, help="notebooks spawned at once")
    ap.add_argument("--reserve", type=float, default=3.0, help="GiB kept available")
    ap.add_argument("--budget", type=float, default=300, help="seconds for the notebooks")
    ap.add_argument("--anchor", type=int, default=2, help="restarts of the empty platform")
    ap.add_argument("--no-hub-kill", action="store_true", help="skip the whole hub's kill")
    args = ap.parse_args()
    per_user = -(-args.notebooks // args.users)
    config = (
        "c.GpulabSettings.job_container_retention = 3600\n"
        'c.GpulabSettings.job_quota = {"gpus": None, "jobs": None}\n'
        f"c.GpulabSettings.max_job_workers = {min(64, -(-args.jobs // args.users))}\n"
        f"c.GpulabSettings.max_queued_jobs = {args.jobs}\n"
        f"c.GpulabSettings.allowed_images = [{IMAGE!r}, 'gpulab/python:3.11']\n"
        f"c.JupyterHub.named_server_limit_per_user = {per_user + 1}\n"
        f"c.JupyterHub.active_server_limit = {args.notebooks + args.users}\n"
        # a hub's start polls every server: the default's time-outs are for a live site
        "c.JupyterHub.init_spawners_timeout = 60\n"
        "c.NotebookSpawner.http_timeout = 120\n"
        # the hub's own give-up (60 s by default) came first at a load average of 25
        "c.NotebookSpawner.start_timeout = 300\n"
        # a user's notebooks together: 0.5 CPU each (the default allows 2 CPUs a user)
        f'c.GpulabSettings.max_resources = {{"cpus": {per_user}, "memory": "16G", "gpus": 2}}\n'
    )
    hub = Hub(workdir=Path(tempfile.mkdtemp(prefix="gpulab-bench-restart-")), extra_config=config)
    t_run = time.perf_counter()
    try:
        hub.start(timeout=120)
        tokens = {f"r{i:02d}": hub.create_user(f"r{i:02d}") for i in range(args.users)}
        bench = Bench(hub, tokens)
        print(f"hub up ({load()})", flush=True)
        anchors = []
        for i in range(args.anchor):
            anchors.append(bench.restart({}, kill_hub=False))
            print(f"anchor {i + 1}: {anchors[-1]}", flush=True)
        jobs = bench.submit_jobs(args.jobs)
        notebooks, cost = bench.spawn_notebooks(
            args.notebooks, args.wave, int(args.reserve * 2**30), args.budget
        )
        before = engine_view(docker.APIClient(), hub.instance)
        rss = sorted(container_rss(docker.APIClient(), hub.instance, "notebook"))
        job_rss = sorted(container_rss(docker.APIClient(), hub.instance, "job"))
        print(f"engine: {len(before)} containers of the instance ({load()})", flush=True)
        loaded = bench.restart(jobs, kill_hub=False)
        print(f"loaded: {loaded} ({load()})", flush=True)
        bench.check(jobs, notebooks, before)
        print("invariants after the service's kill: hold", flush=True)
        whole = None
        if not args.no_hub_kill:
            whole = bench.restart(jobs, kill_hub=True)
            print(f"hub + service: {whole} ({load()})", flush=True)
            bench.check(jobs, notebooks, before)
            print("invariants after the whole hub's kill: hold", flush=True)
        anchor = {k: min(a[k] for a in anchors) for k in anchors[0]} if anchors else None
        print(
            f"\n{len(jobs)} running jobs, {len(notebooks)} running notebooks "
            f"({cost / 2**20:.0f} MiB less available memory each), {args.users} users"
        )
        for what, got in (("notebook", rss), ("job", job_rss)):
            if got:
                print(
                    f"{what} containers' resident memory (cgroup): median "
                    f"{got[len(got) // 2] / 2**20:.0f} MiB, max {got[-1] / 2**20:.0f} MiB, "
                    f"{sum(got) / 2**30:.2f} GiB for {len(got)}"
                )
        print(
            "| restart | new process after the kill | API serving (first 200) | lease taken | "
            "every job confirmed | worst GET meanwhile |"
        )
        print("| --- | --- | --- | --- | --- | --- |")
        rows = [(f"empty platform (best of {len(anchors)})", anchor), ("service, loaded", loaded)]
        if whole:
            rows.append(("hub + service, loaded", whole))
        for name, r in rows:
            if r is None:
                continue
            print(
                f"| {name} | {r['restart_delay']:.1f} s | {r['serving']:.2f} s | "
                f"{r['lease']:.1f} s | {r['reconciled']:.1f} s ({r['after_lease']:.2f} s after "
                f"the lease) | {r['worst_get'] * 1000:.0f} ms |"
            )
        if anchor:
            print(f"serving ratio loaded / empty: {loaded['serving'] / anchor['serving']:.2f}")
        print(f"run: {time.perf_counter() - t_run:.0f} s; {load()}")
    finally:
        hub.stop()
        hub.remove_workloads()
        left = docker.from_env().containers.list(
            all=True, filters={"label": f"org.gpulab.instance={hub.instance}"}
        )
        print(f"clean-up: {len(left)} containers of the instance left")


if __name__ == "__main__":
    main()
