"""The swarm lab is a real multi-node swarm: services placed on a chosen worker run there and log
through the manager, an overlay network carries traffic between tasks on different workers, and
a killed worker is reported Down by the manager.

The kill test restarts the worker afterwards (`SwarmLab.restart_worker`), so that it can run in any
order with the other tests sharing the session's lab.
"""

from __future__ import annotations

import time

import docker
import pytest

# A task reached a state it never leaves.
FINAL = {"complete", "failed", "rejected", "shutdown", "orphaned", "remove"}


def _tasks(api, service_id: str) -> list[dict]:
    return api.tasks(filters={"service": service_id})


def _wait_task(api, service_id: str, states: set[str], timeout: float = 60) -> dict:
    """The service's (only) task once it is in one of `states` (or any final state)."""
    deadline = time.monotonic() + timeout
    while True:
        tasks = _tasks(api, service_id)
        for task in tasks:
            if task["Status"]["State"] in states | FINAL:
                return task
        if time.monotonic() > deadline:
            raise AssertionError(
                f"no task of {service_id} reached {states} in {timeout} s: {tasks}"
            )
        time.sleep(0.2)


def _service_logs(api, service_id: str, want: str, timeout: float = 20) -> str:
    """The service's logs through the manager, once they contain `want` (or at the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        text = b"".join(api.service_logs(service_id, stdout=True, stderr=True)).decode()
        if want in text or time.monotonic() > deadline:
            return text
        time.sleep(0.3)


def _job(lab, command, node, **kw) -> docker.types.TaskTemplate:
    return docker.types.TaskTemplate(
        container_spec=docker.types.ContainerSpec(
            image=lab.image(kw.pop("image", "gpulab/debian:bookworm")),
            command=command,
            hostname="{{.Node.Hostname}}",  # swarm's template: the node the task runs on
        ),
        restart_policy=docker.types.RestartPolicy(condition="none"),
        placement=docker.types.Placement(constraints=[f"node.id=={node.node_id}"]),
        **kw,
    )


def test_lab_facts(swarm_lab):
    lab = swarm_lab
    api = lab.api()
    assert len(lab.workers) == 2
    assert lab.registry == lab.registry_addr + "/"
    nodes = {n["ID"]: n for n in api.nodes()}
    # active: the notebook gateway attaches to overlays there (a drained node cannot)
    assert nodes[lab.manager.node_id]["Spec"]["Availability"] == "active"
    assert nodes[lab.manager.node_id]["ManagerStatus"]["Leader"] is True
    for w in lab.workers:
        node = nodes[w.node_id]
        assert node["Description"]["Hostname"] == w.hostname == w.container
        assert node["Status"]["State"] == "ready"
        assert node["Status"]["Addr"] == w.addr
        assert node["Spec"]["Role"] == "worker"
        assert node["Spec"]["Labels"]["org.gpulab.gpus"] == ",".join(w.gpus)
        assert len(w.gpus) == lab.gpus_per_node
        # the images were pre-pulled on every worker, as the same images as the host's
        tags = {t for img in lab.worker_client(w).images.list() for t in img.tags}
        assert set(lab.images) <= tags, f"{w.container} lacks {set(lab.images) - tags}"


def test_service_runs_on_the_chosen_worker_and_logs_through_the_manager(swarm_lab, swarm_objects):
    lab = swarm_lab
    api = lab.api()
    w1, w2 = lab.workers
    t0 = time.monotonic()
    svc = api.create_service(
        _job(lab, ["sh", "-c", "echo hello-from-$(hostname)"], w2),
        name=swarm_objects + "-hello",
    )
    task = _wait_task(api, svc["ID"], {"complete"})
    elapsed = time.monotonic() - t0
    assert task["Status"]["State"] == "complete", task["Status"]
    assert task["NodeID"] == w2.node_id
    # the task's container exists on worker 2's own engine and not on worker 1's
    cid = task["Status"]["ContainerStatus"]["ContainerID"]
    container = lab.worker_client(w2).containers.get(cid)
    assert container.attrs["Config"]["Hostname"] == w2.hostname
    with pytest.raises(docker.errors.NotFound):
        lab.worker_client(w1).containers.get(cid)
    # the host's image, come through the registry (same image ID on the worker)
    assert container.image.id == docker.from_env().images.get("gpulab/debian:bookworm").id
    logs = _service_logs(api, svc["ID"], f"hello-from-{w2.hostname}")
    assert f"hello-from-{w2.hostname}" in logs.splitlines(), logs
    print(f"\nservice created -> task complete on {w2.hostname} in {elapsed:.1f} s")


SERVER = """
import http.server, os, sys
os.makedirs("/tmp/www", exist_ok=True)
with open("/tmp/www/index.html", "w") as f:
    f.write(sys.argv[1] + "\\n")
