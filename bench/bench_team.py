"""Team benchmark: 50 users, each with a running job at once, on an engine whose address pools
are configured as docs/scale-out.md says (one network per user).

    .venv/bin/python bench/bench_team.py [--users 50] [--rounds 2]

The engine: a Docker engine in a container (tests/support/gpu_host.py, the tests' stand-in
GPU server) started with ``--default-address-pool base=10.201.0.0/16,size=24``, daemon.json's
``{"default-address-pools": [{"base": "10.201.0.0/16", "size": 24}]}`` (256 networks). This
machine's own engine keeps Docker's built-in pools (31 networks, shared with every test),
which could not hold 50 users. The image gpulab/debian:bookworm is copied into it.

Side by side, in each round, taking turns (which goes first alternates):
- gpulab: a real hub and its service on that engine (DOCKER_HOST); each user submits one job
  (``sleep``, no GPU, 0.1 CPU, 64 MiB) with their own token, all at once; timed from the
  first submission until the API lists all of them RUNNING at the same moment.
- by hand: what a user does without gpulab on the same engine: ``docker network create`` and
  ``docker run -d --network`` (same limits, same image, same command) per user, all at once.

After each side's run every user's networks on the engine are counted (each user: exactly
one), then everything is removed before the next. At the end the engine is removed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import docker
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.gpu_host import GpuHost  # noqa: E402
from tests.support.hub import Hub  # noqa: E402

IMAGE = "gpulab/debian:bookworm"
#: the documented pools (docs/scale-out.md#address-pools), as dockerd's flag writes them
POOLS = "base=10.201.0.0/16,size=24"
SMALL = {"gpus": 0, "cpus": 0.1, "memory": "64M"}
COMMAND = ["sleep", "3600"]
USER_LABEL = "org.gpulab.user"


def ts(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def networks_per_user(engine: docker.APIClient, users: list[str], label: str) -> dict[str, int]:
    """How many networks of the engine each user holds (by the label ``label`` naming them)."""
    counts = dict.fromkeys(users, 0)
    for n in engine.networks():
        owner = (n.get("Labels") or {}).get(label)
        if owner in counts:
            counts[owner] += 1
    return counts


def running_on(engine: docker.APIClient, label: str) -> int:
    return len(engine.containers(filters={"label": label, "status": "running"}))


def wait_until(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    raise TimeoutError(what)


# --- gpulab -----------------------------------------------------------------------------------


def gpulab_round(hub: Hub, engine: docker.APIClient, tokens: dict[str, str]) -> dict:
    api = f"{hub.url}/services/gpulab/api"
    admin = {"Authorization": f"token {hub.admin_token}"}

    def submit(user: str) -> str:
        body = {"image": IMAGE, "command": COMMAND, "resources": SMALL}
        r = requests.post(
            f"{api}/jobs",
            json=body,
            headers={"Authorization": f"token {tokens[user]}"},
            timeout=120,
        )
        r.raise_for_status()
        return r.json()["id"]

    def running() -> int:
        r = requests.get(
            f"{api}/jobs",
            params={"all": "true", "state": "RUNNING", "limit": "1"},
            headers=admin,
            timeout=60,
        )
        r.raise_for_status()
        return r.json()["total"]

    users = sorted(tokens)
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(users)) as pool:
        ids = list(pool.map(submit, users))
    submitted = time.perf_counter() - t0
    deadline = time.monotonic() + 600
    while running() < len(users):
        if time.monotonic() > deadline:
            raise TimeoutError(f"not all RUNNING after 600 s:\n{hub.tail(40)}")
        time.sleep(0.2)
    wall = time.perf_counter() - t0
    instance = f"org.gpulab.instance={hub.instance}"
    at_once = running_on(engine, instance)
    nets = networks_per_user(engine, users, USER_LABEL)
    jobs = [requests.get(f"{api}/jobs/{i}", headers=admin, timeout=60).json() for i in ids]
    starts = [
        {e["state"]: ts(e["at"]) for e in j["history"]}["RUNNING"] - ts(j["history"][0]["at"])
        for j in jobs
    ]
    # tear down: interrupt, then wait until the containers and every user's network are gone
    for i in ids:
        requests.post(f"{api}/jobs/{i}/interrupt", headers=admin, timeout=60)
    wait_until(
        lambda: not engine.containers(all=True, filters={"label": instance}),
        300,
        "gpulab's containers were not removed",
    )
    wait_until(
        lambda: not engine.networks(filters={"label": instance}),
        300,
        "gpulab's networks were not removed",
    )
    return {
        "wall": wall,
        "submitted": submitted,
        "at_once": at_once,
        "nets": nets,
        "start_p50": statistics.median(starts),
        "start_max": max(starts),
    }


# --- by hand ----------------------------------------------------------------------------------


def by_hand_round(host: GpuHost, engine: docker.APIClient, users: list[str]) -> dict:
    tag = "bench-team-" + secrets.token_hex(3)
    cli = ["docker", "-H", host.socket]

    def one(user: str) -> None:
        net = f"{tag}-net-{user}"
        labels = ["--label", f"{tag}=1", "--label", f"{tag}.user={user}"]
        subprocess.run([*cli, "network", "create", *labels, net], check=True, capture_output=True)
        subprocess.run(
            [*cli, "run", "-d", "--name", f"{tag}-{user}", "--network", net, *labels]
            + ["--cpus", str(SMALL["cpus"]), "--memory", "64m", IMAGE, *COMMAND],
            check=True,
            capture_output=True,
        )

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(users)) as pool:
        list(pool.map(one, users))
    wall = time.perf_counter() - t0
    at_once = running_on(engine, f"{tag}=1")
    nets = networks_per_user(engine, users, f"{tag}.user")
    for c in engine.containers(all=True, filters={"label": f"{tag}=1"}):
        engine.remove_container(c["Id"], force=True)
    for n in engine.networks(filters={"label": f"{tag}=1"}):
        engine.remove_network(n["Id"])
    return {"wall": wall, "at_once": at_once, "nets": nets}


# --- both -------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--users", type=int, default=50, help="users, each with one job at once")
    ap.add_argument("--rounds", type=int, default=2, help="rounds, the two sides taking turns")
    args = ap.parse_args()
    users = [f"user{i:02d}" for i in range(args.users)]

    host_client = docker.from_env()
    work = Path(tempfile.mkdtemp(prefix="gpulab-bench-team-"))
    host = GpuHost(work / "engine", "gpulab-bench-team-" + secrets.token_hex(3), address_pool=POOLS)
    hub = None
    try:
        host.start(host_client)
        host.load_image(host_client, IMAGE)
        engine = host.client()
        hub = Hub(
            workdir=work / "hub",
            extra_config=(
                "c.GpulabSettings.supervisor_interval = 0.1\n"
                "c.GpulabSettings.job_container_retention = 0\n"
                f"c.GpulabSettings.allowed_images = [{IMAGE!r}]\n"
                f"c.JupyterHub.active_server_limit = {args.users}\n"
                # the engine's bridge is inside its container: the hub listens on this host's
                # loopback instead (sleep jobs never call it)
                'c.JupyterHub.hub_ip = c.JupyterHub.hub_connect_ip = "127.0.0.1"\n'
            ),
        )
        hub.env["DOCKER_HOST"] = host.socket  # the hub's engine, handed to its service
        hub.start(timeout=120)
        warned = "the address pools of the engine" in hub.log_file.read_text()
        tokens = {u: hub.create_user(u) for u in users}
        rows = []
        for r in range(args.rounds):
            order = ("gpulab", "hand") if r % 2 == 0 else ("hand", "gpulab")
            row = {}
            for side in order:
                if side == "gpulab":
                    row[side] = gpulab_round(hub, engine, tokens)
                else:
                    row[side] = by_hand_round(host, engine, users)
                got = row[side]
                per_user = sorted(set(got["nets"].values()))
                print(
                    f"round {r + 1} {side:6}: {got['at_once']} running at once after "
                    f"{got['wall']:.1f} s; networks per user {per_user}",
                    flush=True,
                )
            rows.append(row)
        print(f"\n{args.users} users, each with one running workload at once")
        print(f"engine: Docker {engine.version()['Version']} in a container, pools {POOLS}")
        print(f"start-up warning in the hub's log: {'yes' if warned else 'none'}")
        print("| round | gpulab: all RUNNING | by hand: all running | ratio gpulab / by hand |")
        print("| --- | --- | --- | --- |")
        for i, row in enumerate(rows, 1):
            g, h = row["gpulab"], row["hand"]
            print(
                f"| {i} | {g['wall']:.1f} s (submitted in {g['submitted']:.1f} s; "
                f"QUEUED to RUNNING p50 {g['start_p50']:.1f} s, max {g['start_max']:.1f} s) | "
                f"{h['wall']:.1f} s | {g['wall'] / h['wall']:.2f} |"
            )
        ratios = [row["gpulab"]["wall"] / row["hand"]["wall"] for row in rows]
        print(f"median ratio: {statistics.median(ratios):.2f}")
        ok = all(
            row[s]["at_once"] == args.users and set(row[s]["nets"].values()) == {1}
            for row in rows
            for s in row
        )
        print(f"every round: {args.users} running at once, one network per user: {ok}")
    finally:
        if hub is not None:
            hub.stop()
        host.stop()


if __name__ == "__main__":
    main()
