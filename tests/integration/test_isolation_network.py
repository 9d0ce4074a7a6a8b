"""Network isolation between users, against a real hub, the service's jobs and the engine.

The attack: a job (or a notebook) of one user opens a TCP connection to another user's
notebook container (its Jupyter server port), which on one shared bridge simply works. With a
network per user it must time out, while the user's own workloads still reach each other and
every notebook still reaches the hub API.
"""

from __future__ import annotations

import time

import pytest
import requests

pytestmark = [pytest.mark.docker, pytest.mark.hub]

# prints "<host:port> OPEN" or "<host:port> CLOSED <why>" for each argument
PROBE = """
import socket, sys
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect((host, int(port)))
        print(target, "OPEN")
    except OSError as e:
        print(target, "CLOSED", type(e).__name__)
    finally:
        s.close()
"""
HUB_API_CHECK = """
import json, os, urllib.request
with urllib.request.urlopen(os.environ["JUPYTERHUB_API_URL"] + "/", timeout=5) as r:
    print("HUB", r.status, json.load(r)["version"])
"""
OPTIONS = {"framework": "python", "flavor": "cpu-small"}
RESOURCES = {"gpus": 0, "cpus": 0.5, "memory": "512M"}
TERMINAL = {"DONE", "FAILED", "ERROR", "INTERRUPTED", "SYNC_FAILED"}


@pytest.fixture(scope="module")
def hub(hub_with):
    return hub_with()


def labelled(docker_client, hub, user: str, kind: str):
    labels = [f"org.gpulab.instance={hub.instance}", f"org.gpulab.user={user}"]
    return docker_client.containers.list(
        all=True, filters={"label": [*labels, f"org.gpulab.kind={kind}"]}
    )


def networks_of(container) -> dict[str, str]:
    """{network name: the container's IP on it}"""
    container.reload()
    nets = container.attrs["NetworkSettings"]["Networks"]
    return {name: n["IPAddress"] for name, n in nets.items()}


def probe(results: str) -> dict[str, str]:
    return {line.split()[0]: line.split()[1] for line in results.splitlines() if line.strip()}


def run_in(container, code: str, *args: str) -> str:
    code_, out = container.exec_run(["python3", "-c", code, *args])
    assert code_ == 0, out
    return out.decode()


def submit_job(hub, token: str, **body) -> dict:
    body.setdefault("resources", RESOURCES)
    r = requests.post(
        f"{hub.url}/services/gpulab/api/jobs",
        json=body,
        headers={"Authorization": f"token {token}"},
        timeout=60,
    )
    assert r.status_code == 201, r.text
    return r.json()


def wait_job(hub, token: str, job_id: str, timeout: float = 90) -> dict:
    url = f"{hub.url}/services/gpulab/api/jobs/{job_id}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = requests.get(url, headers={"Authorization": f"token {token}"}, timeout=30).json()
        if job["state"] in TERMINAL:
            return job
        time.sleep(0.2)
    raise TimeoutError(f"job {job_id} not finished: {job['state']}\n{hub.tail(40)}")


def job_logs(hub, token: str, job_id: str) -> str:
    url = f"{hub.url}/services/gpulab/api/jobs/{job_id}/logs"
    return requests.get(url, headers={"Authorization": f"token {token}"}, timeout=30).text


def test_users_cannot_connect_to_each_others_containers(hub, docker_client):
    tokens = {u: hub.create_user(u) for u in ("neta", "netb")}
    for user in tokens:
        r = hub.spawn(user, "", OPTIONS, token=tokens[user])
        assert r.status_code in (201, 202), r.text
    for user in tokens:
        hub.wait_ready(user, "")  # the notebook's server registered with the hub API
    (nb_a,) = labelled(docker_client, hub, "neta", "notebook")
    (nb_b,) = labelled(docker_client, hub, "netb", "notebook")
    ips_a, ips_b = networks_of(nb_a), networks_of(nb_b)
    target_a = [f"{ip}:8888" for ip in ips_a.values()]
    target_b = [f"{ip}:8888" for ip in ips_b.values()]

    # the attack from B's job: connect to A's Jupyter server; and B's own notebook
    job = submit_job(hub, tokens["netb"], command=["python3", "-c", PROBE, *target_a, *target_b])
    done = wait_job(hub, tokens["netb"], job["id"])
    assert done["state"] == "DONE", done
    seen = probe(job_logs(hub, tokens["netb"], job["id"]))
    assert all(seen[t] == "CLOSED" for t in target_a), seen  # another user's: unreachable
    assert all(seen[t] == "OPEN" for t in target_b), seen  # the user's own: reachable

    # the same attack from B's notebook, and from A's notebook towards B's
    seen = probe(run_in(nb_b, PROBE, *target_a))
    assert set(seen.values()) == {"CLOSED"}, seen
    seen = probe(run_in(nb_a, PROBE, *target_b))
    assert set(seen.values()) == {"CLOSED"}, seen

    # each notebook still reaches the hub API (on the docker0 gateway, a host address)
    assert run_in(nb_a, HUB_API_CHECK).startswith("HUB 200")

    # how: one network per user, the only one each workload joins (not the default bridge)
    net_a, net_b = f"{hub.instance}-net-neta", f"{hub.instance}-net-netb"
    assert list(ips_a) == [net_a] and list(ips_b) == [net_b]
    (job_b,) = labelled(docker_client, hub, "netb", "job")
    assert list(networks_of(job_b)) == [net_b]
    assert docker_client.networks.get(net_a).attrs["Labels"] == {
        "org.gpulab.instance": hub.instance,
        "org.gpulab.kind": "network",
        "org.gpulab.user": "neta",
        "org.gpulab.version": nb_a.labels["org.gpulab.version"],
    }
    # no port of a notebook is published on the host: the proxy reaches its network IP
    assert not nb_a.attrs["HostConfig"].get("PortBindings")

    # a user's network goes with their last container; B's stays for B's retained job
    hub.stop_server("neta", "")
    assert not docker_client.networks.list(names=[net_a])
    hub.stop_server("netb", "")
    assert [n.name for n in docker_client.networks.list(names=[net_b])] == [net_b]


