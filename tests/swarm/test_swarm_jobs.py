"""gpulab's jobs on a real multi-node Docker Swarm (the lab of conftest.py: this host's engine
as the manager, Docker-in-Docker workers with two fake GPUs each, a local registry).

What is shown: jobs land on the worker (and the devices) the ledger chose and run there as
pinned one-task services; 2 nodes x 2 GPUs fill exactly and the fifth GPU waits, saying why;
a request bigger than any node is refused naming the biggest; data is pulled and pushed by a
sync helper on the node, and two jobs on one node reading one dataset pull it once (the
node's dataset cache); a private image is pulled onto the worker with its owner's secret only;
the hub and the service SIGKILLed find every job again; a worker killed mid-job after a live
push sent its checkpoint: the checkpoint is in the store, and the job is queued again and
resumes from it on the other worker; exec and a shell reach a job on a worker through that
node's own engine, which also says whether the node can hand its GPUs out (its runtimes).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import time

import docker
import pytest

from ..conftest import _need, run_async, wait_until
from ..support.api import TERMINAL, Api, states
from ..support.ports import free_port
from ..support.registry import PrivateRegistry, push, registry_missing, tiny_image
from ..support.s3 import TEST_SECRET_KEY
from .conftest import start_s3

#: the private registry's port (test_a_private_image_...): the one registry the site allows
REGISTRY_PORT = free_port()


def _config(lab, s3) -> str:
    return (
        'c.GpulabSettings.runtime = "swarm"\n'
        f"c.GpulabSettings.image_registry = {lab.registry!r}\n"
        'c.GpulabSettings.placement = "pack"\n'
        "c.GpulabSettings.supervisor_interval = 0.3\n"
        "c.GpulabSettings.job_container_retention = 3600\n"
        # execs go to the node's own engine (over TLS with the lab's client certificate)
        + lab.node_engine_config()
        + lab.NO_ENCRYPTION
        + 'c.GpulabSettings.job_quota = {"gpus": 8, "jobs": 10}\n'
        f'c.GpulabSettings.object_stores["s3"] = {{"endpoint_url": "{s3.endpoint}", '
        f'"credentials": {{"file": "{lab.workdir}/s3-credentials"}}}}\n'
        'c.GpulabSettings.volume_grants.append({"store": "s3", "bucket": "swarm-in", '
        '"modes": ["ro"]})\n'
        'c.GpulabSettings.volume_grants.append({"store": "s3", "bucket": "swarm-out"})\n'
        f'c.GpulabSettings.image_registries = ["127.0.0.1:{REGISTRY_PORT}/team/*"]\n'
        # live pushes every 2 s (test_a_worker_killed_...), of files unchanged for 0.5 s
        "c.GpulabSettings.sync_interval_floor = 1\n"
        "c.GpulabSettings.sync_settle = 0.5\n"
    )


@pytest.fixture(scope="module")
def s3(swarm_lab):
    server = start_s3(swarm_lab, ("swarm-in", "swarm-out"), "s3-credentials")
    yield server, server.client
    server.stop()


@pytest.fixture(scope="module")
def hub(swarm_lab, s3, hub_with):
    """The Swarm hub of this module (retired after it: stopped, its services, gateway and
    overlays removed, its log checked)."""
    return hub_with(_config(swarm_lab, s3[0]))


@pytest.fixture(scope="module")
def ana(hub):
    return Api(hub, "ana")


def _task_node(job: dict) -> str:
    """The hostname of the node whose engine runs the job's task, as the manager says."""
    client = docker.APIClient(version="auto")
    tasks = client.tasks(filters={"service": job["container"]})
    newest = max(tasks, key=lambda t: t["CreatedAt"])
    node = client.inspect_node(newest["NodeID"])
    return node["Description"]["Hostname"]


def _service_env(job: dict) -> dict[str, str]:
    client = docker.APIClient(version="auto")
    spec = client.inspect_service(job["container"])["Spec"]["TaskTemplate"]["ContainerSpec"]
    return dict(e.split("=", 1) for e in spec.get("Env") or [])


def _gpu_job(api: Api, seconds: int, gpus: int = 1, **kw) -> dict:
    return api.submit(
        command=["sh", "-c", f"echo on $(hostname); sleep {seconds}"],
        resources={"gpus": gpus, "cpus": 0.2, "memory": "128M"},
        **kw,
    )


