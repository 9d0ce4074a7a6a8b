"""gpulab's notebooks on a real multi-node Docker Swarm (the lab of conftest.py).

What is shown: a notebook lands on the worker node and the GPU the ledger chose, runs there as
a pinned one-task service, and answers through the hub (the hub's proxy -> the notebook
gateway on the manager -> the user's overlay), with no port published anywhere; its
workspace follows it from one node to another through object storage; one user's notebook
cannot connect to another user's; the hub and the service SIGKILLed find the notebook again;
a worker killed under a notebook makes it ERROR with reason NODE_LOST and frees its GPU.
(The spawn time on a worker node against a single-host hub: bench/bench_swarm_spawn.py.)
"""

from __future__ import annotations

import sqlite3
import time

import docker
import pytest
import requests

from ..support.ports import free_port
from .conftest import start_s3

BUCKET = "ws-swarm"
CPU = {"cpus": 0.5, "memory": "512M", "gpus": 0}
GPU = {"cpus": 0.5, "memory": "512M", "gpus": 1}


def _storage(endpoint: str, credentials) -> str:
    return (
        f'c.GpulabSettings.object_stores = {{"s3": {{"endpoint_url": "{endpoint}", '
        f'"region": "us-east-1", "credentials": {{"file": "{credentials}"}}}}}}\n'
        'c.GpulabSettings.workspace_store = "s3"\n'
        f'c.GpulabSettings.workspace_bucket = "{BUCKET}"\n'
    )


def _swarm_config(lab, endpoint: str, credentials, gateway_port: int) -> str:
    return (
        _storage(endpoint, credentials)
        + (
            'c.GpulabSettings.runtime = "swarm"\n'
            f"c.GpulabSettings.image_registry = {lab.registry!r}\n"
            'c.GpulabSettings.placement = "pack"\n'
            f"c.GpulabSettings.swarm_gateway_port = {gateway_port}\n"
            f"c.GpulabSettings.swarm_gateway_api_port = {free_port()}\n"
            "c.GpulabSettings.notebook_reconcile_interval = 1\n"
            # the nodes reach the hub API at this host's address on their network
            f'c.JupyterHub.hub_ip = "{lab.gateway}"\n'
            f'c.JupyterHub.hub_connect_ip = "{lab.gateway}"\n'
            "c.Spawner.poll_interval = 2\n"
        )
        + lab.node_engine_config()
        + lab.NO_ENCRYPTION
    )


@pytest.fixture(scope="module")
def s3(swarm_lab):
    server = start_s3(swarm_lab, (BUCKET,), "nb-s3-credentials")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def hub(swarm_lab, s3, hub_with):
    """The Swarm hub of this module (retired after it: stopped, its services, gateway and
    overlays removed, its log checked)."""
    port = free_port()
    hub = hub_with(_swarm_config(swarm_lab, s3.endpoint, s3.credentials, port))
    hub.gateway_port = port
    hub.tokens = {u: hub.create_user(u) for u in ("ana", "bob")}
    return hub


def _start(hub, user: str, server: str, options: dict) -> dict:
    r = hub.spawn(user, server, options, token=hub.tokens[user])
    assert r.status_code in (201, 202), r.text
    hub.wait_ready(user, server, timeout=180)
    return hub.notebook(user, server).json()


def _through_hub(hub, user: str, server: str) -> requests.Response:
    """The notebook's own API, through the hub's public URL (proxy -> gateway -> overlay)."""
    return requests.get(
        f"{hub.url}/user/{user}/{server}/api/status",
        headers={"Authorization": f"token {hub.tokens[user]}"},
        timeout=30,
    )


def _task(name: str) -> dict:
    client = docker.APIClient(version="auto")
    tasks = client.tasks(filters={"service": name, "desired-state": "running"})
    return max(tasks, key=lambda t: t["CreatedAt"])


def _task_node(name: str) -> str:
    client = docker.APIClient(version="auto")
    return client.inspect_node(_task(name)["NodeID"])["Description"]["Hostname"]


def _overlay_ip(name: str) -> str:
    for att in _task(name).get("NetworksAttachments") or []:
        if "-ovl-" in att["Network"]["Spec"]["Name"]:
            return att["Addresses"][0].split("/")[0]
    raise AssertionError(f"{name} is on no user overlay")