def test_a_network_that_cannot_be_had_is_a_clear_error(hub, docker_client):
    """A name taken by a network gpulab did not make (as when the engine's address pools are
    exhausted) fails the spawn and the job with a message that says why, not a crash."""
    token = hub.create_user("netc")
    name = f"{hub.instance}-net-netc"
    squatter = docker_client.networks.create(name, labels={"org.gpulab.instance": "someone"})
    try:
        r = hub.spawn("netc", "", OPTIONS, token=token)
        assert r.status_code in (201, 202, 500, 503), r.text
        nb = hub.wait_state("netc", "", "ERROR")
        assert nb["history"][-1]["reason"] == "NETWORK_UNAVAILABLE", nb
        assert name in nb["history"][-1]["message"]
        assert not labelled(docker_client, hub, "netc", "notebook")

        job = submit_job(hub, token, command=["true"])
        end = wait_job(hub, token, job["id"])
        assert end["state"] == "ERROR" and end["reason"] == "NETWORK_UNAVAILABLE", end
        assert name in end["message"] and "not created by this gpulab" in end["message"]
    finally:
        squatter.remove()


RACER = """
import sys, time
import docker
from gpulab.runtime.network import ensure_user_network
api = docker.APIClient(version="auto")
api.ping()
time.sleep(max(0.0, float(sys.argv[3]) - time.time()))  # all racers start together
print(ensure_user_network(api, sys.argv[1], sys.argv[2]))
"""


def test_racing_processes_end_with_one_network_removed_after_the_last_container(docker_client):
    """Hub and service (or two spawns) may make a user's network at the same moment: Engine
    20.10 then makes several of one name. Whatever each racer joined, one network is left, and
    it is removed only once no container of the user is left, running or not."""
    import secrets
    import subprocess
    import sys

    import docker

    from gpulab.names import user_network_name
    from gpulab.runtime.network import (
        ensure_user_network,
        prune_user_networks,
        remove_user_network_if_unused,
    )

    instance, user = "t" + secrets.token_hex(4), "Race User"
    name = user_network_name(instance, user)
    assert name == f"{instance}-net--52ace-20-55ser"  # escaped: no name can collide
    api = docker.APIClient(version="auto")
    try:
        at = str(time.time() + 2)
        racers = [
            subprocess.Popen(
                [sys.executable, "-c", RACER, instance, user, at], stdout=subprocess.PIPE, text=True
            )
            for _ in range(6)
        ]
        joined = {p.communicate(timeout=60)[0].strip() for p in racers}
        assert all(p.returncode == 0 for p in racers)
        left = docker_client.networks.list(names=[name])
        assert [n.name for n in left] == [name]
        assert left[0].id in joined  # the one that stays is one that a racer was given
        assert ensure_user_network(api, instance, user) == left[0].id  # and the one given now
        # a created (never started) container of the user keeps the network
        labels = {"org.gpulab.instance": instance, "org.gpulab.user": user}
        c = docker_client.containers.create(
            "gpulab/python:3.11", ["true"], labels=labels, network=left[0].id
        )
        assert remove_user_network_if_unused(api, instance, user) is False
        assert prune_user_networks(api, instance) == []
        c.remove(force=True)
        assert prune_user_networks(api, instance) == [user]
        assert not docker_client.networks.list(names=[name])
    finally:
        for n in docker_client.networks.list(filters={"label": f"org.gpulab.instance={instance}"}):
            n.remove()