os.chdir("/tmp/www")
http.server.test(HandlerClass=http.server.SimpleHTTPRequestHandler, port=8000, bind="0.0.0.0")
"""

CLIENT = """
import socket, sys, time, urllib.request
url = sys.argv[1]
for attempt in range(50):
    try:
        body = urllib.request.urlopen(url, timeout=5).read().decode().strip()
        break
    except OSError:
        time.sleep(0.2)
else:
    sys.exit("no answer from " + url)
print("fetched", body, "on", socket.gethostname())
"""


def test_overlay_network_between_workers(swarm_lab, swarm_objects):
    lab = swarm_lab
    api = lab.api()
    w1, w2 = lab.workers
    token = swarm_objects + "-token"
    net_name = swarm_objects + "-net"
    net = api.create_network(net_name, driver="overlay", attachable=True)
    # DNS round robin: the kernel here has no IPVS, which swarm's VIP load balancing needs.
    dnsrr = docker.types.EndpointSpec(mode="dnsrr")
    server = api.create_service(
        _job(
            lab,
            ["python3", "-c", SERVER, token],
            w2,
            image="gpulab/python:3.11",
            networks=[net["Id"]],
        ),
        name=swarm_objects + "-server",
        endpoint_spec=dnsrr,
    )
    task = _wait_task(api, server["ID"], {"running"})
    assert task["Status"]["State"] == "running", task["Status"]
    assert task["NodeID"] == w2.node_id
    (attachment,) = [a for a in task["NetworksAttachments"] if a["Network"]["ID"] == net["Id"]]
    ip = attachment["Addresses"][0].split("/")[0]
    assert not ip.startswith(lab.subnet.rsplit(".", 2)[0] + "."), (
        "an overlay address, not the lab's"
    )
    url = f"http://{ip}:8000/"

    # a task on worker 1 fetches from the task on worker 2 by its overlay IP
    client = api.create_service(
        _job(
            lab,
            ["python3", "-c", CLIENT, url],
            w1,
            image="gpulab/python:3.11",
            networks=[net["Id"]],
        ),
        name=swarm_objects + "-client",
        endpoint_spec=dnsrr,
    )
    task = _wait_task(api, client["ID"], {"complete"})
    assert task["NodeID"] == w1.node_id
    logs = _service_logs(api, client["ID"], f"fetched {token}")
    assert task["Status"]["State"] == "complete", (task["Status"], logs)
    assert f"fetched {token} on {w1.hostname}" in logs, logs

    # attachable: a plain container on worker 1's own engine joins the overlay too
    out = (
        lab.worker_client(w1)
        .containers.run(
            lab.image("gpulab/python:3.11"),
            ["python3", "-c", CLIENT, url],
            network=net_name,
            remove=True,
        )
        .decode()
    )
    assert f"fetched {token}" in out, out


def test_killed_worker_is_reported_down(swarm_lab):
    lab = swarm_lab
    api = lab.api()
    w2 = lab.workers[1]
    assert api.inspect_node(w2.node_id)["Status"]["State"] == "ready"
    t0 = time.monotonic()
    lab.kill_worker(w2.hostname)
    state = lab.wait_node(w2, "down", timeout=60)
    detected = time.monotonic() - t0
    print(
        f"\nworker killed -> node Down after {detected:.1f} s (heartbeat {lab.facts['swarm']['heartbeat']})"
    )
    assert state == "down", f"{w2.hostname} still {state} {detected:.0f} s after its kill"
    # a 2 s heartbeat: the node is declared Down after about 3 missed heartbeats
    assert detected < 20

    # the worker comes back as the same node, for the tests that follow
    t1 = time.monotonic()
    lab.restart_worker(w2.hostname)
    assert api.inspect_node(w2.node_id)["Status"]["State"] == "ready"
    assert lab.worker_client(w2).ping()
    print(f"worker restarted and Ready again in {time.monotonic() - t1:.1f} s")