def _container(lab, nb: dict):
    """The notebook's container on its worker node's own engine."""
    client = lab.worker_client(nb["node"])
    found = client.containers.list(
        filters={"label": f"com.docker.swarm.service.name={nb['container']}"}
    )
    assert len(found) == 1, found
    return found[0]


def _sh(lab, nb: dict, command: str) -> tuple[int, str]:
    res = _container(lab, nb).exec_run(["sh", "-c", command], user="1000")
    return res.exit_code, res.output.decode()


def _gpus_held(hub) -> dict[str, str]:
    """{device: workload} from the gpulab database's ledger."""
    db = sqlite3.connect(hub.workdir / "data" / "gpulab.sqlite")
    try:
        rows = db.execute(
            "SELECT device, workload FROM gpu_allocations WHERE instance = ?", (hub.instance,)
        ).fetchall()
    finally:
        db.close()
    return dict(rows)


def _stop(hub, user: str, server: str, state: str = "STOPPED") -> dict:
    hub.request("DELETE", hub.server_path(user, server))
    hub.wait_stopped(user, server, timeout=120)
    return hub.wait_state(user, server, state, timeout=60)


def test_a_notebook_lands_on_the_chosen_node_and_answers_through_the_hub(hub, swarm_lab):
    nb = _start(hub, "ana", "g", GPU)
    workers = {w.hostname for w in swarm_lab.workers}
    assert nb["state"] == "RUNNING" and nb["node"] in workers, nb
    # Swarm ran it where the ledger said, with the GPU the ledger gave
    assert _task_node(nb["container"]) == nb["node"]
    held = {d: w for d, w in _gpus_held(hub).items() if w.endswith("/ana/g")}
    assert len(held) == 1 and next(iter(held)).startswith(nb["node"] + "/"), held
    device = next(iter(held)).split("/", 1)[1]
    env = dict(e.split("=", 1) for e in _container(swarm_lab, nb).attrs["Config"]["Env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == device
    # reachable through the hub, with the user's token; not without one
    r = _through_hub(hub, "ana", "g")
    assert r.status_code == 200 and "started" in r.json(), r.text
    anon = requests.get(f"{hub.url}/user/ana/g/api/status", timeout=30, allow_redirects=False)
    assert anon.status_code in (302, 401, 403), anon.status_code
    # no port of the notebook is published: neither by Swarm nor on the node's engine
    svc = docker.APIClient(version="auto").inspect_service(nb["container"])
    assert not (svc.get("Endpoint") or {}).get("Ports"), svc.get("Endpoint")
    assert not _container(swarm_lab, nb).attrs["HostConfig"].get("PortBindings")
    _stop(hub, "ana", "g")
    assert not [w for w in _gpus_held(hub).values() if w.endswith("/ana/g")]


def test_the_workspace_follows_the_notebook_to_another_node(hub, swarm_lab, s3):
    first = _start(hub, "ana", "w", GPU)
    code, out = _sh(
        swarm_lab,
        first,
        "echo from-$(hostname) > /workspace/notes.txt && mkdir -p /workspace/sub "
        "&& head -c 200000 /dev/urandom > /workspace/sub/data.bin && sha256sum /workspace/sub/data.bin",
    )
    assert code == 0, out
    digest = out.split()[0]
    stopped = _stop(hub, "ana", "w")
    assert "pushed workspace: 2 transferred" in stopped["history"][-1]["message"], stopped
    # bob's notebook takes both GPUs of that node: ana's next start can only go elsewhere
    blocker = _start(hub, "bob", "big", {**GPU, "gpus": 2})
    assert blocker["node"] == first["node"], (blocker["node"], first["node"])
    try:
        second = _start(hub, "ana", "w", GPU)
        assert second["node"] != first["node"], second
        code, out = _sh(
            swarm_lab, second, "cat /workspace/notes.txt; sha256sum /workspace/sub/data.bin"
        )
        assert code == 0, out
        assert out.splitlines()[0].startswith("from-") and digest in out, out
        # a change on the new node goes back to object storage at the stop
        assert _sh(swarm_lab, second, "rm /workspace/notes.txt")[0] == 0
        _stop(hub, "ana", "w")
        keys = {
            o["Key"]
            for o in s3.client.list_objects_v2(Bucket=BUCKET, Prefix="workspaces/ana/w/").get(
                "Contents", []
            )
        }
        assert keys == {"workspaces/ana/w/sub/data.bin"}, keys
    finally:
        _stop(hub, "bob", "big")
    # back on the first node, whose volume still holds the older copy: the pull mirrors the
    # store, so the file deleted on the other node does not come back
    third = _start(hub, "ana", "w", GPU)
    assert third["node"] == first["node"], third
    code, out = _sh(swarm_lab, third, "ls /workspace; ls /workspace/sub")
    assert code == 0 and "notes.txt" not in out and "data.bin" in out, out
    _stop(hub, "ana", "w")


def test_one_users_notebook_cannot_connect_to_anothers(hub, swarm_lab):
    ana = _start(hub, "ana", "net", CPU)
    bob = _start(hub, "bob", "net", CPU)
    try:
        # who answers, not whether a TCP connection opens: this machine's egress proxy accepts
        # every outbound connection, so a packet routed out of the cluster "connects" too
        probe = (
            "import sys, urllib.request\n"
            "for url in sys.argv[1:]:\n"
            "    try:\n"
            "        body = urllib.request.urlopen(url, timeout=5).read()\n"
            "        print(url, 'jupyter' if b'\"version\"' in body else 'other')\n"
            "    except Exception as e:\n"
            "        print(url, 'unreachable', type(e).__name__)\n"
        )
        own = f"http://{_overlay_ip(ana['container'])}:8888/user/ana/net/api"
        other = f"http://{_overlay_ip(bob['container'])}:8888/user/bob/net/api"
        # the notebook gateway is on ana's overlay too: it must not lead her to bob's notebook
        gw = docker.from_env().containers.get(f"{hub.instance}-gateway")
        gw_ip = next(
            n["IPAddress"]
            for name, n in gw.attrs["NetworkSettings"]["Networks"].items()
            if name.endswith("-ovl-ana")
        )
        via = f"http://{gw_ip}:{hub.gateway_port}/user/bob/net/api"
        res = _container(swarm_lab, ana).exec_run(["python3", "-c", probe, own, other, via])
        out = res.output.decode()
        assert f"{own} jupyter" in out, out  # the probe works: her own notebook answers
        assert f"{other} jupyter" not in out and other in out, out  # bob's does not
        assert f"{via} jupyter" not in out and via in out, out  # nor through the gateway
    finally:
        _stop(hub, "ana", "net")
        _stop(hub, "bob", "net")


def test_hub_and_service_sigkilled_find_the_notebook_again(hub, swarm_lab):
    nb = _start(hub, "ana", "keep", CPU)
    hub.kill()
    time.sleep(1)
    hub.start()
    model = hub.server_model("ana", "keep")
    assert model and model["ready"], model
    assert _through_hub(hub, "ana", "keep").status_code == 200
    assert hub.notebook("ana", "keep").json()["state"] == "RUNNING"
    assert _task_node(nb["container"]) == nb["node"]
    _stop(hub, "ana", "keep")


def test_a_worker_killed_under_a_notebook_makes_it_node_lost(hub, swarm_lab):
    nb = _start(hub, "ana", "lost", GPU)
    victim = nb["node"]
    assert [d for d, w in _gpus_held(hub).items() if w.endswith("/ana/lost")]
    t0 = time.monotonic()
    swarm_lab.kill_worker(victim)
    try:
        lost = hub.wait_state("ana", "lost", "ERROR", timeout=90)
        print(f"\nworker killed -> notebook ERROR NODE_LOST: {time.monotonic() - t0:.1f} s")
        assert lost["history"][-1]["reason"] == "NODE_LOST", lost["history"][-1]
        assert victim in lost["history"][-1]["message"]
        # its GPU is free once Swarm has no task of it; the hub no longer serves it
        deadline = time.monotonic() + 30
        while [w for w in _gpus_held(hub).values() if w.endswith("/ana/lost")]:
            assert time.monotonic() < deadline, _gpus_held(hub)
            time.sleep(0.2)
        with pytest.raises(docker.errors.NotFound):
            docker.APIClient(version="auto").inspect_service(nb["container"])
        hub.wait_stopped("ana", "lost", timeout=30)
        # started again, it runs on the other node, from its workspace's last push
        again = _start(hub, "ana", "lost", GPU)
        assert again["node"] != victim, again
        _stop(hub, "ana", "lost")
    finally:
        swarm_lab.restart_worker(victim)