def test_two_nodes_of_two_gpus_fill_exactly_and_the_fifth_waits(hub, ana, swarm_lab):
    workers = sorted(w.hostname for w in swarm_lab.workers)
    t0 = time.monotonic()
    jobs = [_gpu_job(ana, 600) for _ in range(4)]
    running = [ana.wait(j["id"], {"RUNNING"}, timeout=180) for j in jobs]
    to_running = time.monotonic() - t0
    print(f"\n4 GPU jobs from submission to RUNNING on the workers: {to_running:.1f} s")
    # pack: the first node that fits is filled before the next one is used
    nodes = [j["node"] for j in running]
    assert sorted(nodes) == sorted(workers * 2), nodes
    taken = sorted(d for j in running for d in j["devices"])
    assert taken == sorted(f"{w}/{i}" for w in workers for i in (0, 1))
    for j in running:
        assert _task_node(j) == j["node"]  # Swarm ran it where gpulab said
        ids = ",".join(d.split("/")[1] for d in j["devices"])
        assert _service_env(j)["NVIDIA_VISIBLE_DEVICES"] == ids
    # a CPU job beside them gets no GPU at all: on nodes whose default runtime is nvidia an
    # image's own NVIDIA_VISIBLE_DEVICES=all would otherwise hand it every device
    cpu = ana.submit(command=["sleep", "600"], resources={"gpus": 0, "cpus": 0.2, "memory": "128M"})
    cpu = ana.wait(cpu["id"], {"RUNNING"}, timeout=180)
    assert cpu["devices"] == [] and _service_env(cpu)["NVIDIA_VISIBLE_DEVICES"] == "void", cpu
    assert ana.call("POST", f"/jobs/{cpu['id']}/interrupt").status_code in (200, 202)
    # the fifth GPU request waits in the queue and says why
    fifth = _gpu_job(ana, 5)
    time.sleep(3)
    waiting = ana.job(fifth["id"])
    assert waiting["state"] == "QUEUED", waiting
    assert "waiting for 1 GPU(s) free on one node: 0 of 4 free" in waiting["message"], waiting
    # more than one node has: refused at once, naming the biggest node
    r = ana.call(
        "POST",
        "/jobs",
        json={"command": ["true"], "resources": {"gpus": 3, "cpus": 0.2, "memory": "128M"}},
    )
    assert r.status_code == 400, r.text
    assert "biggest" in r.json()["message"] and "has 2" in r.json()["message"], r.text
    # one job ends: its GPU goes to the fifth, on that job's node
    first = running[0]
    assert ana.call("POST", f"/jobs/{first['id']}/interrupt").status_code in (200, 202)
    assert ana.wait(first["id"])["state"] == "INTERRUPTED"
    placed = ana.wait(fifth["id"], {"RUNNING", "DONE"}, timeout=120)
    assert placed["node"] == first["node"], placed
    assert ana.wait(fifth["id"], timeout=120)["state"] == "DONE"
    logs = ana.call("GET", f"/jobs/{fifth['id']}/logs").text
    assert f"on {fifth['id']}" in logs or "on " in logs
    for j in running[1:]:
        ana.call("POST", f"/jobs/{j['id']}/interrupt")
    for j in running[1:]:
        assert ana.wait(j["id"])["state"] == "INTERRUPTED"


def test_data_is_pulled_and_pushed_on_the_node(hub, ana, s3):
    _, client = s3
    client.put_object(Bucket="swarm-in", Key="set/labels.txt", Body=b"cat\ndog\n")
    job = ana.submit(
        command=["sh", "-c", "sort -r /data/labels.txt > /out/sorted.txt; hostname"],
        volumes=["swarm-in@s3/set:/data", "swarm-out@s3/ana/run1:/out:rw"],
        resources={"gpus": 0, "cpus": 0.2, "memory": "128M"},
    )
    done = ana.wait(job["id"], timeout=180)
    assert done["state"] == "DONE", (done["reason"], done["message"], done["node"])
    assert done["node"].startswith("gpulab-lab-worker"), done
    body = client.get_object(Bucket="swarm-out", Key="ana/run1/sorted.txt")["Body"].read()
    assert body == b"dog\ncat\n"
    # the store credentials went to the sync helper only, never to the job's service
    assert TEST_SECRET_KEY not in repr(_service_env(done))


def test_two_jobs_on_one_worker_reading_one_dataset_pull_it_once(hub, ana, s3):
    """The dataset cache on a Swarm: the node's own engine finds and keeps the copy, so the
    second job on that worker mounts the first one's (one pull), and reads every byte."""
    _, client = s3
    files = {f"part-{i}.bin": os.urandom(64 * 1024 + i) for i in range(3)}
    for name, body in files.items():
        client.put_object(Bucket="swarm-in", Key=f"shared/{name}", Body=body)
    want = hashlib.sha256(b"".join(files[n] for n in sorted(files))).hexdigest()
    jobs = [
        ana.submit(
            command=["sh", "-c", "cat /data/part-*.bin | sha256sum"],
            volumes=["swarm-in@s3/shared:/data"],
            resources={"gpus": 0, "cpus": 0.2, "memory": "128M"},
        )
        for _ in range(2)
    ]
    done = [ana.wait(j["id"], timeout=180) for j in jobs]
    assert [d["state"] for d in done] == ["DONE", "DONE"], [
        (d["reason"], d["message"]) for d in done
    ]
    assert done[0]["node"] == done[1]["node"], [d["node"] for d in done]  # pack: one worker
    notes = [e["message"] for d in done for e in d["history"] if e["reason"] == "SYNC"]
    pulled = [n for n in notes if "into the node's dataset cache" in n]
    shared = [n for n in notes if "the node's copy in the dataset cache" in n]
    assert (len(pulled), len(shared)) == (1, 1), notes
    for j in jobs:
        assert ana.call("GET", f"/jobs/{j['id']}/logs").text.split()[0] == want


