"""Spawn benchmark: plain DockerSpawner vs gpulab's NotebookSpawner, in one run, same image.

    make bench            (or: .venv/bin/python bench/bench_spawn.py [--single 5] [--concurrent 20])

Two real hubs are started side by side (each with its proxy). Both spawn gpulab/python:3.11;
the NotebookSpawner request has no GPU and an empty workspace, and asks for 2 CPUs so that its
CPU quota does not slow the server's own start-up compared with the unlimited plain container.
Printed: the median time to ready of single spawns and their ratio, then N concurrent spawns
with each spawner: p50, p95 and wall time.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.hub import Hub  # noqa: E402

IMAGE = "gpulab/python:3.11"
PLAIN = f"""
c.JupyterHub.spawner_class = "docker"
c.DockerSpawner.image = "{IMAGE}"
c.DockerSpawner.remove = True
c.DockerSpawner.name_template = "{{prefix}}-{{username}}--{{servername}}"
c.Spawner.http_timeout = 120
c.Spawner.start_timeout = 300
"""
GPULAB = """
c.Spawner.http_timeout = 120
c.Spawner.start_timeout = 300
"""
GPULAB_OPTIONS = {"framework": "python", "cpus": 2, "memory": "2G", "gpus": 0}


def time_to_ready(hub: Hub, user: str, server: str, options: dict | None) -> float:
    t0 = time.perf_counter()
    r = hub.spawn(user, server, options or {})
    if r.status_code not in (201, 202):
        raise RuntimeError(f"spawn {user}/{server}: {r.status_code} {r.text}")
    while True:
        model = hub.server_model(user, server)
        if model and model.get("ready"):
            return time.perf_counter() - t0
        if not model or not model.get("pending"):
            raise RuntimeError(f"spawn {user}/{server} failed:\n{hub.tail(30)}")
        time.sleep(0.05)


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    k = max(0, min(len(values) - 1, round(p / 100 * (len(values) - 1))))
    return values[k]


def stop_all(hub: Hub, users: list[str], server: str) -> None:
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda u: hub.stop_server(u, server), users))


def concurrent_round(hub: Hub, users: list[str], options) -> tuple[list[float], float]:
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(users)) as pool:
        times = list(pool.map(lambda u: time_to_ready(hub, u, "c", options), users))
    wall = time.perf_counter() - t0
    stop_all(hub, users, "c")
    return times, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--single", type=int, default=5, help="single spawns per spawner")
    ap.add_argument("--concurrent", type=int, default=20, help="spawns at once per spawner")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="gpulab-bench-"))
    plain = Hub(workdir=work / "plain", extra_config=PLAIN)
    gpulab = Hub(workdir=work / "gpulab", extra_config=GPULAB)
    hubs = {"DockerSpawner": (plain, None), "NotebookSpawner": (gpulab, GPULAB_OPTIONS)}
    try:
        for hub, _ in hubs.values():
            hub.start()
        users = [f"u{i}" for i in range(args.concurrent)]
        for hub, _ in hubs.values():
            for u in ["solo", *users]:
                hub.create_user(u)

        # warm-up: first spawn pays for cold caches (image layers, python imports)
        for hub, opts in hubs.values():
            time_to_ready(hub, "solo", "warm", opts)
            hub.stop_server("solo", "warm")

        single: dict[str, list[float]] = {name: [] for name in hubs}
        for i in range(args.single):  # alternate, so both see the same machine conditions
            for name, (hub, opts) in hubs.items():
                single[name].append(time_to_ready(hub, "solo", f"s{i}", opts))
                hub.stop_server("solo", f"s{i}")

        conc: dict[str, tuple[list[float], float]] = {}
        for name, (hub, opts) in hubs.items():
            conc[name] = concurrent_round(hub, users, opts)
    finally:
        for hub, _ in hubs.values():
            hub.stop()
            hub.remove_workloads()
        # plain DockerSpawner's containers carry no gpulab label: remove them by name
        import docker

        for c in docker.from_env().containers.list(all=True, filters={"name": "jupyter-"}):
            c.remove(force=True)

    med = {n: statistics.median(v) for n, v in single.items()}
    print(f"\nSingle spawn, time to ready (median of {args.single}, image {IMAGE})")
    for n, v in single.items():
        print(f"  {n:16s} median {med[n]:6.2f} s   all: {', '.join(f'{x:.2f}' for x in v)}")
    ratio = med["NotebookSpawner"] / med["DockerSpawner"]
    print(f"  ratio NotebookSpawner / DockerSpawner: {ratio:.3f}  (target <= 1.15)")

    print(f"\n{args.concurrent} concurrent spawns")
    print(f"  {'spawner':16s} {'p50':>7s} {'p95':>7s} {'max':>7s} {'wall':>7s}")
    for n, (times, wall) in conc.items():
        p50, p95_, top = pct(times, 50), pct(times, 95), max(times)
        print(f"  {n:16s} {p50:6.2f}s {p95_:6.2f}s {top:6.2f}s {wall:6.2f}s")
    p95 = pct(conc["NotebookSpawner"][0], 95) / pct(conc["DockerSpawner"][0], 95)
    wall = conc["NotebookSpawner"][1] / conc["DockerSpawner"][1]
    print(f"  ratio p95 {p95:.3f}, wall {wall:.3f}  (targets <= 1.10)")


if __name__ == "__main__":
    main()
