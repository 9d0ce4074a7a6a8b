"""Distributed jobs end to end: N workers of one job, gang-placed, running real
torch.distributed (gloo, CPU torch of the PyTorch image) through a real hub, the gpulab
service and the Docker engine. Each worker is given one (fake, gpu_mode "env") GPU, so the
gang placement and the per-rank devices are real ledger decisions."""

from __future__ import annotations

import time

import docker
import pytest

from ..support.api import Api, states
from ..support.containers import gpus_of
from ..support.programs import ALL_REDUCE

pytestmark = [pytest.mark.docker, pytest.mark.hub]

CONFIG = """
c.GpulabSettings.gpu_devices = [{"id": "0"}, {"id": "1"}, {"id": "2"}, {"id": "3"}]
c.GpulabSettings.gpu_mode = "env"
c.GpulabSettings.supervisor_interval = 0.2
c.GpulabSettings.preemption_grace = 2
c.GpulabSettings.job_container_retention = 3600
c.GpulabSettings.max_resources = {"cpus": 2, "memory": "4G", "gpus": 4}
c.GpulabSettings.job_quota = {"gpus": 4, "jobs": 4}
c.GpulabSettings.user_job_quotas = {"pia": {"gpus": 0, "jobs": 4}}
c.GpulabSettings.max_job_workers = 4
"""
ONE_GPU = {"gpus": 1, "cpus": 0.5, "memory": "1G"}

#: every rank adds rank+1: the sum is N(N+1)/2 only if all N took part. A marker in the
#: container's own /tmp (kept across a restart of the same container) tells the first run,
#: which then waits to be killed, from the second, which ends.


@pytest.fixture(scope="module")
def hub(hub_with, pytorch_image):
    return hub_with(CONFIG)


@pytest.fixture(scope="module")
def dora(hub):
    return Api(hub, "dora")


def gang(api: Api, workers: int, **body) -> dict:
    body.setdefault("command", ["python3", "-c", ALL_REDUCE])
    body.setdefault("resources", ONE_GPU)
    return api.submit(framework="pytorch", workers=workers, **body)


def held_devices(hub) -> dict[str, int]:
    """GPUs booked in the service's ledger, per job name (read from its database)."""
    import sqlite3

    db = sqlite3.connect(hub.workdir / "data" / "gpulab.sqlite")
    try:
        rows = db.execute(
            "SELECT j.name, count(*) FROM gpu_allocations a JOIN jobs j "
            "ON a.workload LIKE '%/job/' || j.id GROUP BY j.name"
        ).fetchall()
    finally:
        db.close()
    return dict(rows)


def logs(api: Api, job_id: str, **params) -> str:
    r = api.call("GET", f"/jobs/{job_id}/logs", params=params)
    assert r.status_code == 200, r.text
    return r.text