@pytest.fixture
def private_registry(swarm_lab, tmp_path):
    """Debian's docker-registry with TLS and htpasswd (user bob), holding a tiny private image
    (tags 1 and 2), under the same name on the host and on every worker:
    ``127.0.0.1:PORT/team/private``. The workers are containers on the lab network and do
    not reach the host's loopback, and the lab's own registry (127.0.0.1:5000) takes no
    credentials: so this one listens on the host's loopback, a socat on the host's lab address
    forwards to it, and one on each worker's loopback forwards there, as the lab does for
    its registry. A loopback registry needs no engine configuration (Docker does not check
    its certificate), on the manager and on the nodes alike."""
    if (missing := registry_missing()) is not None:
        _need(missing)
    registry = PrivateRegistry(tmp_path / "registry", {"bob": "s3cret"}, port=REGISTRY_PORT)
    registry.start()
    port, repo = REGISTRY_PORT, f"{registry.host}/team/private"
    host = docker.from_env()
    forward = subprocess.Popen(
        [
            "socat",
            f"TCP-LISTEN:{port},bind={swarm_lab.gateway},fork,reuseaddr",
            f"TCP:{registry.host}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pidfile = f"/run/gpulab-test-registry-{port}.pid"
    workers = [host.containers.get(w.container) for w in swarm_lab.workers]
    try:
        for w in workers:
            w.exec_run(
                [
                    "sh",
                    "-c",
                    f"echo $$ > {pidfile}; exec socat TCP-LISTEN:{port},bind=127.0.0.1,fork,"
                    f"reuseaddr TCP:{swarm_lab.gateway}:{port}",
                ],
                detach=True,
            )
        for tag in ("1", "2"):
            tiny_image(host, repo, tag)
            push(host, f"{repo}:{tag}", {"username": "bob", "password": "s3cret"})
            host.api.remove_image(f"{repo}:{tag}")
        yield repo
    finally:
        for w in workers:
            w.exec_run(["sh", "-c", f"kill $(cat {pidfile}) && rm -f {pidfile}"])
        forward.terminate()
        forward.wait(10)
        registry.stop()


def test_a_private_image_is_pulled_on_the_worker_with_its_owner_s_secret_only(
    hub, ana, swarm_lab, private_registry
):
    """The registry is asked for the digest through the manager with ana's secret, and the
    worker that runs the job pulls that digest with it; the service runs the pinned digest and
    carries no credential, and the worker's engine kept none (another tag of the private
    repository is refused to it). A wrong secret fails with the registry's words."""
    from gpulab.runtime.base import ImagePullFailed
    from gpulab.runtime.pulls import pull_blocking

    image = f"{private_registry}:1"
    for name, value in (("regcred", "bob:s3cret"), ("wrongcred", "bob:guess")):
        r = ana.call("PUT", f"/secrets/{name}", json={"value": value})
        assert r.status_code in (200, 201), r.text
    small = {"gpus": 0, "cpus": 0.2, "memory": "128M"}
    ok = ana.submit(
        image=image,
        image_pull_secret="regcred",
        command=["sh", "-c", "echo private-ok"],
        resources=small,
    )
    wrong = ana.submit(
        image=image, image_pull_secret="wrongcred", command=["true"], resources=small
    )
    done, failed = ana.wait(ok["id"], timeout=180), ana.wait(wrong["id"], timeout=180)
    assert done["state"] == "DONE", (done["reason"], done["message"])
    assert done["node"].startswith("gpulab-lab-worker"), done["node"]
    assert ana.call("GET", f"/jobs/{ok['id']}/logs").text == "private-ok\n"
    events = [e["message"] for e in done["history"] if e["reason"] == "IMAGE"]
    assert events[-1].startswith(f"image {private_registry}@sha256:"), events
    assert "ready (pulled " in events[-1], events
    pinned = events[-1].split()[1]
    # the worker holds that digest; the service runs it by digest, without any credential
    worker = swarm_lab.worker_client(done["node"])
    assert pinned in worker.images.get(pinned).attrs["RepoDigests"]
    service = swarm_lab.api().inspect_service(done["container"])["Spec"]
    container = service["TaskTemplate"]["ContainerSpec"]
    assert container["Image"] == pinned and "PullOptions" not in container, container
    # (what is visible: Swarm keeps a service call's X-Registry-Auth where an inspection does
    # not show it; tests/unit/test_registry_auth_sent.py checks that gpulab sends none)
    assert "s3cret" not in json.dumps(service)
    # the pull stored nothing on the node: the same repository is refused to its engine
    # alone, and given with bob's credentials (the control). Docker tries a loopback registry
    # over plain HTTP once its HTTPS attempt failed: that is the error it reports (asserted,
    # so that another failure, a missing tag, the registry down, does not pass for it)
    with pytest.raises(ImagePullFailed, match="Client sent an HTTP request to an HTTPS server"):
        pull_blocking(worker.api, f"{private_registry}:2", None, lambda _: None)
    bob = {"username": "bob", "password": "s3cret"}
    pull_blocking(worker.api, f"{private_registry}:2", bob, lambda _: None)
    worker.api.remove_image(f"{private_registry}:2")
    assert failed["state"] == "FAILED" and failed["reason"] == "IMAGE_PULL_FAILED", failed
    assert "unauthorized" in failed["message"].lower(), failed["message"]
    assert "guess" not in json.dumps(failed) and "s3cret" not in json.dumps(done)


def test_hub_and_service_sigkilled_find_every_job_again(hub, ana):
    job = _gpu_job(ana, 12)
    running = ana.wait(job["id"], {"RUNNING"}, timeout=120)
    hub.kill()
    time.sleep(1)
    hub.start()
    done = ana.wait(job["id"], timeout=120)
    assert done["state"] == "DONE", (done["reason"], done["message"], done["node"])
    assert done["restarts"] == 0 and done["node"] == running["node"]
    assert states(done).count("RUNNING") == 1, states(done)


#: a job that checkpoints: the first run writes epoch-1 and waits (to be killed); a run that
#: finds the checkpoint (pulled from the store) says so and ends
CHECKPOINTS = (
    "if [ -f /out/ckpt.txt ]; then echo resumed from $(cat /out/ckpt.txt); sleep 1; "
    "else echo epoch-1 > /out/ckpt.txt; sleep 120; fi"
)


def test_a_worker_killed_mid_job_the_job_finishes_on_the_other(hub, ana, swarm_lab, s3):
    """Item 3 of issue 31 on a Swarm: the job's rw volume is pushed live (every 2 s) by a
    helper on the worker that holds it; once a push sent the checkpoint, the worker is
    killed (a lost node): the checkpoint is in the store, and the job, queued again, resumes
    from it on the other worker."""
    _, client = s3
    job = ana.submit(
        command=["sh", "-c", CHECKPOINTS],
        volumes=["swarm-out@s3/ana/ckpt:/out:rw"],
        sync_interval=2,
        retries=1,
        resources={"gpus": 1, "cpus": 0.2, "memory": "128M"},
    )
    sent = wait_until(
        lambda: (ana.job(job["id"])["live_push"] or {}).get("files") and ana.job(job["id"]),
        timeout=120,
        what="a live push that sent the checkpoint",
    )
    assert sent["state"] == "RUNNING" and sent["live_push"]["ok"], sent["live_push"]
    victim = sent["node"]
    t0 = time.monotonic()
    swarm_lab.kill_worker(victim)
    try:
        body = client.get_object(Bucket="swarm-out", Key="ana/ckpt/ckpt.txt")["Body"].read()
        assert body == b"epoch-1\n"
        requeued = ana.wait(job["id"], {"QUEUED", "INITIALIZING", "PENDING"}, timeout=120)
        print(f"\nworker killed -> job queued again: {time.monotonic() - t0:.1f} s")
        assert requeued["reason"] in ("NODE_LOST", "SCHEDULED", "CREATING"), requeued
        done = ana.wait(job["id"], timeout=240)
        assert done["state"] == "DONE", (done["reason"], done["message"], done["node"])
        assert done["node"] != victim and done["restarts"] == 1, done
        assert "NODE_LOST" in [e["reason"] for e in done["history"]]
        # its GPU on the lost node was released once Swarm no longer had its task
        assert not [d for d in done["devices"] if d.startswith(victim + "/")]
        logs = ana.call("GET", f"/jobs/{job['id']}/logs").text
        assert "resumed from epoch-1" in logs, logs
        pushes = [e for e in done["history"] if e["reason"] == "LIVE_PUSH"]
        assert pushes and "swarm-out@s3/ana/ckpt:/out:rw: 1 transferred" in pushes[0]["message"]
    finally:
        swarm_lab.restart_worker(victim)


def test_a_jobs_port_on_a_worker_opens_through_the_hub(hub, ana):
    """The port of a job on a worker node's overlay answers at its URL under the hub (the
    service reaches it through the notebook gateway), HTTP and websockets; others get 404."""
    import asyncio

    import requests
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    from ..support.programs import APP

    job = ana.submit(
        framework="python",
        command=["python", "-c", APP],
        resources={"gpus": 0, "cpus": 0.5, "memory": "512M"},
        ports=[{"port": 8765, "name": "app"}],
    )
    running = ana.wait(job["id"], {"RUNNING", "FAILED", "ERROR", "DONE"}, timeout=120)
    assert running["state"] == "RUNNING", running
    assert _task_node(running) != ""
    url = hub.url + running["ports"][0]["url"]
    headers = {"Authorization": f"token {ana.token}"}
    deadline = time.monotonic() + 60
    while True:
        r = requests.get(url + "seen", headers=headers, timeout=30)
        if r.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert r.status_code == 200, r.text
    assert r.json()["uri"].endswith(f"/jobs/{job['id']}/ports/app/seen")

    async def talk() -> str:
        req = HTTPRequest(url.replace("http://", "ws://") + "ws", headers=headers)
        conn = await websocket_connect(req)
        await conn.write_message("over the overlay")
        answer = await asyncio.wait_for(conn.read_message(), 10)
        conn.close()
        return answer

    assert run_async(talk()) == "echo:over the overlay"
    other = Api(hub, "eve")
    assert (
        requests.get(url, headers={"Authorization": f"token {other.token}"}, timeout=30).status_code
        == 404
    )
    ana.call("POST", f"/jobs/{job['id']}/interrupt")
    ana.wait(job["id"], timeout=120)
    assert requests.get(url, headers=headers, timeout=30).status_code == 503


def test_exec_and_shell_reach_a_job_on_a_worker(hub, ana, swarm_lab):
    """A manager has no exec: the service finds the task's node and asks that node's engine
    (swarm_node_engine), for an exec and for an interactive shell alike."""
    import asyncio
    import json

    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    job = ana.submit(command=["sleep", "600"], resources={"gpus": 0, "cpus": 0.2, "memory": "128M"})
    try:
        running = ana.wait(job["id"], {"RUNNING"}, timeout=180)
        assert running["node"].startswith("gpulab-lab-worker"), running
        r = ana.call("POST", f"/jobs/{job['id']}/exec", json={"command": "hostname; id -u; exit 3"})
        assert r.status_code == 200, r.text
        assert r.json()["exit_code"] == 3, r.json()
        hostname, uid = r.json()["output"].split()
        assert uid == "1000"
        # it ran in the job's container, on the node gpulab placed the job on
        on_node = swarm_lab.worker_client(running["node"]).containers.list(
            filters={"label": f"org.gpulab.instance={hub.instance}"}
        )
        assert [c for c in on_node if c.id.startswith(hostname)], (hostname, on_node)

        async def shell() -> tuple[bytes, dict]:
            url = f"ws://127.0.0.1:{hub.port}/services/gpulab/api/jobs/{job['id']}/shell"
            conn = await websocket_connect(
                HTTPRequest(url, headers={"Authorization": f"token {ana.token}"})
            )
            conn.write_message(b"echo $((6*7)); exit 2\n", binary=True)
            out, end = b"", {}
            while (message := await asyncio.wait_for(conn.read_message(), 60)) is not None:
                if isinstance(message, bytes):
                    out += message
                else:
                    end = json.loads(message)
            return out, end

        out, end = run_async(shell())
        assert b"42\r\n" in out and end == {"exit": 2}, (out, end)
        kinds = [e["kind"] for e in ana.job(job["id"])["history"]]
        assert "exec" in kinds and "shell" in kinds
    finally:
        ana.call("POST", f"/jobs/{job['id']}/interrupt")


#: rank 0 listens on MASTER_PORT; every other rank connects to MASTER_ADDR (a rank name on
#: the job's own overlay) and sends rank+1: rank 0's sum proves that all of them took part
RENDEZVOUS = r"""
import os, socket, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
if rank == 0:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("", port))
    s.listen()
    total = 1
    for _ in range(world - 1):
        c, _ = s.accept()
        total += int(c.recv(16))
        c.close()
    print(f"rank 0 of {world} on {socket.gethostname()} sum {total}", flush=True)
else:
    for _ in range(240):
        try:
            c = socket.create_connection((addr, port), timeout=2)
            break
        except OSError:
            time.sleep(0.5)
    c.sendall(str(rank + 1).encode())
    c.close()
    print(f"rank {rank} of {world} on {socket.gethostname()} sent", flush=True)
"""


def test_a_distributed_job_spans_two_nodes(hub, ana, swarm_lab):
    """Two workers of two GPUs each: one per node (each node has two), placed together,
    finding each other by rank name over the job's own overlay; the same code path as on
    one host."""
    job = ana.submit(
        framework="python",
        command=["python", "-c", RENDEZVOUS],
        workers=2,
        resources={"gpus": 2, "cpus": 0.2, "memory": "256M"},
    )
    running = ana.wait(job["id"], {"RUNNING", "DONE", "FAILED", "ERROR"}, timeout=180)
    nodes = [w["node"] for w in running["workers"]]
    assert len(set(nodes)) == 2 and all(n.startswith("gpulab-lab-worker") for n in nodes)
    assert [len(w["devices"]) for w in running["workers"]] == [2, 2]
    done = ana.wait(job["id"], timeout=180)
    assert done["state"] == "DONE", (done, hub.tail(60))
    out = ana.call("GET", f"/jobs/{job['id']}/logs").text
    assert "[rank 0] rank 0 of 2 on worker-0 sum 3" in out, out
    assert "[rank 1] rank 1 of 2 on worker-1 sent" in out, out
    # each rank's task ran on the node the ledger chose for it (the task that ran: a stopped
    # service's newest task is the unplaceable one, assigned to no node)
    client = docker.APIClient(version="auto")
    for w in done["workers"]:
        ran = [t for t in client.tasks(filters={"service": w["container"]}) if t.get("NodeID")]
        node = client.inspect_node(max(ran, key=lambda t: t["CreatedAt"])["NodeID"])
        assert node["Description"]["Hostname"] == w["node"]


def test_a_crash_while_a_lost_nodes_workers_are_removed_still_requeues(
    hub, ana, swarm_lab, tmp_path
):
    """The service is SIGKILLed right after it removed a lost node's workers (a fault point):
    the hub starts it again, and it finishes the re-queue from INTERRUPTING (NODE_LOST)
    instead of taking the job for one whose container disappeared (ERROR). Last in the module:
    a second killed worker so soon after the first left the manager's gateway unable to reach a
    job's port on that worker for over a minute (seen once in a full run)."""
    fault = tmp_path / "fault"
    hub.env.update(GPULAB_FAULT_FILE=str(fault), GPULAB_SERVICE_ENV="GPULAB_FAULT_FILE")
    hub.kill()
    time.sleep(1)
    hub.start()
    job = _gpu_job(ana, 25, retries=1)
    running = ana.wait(job["id"], {"RUNNING"}, timeout=120)
    victim = running["node"]
    fault.write_text("engine:lost-removed")
    swarm_lab.kill_worker(victim)
    try:
        # the service is down until the hub notices (its poll) and starts it again: 503s
        def ended():
            r = ana.call("GET", f"/jobs/{job['id']}")
            return r.json() if r.status_code == 200 and r.json()["state"] in TERMINAL else None

        done = wait_until(ended, timeout=300, step=1, what="the job's end")
        assert (tmp_path / "fault.fired").exists(), "the service never reached the fault point"
        assert done["state"] == "DONE", (done["reason"], done["message"], done["node"])
        assert done["node"] != victim and done["restarts"] == 1, done
        reasons = [e["reason"] for e in done["history"]]
        assert "NODE_LOST" in reasons and "CONTAINER_LOST" not in reasons, reasons
        assert states(done).count("QUEUED") == 2, states(done)  # submitted, then re-queued
    finally:
        swarm_lab.restart_worker(victim)


#: what a job on a worker tries against the nodes' Docker engines: plain HTTP on the TLS
#: port, TLS without a client certificate, and the plain port a lab used to open
PROBE = r"""
import socket, ssl, sys, urllib.request
for addr in sys.argv[1:]:
    for port in (2375, 2376):
        try:
            body = urllib.request.urlopen(f"http://{addr}:{port}/version", timeout=5).read()
            print("PROBE", addr, port, "http", body[:300], flush=True)
        except Exception as e:
            print("PROBE", addr, port, "http", type(e).__name__, str(e)[:120], flush=True)
        try:
            ctx = ssl.create_default_context()
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
            with socket.create_connection((addr, port), timeout=5) as raw:
                with ctx.wrap_socket(raw) as s:
                    s.sendall(b"GET /version HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    print("PROBE", addr, port, "tls", s.recv(300), flush=True)
        except Exception as e:
            print("PROBE", addr, port, "tls", type(e).__name__, str(e)[:120], flush=True)
"""


def test_a_job_cannot_use_any_nodes_engine(hub, ana, swarm_lab):
    """The node-engine probe (issue 26): a job on a worker knocks on every node's engine port,
    plain and TLS: nothing answers it as Docker's API. The service itself, with the client
    certificate, does (a job's exec goes there), and a plain template is refused."""
    from gpulab.runtime.swarm_nodes import NodeEngines

    addrs = [w.addr for w in swarm_lab.workers]
    job = ana.submit(
        framework="python",
        command=["python", "-c", PROBE, *addrs],
        resources={"gpus": 0, "cpus": 0.2, "memory": "256M"},
    )
    done = ana.wait(job["id"], timeout=180)
    assert done["state"] == "DONE", done
    logs = ana.call("GET", f"/jobs/{job['id']}/logs").text
    probes = [line for line in logs.splitlines() if line.startswith("PROBE")]
    assert len(probes) == 4 * len(addrs), logs
    print("\n".join(probes))
    assert "ApiVersion" not in logs and "Engine" not in logs, logs
    # the TLS port answers plain HTTP with no API, and TLS without a certificate not at all
    assert any("2376 http HTTPError" in p for p in probes), probes
    assert all(" 2375 " not in p or "Error" in p for p in probes), probes
    # positive control: the same ports, with the lab's client certificate, are the engine
    for w in swarm_lab.workers:
        assert swarm_lab.worker_client(w).version()["ApiVersion"]
    with pytest.raises(ValueError, match="swarm_node_engine_plain"):
        NodeEngines("tcp://{address}:2375")


def test_a_git_source_reaches_only_what_its_job_could(hub, ana, swarm_lab):
    """The git-URL attack (issue 26): a clone is a request to wherever its URL points, made
    by a helper on the job's node. The helper runs on its owner's overlay, not on the node's
    default bridge, where the notebook gateway leads to every user's ports (shown: a container
    there gets another user's app through it); and another user's app hears nothing of it."""
    import socket
    import threading

    import requests

    from gpulab.names import gateway_container_name, user_network_name

    from ..support.programs import RECORDER

    victim = ana
    job = victim.submit(
        framework="python",
        command=["python", "-c", RECORDER],
        resources={"gpus": 0, "cpus": 0.3, "memory": "512M"},
        ports=[{"port": 8080, "name": "web"}],
    )
    running = victim.wait(job["id"], {"RUNNING", *TERMINAL}, timeout=120)
    assert running["state"] == "RUNNING", running
    path = running["ports"][0]["url"]
    headers = {"Authorization": f"token {victim.token}"}
    wait_until(
        lambda: requests.get(hub.url + path, headers=headers, timeout=30).ok,
        timeout=60,
        what="the victim's app behind the gateway",
    )

    def heard() -> int:
        logs = victim.call("GET", f"/jobs/{job['id']}/logs").text
        return sum(1 for line in logs.splitlines() if "SEEN " in line)

    host = docker.from_env()
    gw = host.containers.get(gateway_container_name(hub.instance))
    gw_ip = gw.attrs["NetworkSettings"]["Networks"]["bridge"]["IPAddress"]
    gw_port = next(e.split("=", 1)[1] for e in gw.attrs["Config"]["Env"] if "GATEWAY_PORT=" in e)
    target = f"http://{gw_ip}:{gw_port}{path}info/refs"
    # the hazard: anything on the manager's default bridge reaches the victim's app unasked
    before = heard()
    host.containers.run(
        swarm_lab.image("gpulab/python:3.11"),
        ["python3", "-c", f"import urllib.request; urllib.request.urlopen({target!r})"],
        remove=True,
    )
    assert wait_until(lambda: heard() > before, timeout=30, what="the control request")

    # the attacker's clone, held open by a server that never answers: where does it run?
    listener = socket.create_server(("0.0.0.0", 0))
    port = listener.getsockname()[1]
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(listener.accept()[0]), daemon=True).start()
    mallory = Api(hub, "mallory")
    probe = mallory.submit(
        command=["true"],
        resources={"gpus": 0, "cpus": 0.2, "memory": "128M"},
        git=[{"url": f"http://{swarm_lab.gateway}:{port}/held.git"}],
    )
    api = swarm_lab.api()

    def helper():
        found = api.services(filters={"label": "org.gpulab.helper=git-clone"})
        return [s for s in found if s["Spec"]["Labels"].get("org.gpulab.instance") == hub.instance]

    services = wait_until(helper, timeout=120, what="the clone helper's service")
    networks = services[0]["Spec"]["TaskTemplate"].get("Networks") or []
    overlay = api.inspect_network(user_network_name(hub.instance, "mallory", "overlay"))
    assert [n["Target"] for n in networks] == [overlay["Id"]], networks
    listener.close()
    for conn in held:
        conn.close()
    probed = mallory.wait(probe["id"], timeout=120)
    assert probed["state"] == "FAILED", probed
    print(probed["message"])

    # from there (the attacker's overlay, where their jobs run too), neither the gateway nor
    # the victim's app is reachable: a clone aimed at the manager's address is refused at
    # once; the gateway's bridge address is not routed from the overlay (its packets are
    # dropped: a clone would wait out its connect timeouts, minutes, and an interrupt waits
    # for the clone), so a job on the same overlay tries it with a short timeout
    before = heard()
    refused = mallory.submit(
        command=["true"],
        resources={"gpus": 0, "cpus": 0.2, "memory": "128M"},
        git=[{"url": f"http://{swarm_lab.gateway}:{gw_port}{path}info/refs"}],
    )
    failed = mallory.wait(refused["id"], timeout=120)
    assert failed["state"] == "FAILED" and failed["reason"] == "GIT_FAILED", failed
    assert "connection refused" in failed["message"], failed
    fetch = f"import urllib.request; urllib.request.urlopen({target!r}, timeout=10)"
    tried = mallory.submit(
        framework="python",
        command=["python", "-c", fetch],
        resources={"gpus": 0, "cpus": 0.2, "memory": "128M"},
    )
    ended = mallory.wait(tried["id"], timeout=120)
    assert ended["state"] == "FAILED", ended
    assert "timed out" in mallory.call("GET", f"/jobs/{tried['id']}/logs").text
    assert heard() == before
    victim.call("POST", f"/jobs/{job['id']}/interrupt")


def test_each_gpu_nodes_engine_is_asked_whether_it_can_hand_out_its_gpus(swarm_lab):
    """check_gpu_runtime on a Swarm (issue 28 item 3): each GPU node's own engine is asked
    (over TLS, as for an exec) which runtimes it has, by the one rule of one host. The lab's
    workers run runc as their default runtime, so neither can hand GPUs out: each is named,
    with what to configure, and its GPUs are kept out of placement while its CPUs stay; an
    engine that does not answer keeps its node's GPUs out too. (The lab's hubs turn the check
    off: their GPUs are made up.)"""
    from gpulab.gpus.inventory import from_nodes
    from gpulab.runtime.swarm import SwarmRuntime

    workers = {w.hostname for w in swarm_lab.workers}
    checked = SwarmRuntime(
        swarm_lab.api(),
        node_engine="tcp://{address}:2376",
        node_tls=swarm_lab.engine_tls(),
        check_gpus=True,
    )
    assert run_async(checked.gpu_delivery_refusal()) is None  # never the whole cluster
    nodes = {n.hostname: n for n in run_async(checked.nodes())}
    for name in workers:
        refusal = nodes[name].gpus_refused
        assert refusal.startswith(f"node {name} cannot hand out its GPUs: "), refusal
        assert "the engine's default runtime is 'runc'" in refusal, refusal
        assert "nvidia-ctk runtime configure --runtime=docker --set-as-default" in refusal
    devices, usable = from_nodes(nodes.values())
    assert devices == [] and workers <= set(usable)  # their CPUs still take workloads

    silent = SwarmRuntime(
        swarm_lab.api(), node_engine="tcp://{address}:2399", node_engine_plain=True, check_gpus=True
    )
    for n in run_async(silent.nodes()):
        if n.hostname in workers:
            assert "did not say which runtimes it has" in n.gpus_refused, n


def test_a_nodes_volumes_are_found_listed_and_removed_through_its_own_engine(
    swarm_lab, swarm_objects
):
    """SwarmRuntime's volume calls go to the node's own engine (a manager sees no node's
    volumes): a running workload's volume is found on its node and not on the other, listed
    with its node, and its removal is refused as in use (the engine's 409); once the workload
    is removed (its container gone from the node too, not only from the manager) the volume
    goes at once, and a second removal finds none. A node not in the cluster has none. A
    listing of one node asks that node only. A helper's volume (a failed pull's) goes at
    once after the helper ended: run_helper returns once the node removed its container."""
    from gpulab.runtime.base import EngineError, HelperSpec, Mount, WorkloadSpec
    from gpulab.runtime.swarm import SwarmRuntime

    rt = SwarmRuntime(swarm_lab.api(), node_tls=swarm_lab.engine_tls())
    here, other = (w.hostname for w in swarm_lab.workers)
    vol = f"{swarm_objects}-data"
    pulled = f"{swarm_objects}-pulled"
    helper = HelperSpec(
        image=swarm_lab.image("gpulab/debian:bookworm"),
        command=["sh", "-c", "echo half-pulled; exit 3"],
        mounts=[Mount(pulled, "/d")],
    )
    spec = WorkloadSpec(
        name=f"{swarm_objects}-w",
        image=swarm_lab.image("gpulab/debian:bookworm"),
        command=["sleep", "300"],
        mounts=[Mount(vol, "/d")],
        node=here,
        runner=False,
        stop_grace=1,
        cpus=0.1,
        memory=64 * 1024**2,
    )

    async def go():
        await rt.create_and_start(spec)
        found = [await rt.volume_exists(vol, n) for n in (here, other, "no-such-node")]
        listed = await rt.volumes_named(swarm_objects)
        per_node = [await rt.volumes_named(swarm_objects, n) for n in (here, other, "none")]
        ran = await rt.run_helper(helper, lambda _: None, here)
        discarded = await rt.remove_volume(pulled, here)  # at once: no 409
        with pytest.raises(EngineError) as in_use:
            await rt.remove_volume(vol, here)
        await rt.remove(spec.name)
        removed = await rt.remove_volume(vol, here)
        after = (
            await rt.volume_exists(vol, here),
            await rt.volumes_named(swarm_objects),
            await rt.remove_volume(vol, here),  # none there now: the engine's 404
        )
        return found, listed, in_use.value, removed, after, per_node, (ran, discarded)

    try:
        found, listed, in_use, removed, after, per_node, helped = run_async(go())
    finally:
        run_async(rt.remove(spec.name))
        for name in (vol, pulled):
            with contextlib.suppress(docker.errors.NotFound):  # gone already, or removed now
                swarm_lab.worker_client(here).api.remove_volume(name)
    assert found == [True, False, False] and listed == [(vol, here)]
    assert per_node == [[(vol, here)], [], []]
    ran, discarded = helped
    assert (ran.exit_code, ran.lines, discarded) == (3, ["half-pulled"], True)
    assert in_use.status == 409 and "in use" in str(in_use), in_use
    assert removed is True and after == (False, [], False)