def test_two_workers_all_reduce_over_their_own_network(hub, dora, docker_client):
    job = gang(dora, 2)
    assert job["spec"]["workers"] == 2
    done = dora.wait(job["id"], timeout=150)
    assert done["state"] == "DONE", (done, hub.tail(60))
    assert states(done) == ["QUEUED", "INITIALIZING", "PENDING", "RUNNING", "FINALIZING", "DONE"]
    # both ranks took part: 1 + 2
    both = logs(dora, job["id"])
    assert "[rank 0] rank 0 of 2 on worker-0 gpus" in both, both
    assert "[rank 1] rank 1 of 2 on worker-1 gpus" in both, both
    assert both.count("sum 3") == 2, both
    one = logs(dora, job["id"], rank=1)
    assert "rank 1 of 2" in one and "rank 0 of 2" not in one and "[rank" not in one, one
    assert dora.call("GET", f"/jobs/{job['id']}/logs", params={"rank": 2}).status_code == 404
    # another user gets the same 404 as for a missing job, whatever the rank
    eve = Api(hub, "eve")
    for rank in (0, 1):
        got = eve.call("GET", f"/jobs/{job['id']}/logs", params={"rank": rank})
        assert got.status_code == 404 and "sum" not in got.text, got.text
    # the ranks' placement: one GPU each, different ones, in the record and the containers
    ranks = done["workers"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert len(set(gpus_of(docker_client, done))) == 2  # one GPU each, different ones
    assert done["billed_gpu_minutes"] == 2 * done["billed_minutes"] >= 2
    containers = [docker_client.containers.get(r["container"]) for r in ranks]
    nets = set()
    for r, c in zip(ranks, containers, strict=True):
        env = dict(e.partition("=")[::2] for e in c.attrs["Config"]["Env"])
        assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == (str(r["rank"]), "2", "0")
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("worker-0", "29500")
        assert env["NODE_RANK"] == env["PET_NODE_RANK"] == str(r["rank"])
        joined = c.attrs["NetworkSettings"]["Networks"]
        assert len(joined) == 1, joined  # the job's network and no other (not the user's)
        ((net, endpoint),) = joined.items()
        assert f"worker-{r['rank']}" in endpoint["Aliases"]
        nets.add(net)
        assert c.attrs["Config"]["User"] == "1000:100"
    (net,) = nets
    assert net == f"{hub.instance}-job-{job['id']}"
    # the job ended: its network is gone (the engine holds few bridges)
    assert [n.name for n in docker_client.networks.list(names=[net]) if n.name == net] == []
    # the events say it ran in 2 workers
    assert any("2 workers" in e["message"] for e in done["history"]), done["history"]


def test_a_worker_on_another_job_cannot_reach_the_gang(hub, dora, docker_client):
    """The same user's other job (on the user's network) neither resolves the gang's rank
    names nor reaches rank 0's rendezvous port."""
    job = gang(dora, 2, env={"WAIT_FIRST": "1"})
    running = dora.wait(job["id"], {"RUNNING"} | {"DONE", "FAILED", "ERROR"}, timeout=150)
    assert running["state"] == "RUNNING", running
    c0 = docker_client.containers.get(running["workers"][0]["container"])
    for _ in range(100):  # until rank 0 listens
        if "sum 3" in logs(dora, job["id"]):
            break
        time.sleep(0.3)
    c0.reload()
    (ip,) = [n["IPAddress"] for n in c0.attrs["NetworkSettings"]["Networks"].values()]
    probe = dora.submit(
        command=[
            "python3",
            "-c",
            "import socket\n"
            "try:\n  socket.gethostbyname('worker-0'); print('resolved')\n"
            "except OSError: print('unresolved')\n"
            "s = socket.socket(); s.settimeout(3)\n"
            f"try:\n  s.connect(('{ip}', 29500)); print('connected')\n"
            "except OSError as e: print('refused', type(e).__name__)\n",
        ],
    )
    probed = dora.wait(probe["id"], timeout=90)
    out = logs(dora, probe["id"])
    assert probed["state"] == "DONE" and "unresolved" in out and "connected" not in out, out
    assert dora.call("POST", f"/jobs/{job['id']}/interrupt").status_code in (200, 202)
    end = dora.wait(job["id"], timeout=60)
    assert end["state"] == "INTERRUPTED", end
    for r in end["workers"]:
        assert docker_client.containers.get(r["container"]).status == "exited"


def test_a_killed_worker_restarts_the_whole_job(hub, dora, docker_client):
    job = gang(dora, 2, env={"WAIT_FIRST": "1"}, retries=1)
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and logs(dora, job["id"]).count("sum 3") < 2:
        time.sleep(0.3)
    assert logs(dora, job["id"]).count("sum 3") == 2, hub.tail(40)
    docker_client.containers.get(f"{hub.instance}-job-{job['id']}-r1").kill()
    done = dora.wait(job["id"], timeout=150)
    assert done["state"] == "DONE", (done, hub.tail(60))
    assert done["restarts"] == 1
    assert states(done).count("RESTARTING") == 1
    restart = [e for e in done["history"] if e["state"] == "RESTARTING"][0]
    assert "rank 1: exit code 137" in restart["message"] and "all 2 workers" in restart["message"]
    # both ranks ran twice, and the second all_reduce had both again
    for rank in (0, 1):
        assert logs(dora, job["id"], rank=rank).count("sum 3") == 2


def test_a_gang_that_cannot_be_placed_whole_waits_holding_nothing(hub, dora, docker_client):
    # can never fit: 3 workers x 2 GPUs on 4 GPUs, refused at submission naming the field
    r = dora.call(
        "POST",
        "/jobs",
        json={
            "framework": "pytorch",
            "command": ["true"],
            "workers": 3,
            "resources": {"gpus": 2, "cpus": 0.5, "memory": "512M"},
        },
    )
    assert r.status_code == 400 and r.json()["field"] == "workers", r.text
    assert "at most 2 such workers" in r.json()["message"]
    # gpulab sets the rendezvous variables: a distributed job may not
    r = dora.call(
        "POST",
        "/jobs",
        json={"command": ["true"], "workers": 2, "env": {"MASTER_ADDR": "x"}, "resources": ONE_GPU},
    )
    assert r.status_code == 400 and r.json()["field"] == "env.MASTER_ADDR", r.text
    # two GPUs held by another job: a gang of three waits, holding none of the two free
    bert = Api(hub, "bert")
    blocker = bert.submit(
        name="blocker", command=["sleep", "600"], resources={**ONE_GPU, "gpus": 2}
    )
    assert bert.wait(blocker["id"], {"RUNNING"}, timeout=60)["state"] == "RUNNING"
    waiting = gang(dora, 3)
    time.sleep(2)  # several scheduler passes
    queued = dora.job(waiting["id"])
    assert queued["state"] == "QUEUED" and queued["devices"] == [], queued
    assert "waiting for 3 workers of 1 GPU(s)" in queued["message"], queued["message"]
    assert held_devices(hub) == {"blocker": 2}
    # the blocker goes: the whole gang starts at once, and all three took part (1 + 2 + 3)
    assert bert.call("POST", f"/jobs/{blocker['id']}/interrupt").status_code in (200, 202)
    done = dora.wait(waiting["id"], timeout=150)
    assert done["state"] == "DONE", (done, hub.tail(60))
    assert logs(dora, waiting["id"]).count("sum 6") == 3
    assert sorted(gpus_of(docker_client, done)) == ["0", "1", "2"]
    assert held_devices(hub) == {}


def test_time_out_and_resume_act_on_every_worker(hub, dora, docker_client):
    job = dora.submit(
        command=["sh", "-c", 'echo "up $RANK"; sleep 600'],
        workers=2,
        timeout=4,
        resources={"gpus": 0, "cpus": 0.2, "memory": "128M"},
    )
    end = dora.wait(job["id"], timeout=90)
    assert end["state"] == "INTERRUPTED" and end["reason"] == "TIMEOUT", end
    containers = [docker_client.containers.get(w["container"]) for w in end["workers"]]
    assert [c.status for c in containers] == ["exited", "exited"]
    assert "[rank 0] up 0" in logs(dora, job["id"]) and "[rank 1] up 1" in logs(dora, job["id"])
    # resumed: both workers run again (and time out again)
    assert dora.call("POST", f"/jobs/{job['id']}/resume").status_code in (200, 202)
    again = dora.wait(job["id"], {"RUNNING"}, timeout=60)
    for w in again["workers"]:
        assert docker_client.containers.get(w["container"]).status == "running"
    end = dora.wait(job["id"], timeout=90)
    assert end["state"] == "INTERRUPTED" and states(end).count("RUNNING") == 2


def test_a_hang_restarts_every_worker_in_place(hub, dora):
    job = dora.submit(
        command=["sh", "-c", 'echo "start $RANK"; sleep 600'],
        workers=2,
        hang_restart={"enabled": True, "period": 10},
        resources={"gpus": 0, "cpus": 0.2, "memory": "128M"},
    )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        got = dora.job(job["id"])
        hangs = [e for e in got["history"] if e["reason"] == "HANG_RESTART"]
        if hangs:
            break
        time.sleep(0.5)
    assert hangs and "in all 2 workers" in hangs[0]["message"], got["history"]
    # each worker's command ran again: its first line twice
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if all(logs(dora, job["id"], rank=r).count(f"start {r}") == 2 for r in (0, 1)):
            break
        time.sleep(0.5)
    for r in (0, 1):
        assert logs(dora, job["id"], rank=r).count(f"start {r}") == 2
    assert dora.call("POST", f"/jobs/{job['id']}/interrupt").status_code in (200, 202)
    assert dora.wait(job["id"], timeout=60)["state"] == "INTERRUPTED"


def test_a_preempted_gang_gives_every_gpu_back_and_waits_whole(hub, dora, docker_client):
    """A preemptible gang on every idle GPU (its owner's quota is 0) is preempted for one
    in-quota GPU: all its workers go, it is queued again and waits, holding nothing."""
    pia = Api(hub, "pia")
    gang_job = pia.submit(
        command=["sh", "-c", "sleep 600"],
        workers=2,
        preemptible=True,
        resources={"gpus": 2, "cpus": 0.2, "memory": "128M"},
    )
    running = pia.wait(gang_job["id"], {"RUNNING"}, timeout=60)
    assert running["over_quota"] and held_devices(hub) == {running["name"]: 4}
    names = [w["container"] for w in running["workers"]]
    urgent = dora.submit(name="urgent", command=["sleep", "6"], resources=ONE_GPU)
    assert dora.wait(urgent["id"], {"RUNNING"}, timeout=90)["state"] == "RUNNING"
    back = pia.job(gang_job["id"])  # 3 GPUs free: the gang of 4 waits, holding nothing
    assert back["state"] == "QUEUED" and back["devices"] == [], back
    assert "PREEMPTED" in [e["reason"] for e in back["history"]]
    assert held_devices(hub) == {"urgent": 1}
    for name in names:  # every worker removed, its GPUs released
        with pytest.raises(docker.errors.NotFound):
            docker_client.containers.get(name)
    # the gang starts again, whole, once the GPUs are free
    assert pia.wait(gang_job["id"], {"RUNNING"}, timeout=60)["state"] == "RUNNING"
    assert pia.call("POST", f"/jobs/{gang_job['id']}/interrupt").status_code in (200, 202)
    assert pia.wait(gang_job["id"], timeout=60)["state"] == "INTERRUPTED"


def test_one_users_workers_are_capped(hub):
    """max_job_workers (4 here): a gang of more is refused; one that would take its owner
    past it waits, saying why, and starts once the first ends."""
    cy = Api(hub, "cy")
    cpu = {"gpus": 0, "cpus": 0.2, "memory": "128M"}
    r = cy.call("POST", "/jobs", json={"command": ["true"], "workers": 5, "resources": cpu})
    assert r.status_code == 400 and r.json()["field"] == "workers", r.text
    assert "at most 4 together" in r.json()["message"]
    first = cy.submit(command=["sleep", "600"], workers=3, resources=cpu)
    assert cy.wait(first["id"], {"RUNNING"}, timeout=60)["state"] == "RUNNING"
    second = cy.submit(command=["true"], workers=2, resources=cpu)
    time.sleep(2)
    waiting = cy.job(second["id"])
    assert waiting["state"] == "QUEUED", waiting
    assert "3 workers running and this one needs 2; at most 4" in waiting["message"], waiting
    assert cy.call("POST", f"/jobs/{first['id']}/interrupt").status_code in (200, 202)
    assert cy.wait(second["id"], timeout=90)["state"] == "DONE"
