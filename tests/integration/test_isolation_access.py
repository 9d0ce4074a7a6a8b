"""Tenant isolation, played as attacks with ordinary accounts against one real hub, its gpulab
service and the Docker engine: scopes (not the admin flag) decide, a user's notebooks share one
set of limits, GPUs count across notebooks and jobs, queue caps hold under concurrent
submissions, lists are paginated, and logs and volumes do not grow without bound.
"""

from __future__ import annotations

import concurrent.futures
import time

import pytest
import requests

from ..support.api import TERMINAL, Api

pytestmark = [pytest.mark.docker, pytest.mark.hub]

CONFIG = """
c.GpulabSettings.gpu_devices = [{"id": "0"}, {"id": "1"}, {"id": "2"}, {"id": "3"}]
c.GpulabSettings.gpu_mode = "env"
c.GpulabSettings.supervisor_interval = 0.2
c.GpulabSettings.preemption_grace = 1
c.GpulabSettings.max_resources = {"cpus": 1, "memory": "1G", "gpus": 2}
c.GpulabSettings.job_quota = {"gpus": 1, "jobs": 4}
c.GpulabSettings.user_job_quotas = {"gina": {"gpus": 1, "jobs": 2}}
c.GpulabSettings.max_queued_jobs = 3
c.GpulabSettings.job_container_retention = 2
c.GpulabSettings.container_log_max_size = "1m"
c.GpulabSettings.container_log_max_files = 2
# boss is a hub admin (the admin flag and JupyterHub's admin role), not a gpulab admin
c.Authenticator.admin_users = {"admin", "boss"}
"""
SMALL = {"gpus": 0, "cpus": 0.2, "memory": "256M"}


@pytest.fixture(scope="module")
def hub(hub_with):
    return hub_with(CONFIG)


def _token(hub, user: str, scopes: list[str]) -> str:
    r = hub.request("POST", f"/users/{user}/tokens", json={"note": "narrow", "scopes": scopes})
    assert r.status_code == 201, r.text
    return r.json()["token"]


def _get(hub, path: str, token: str | None, method: str = "GET") -> requests.Response:
    headers = {"Authorization": f"token {token}"} if token else {}
    return requests.request(
        method, f"{hub.url}/services/gpulab/api{path}", headers=headers, timeout=30
    )


def _interrupt_all(api: Api) -> None:
    for job in api.call("GET", "/jobs", params={"limit": 500}).json()["jobs"]:
        if job["state"] not in TERMINAL:
            api.call("POST", f"/jobs/{job['id']}/interrupt")
    for job in api.call("GET", "/jobs", params={"limit": 500}).json()["jobs"]:
        api.wait(job["id"], timeout=60)


def test_scopes_decide_not_the_admin_flag(hub):
    alice, bob = Api(hub, "alice"), Api(hub, "bob")
    job = alice.submit(command=["sleep", "20"], resources=SMALL)
    path = f"/jobs/{job['id']}"
    unknown = "/jobs/j000000000000"

    # the configured gpulab admin (role gpulab-admin: custom:gpulab:admin) sees it
    admin = hub.create_user("admin")
    assert _get(hub, path, admin).status_code == 200
    assert _get(hub, "/jobs?all=true", admin).status_code == 200

    # the same admin's token narrowed to the service alone is no gpulab admin, nor a reader
    narrow = _token(hub, "admin", ["access:services!service=gpulab"])
    r = _get(hub, path, narrow)
    assert r.status_code == 403 and "custom:gpulab:jobs:read" in r.json()["message"], r.text
    # with the read scope it reads its own jobs only: alice's job is a 404 like an unknown id
    reader = _token(hub, "admin", ["access:services!service=gpulab", "custom:gpulab:jobs:read"])
    theirs, nothing = _get(hub, path, reader), _get(hub, unknown, reader)
    assert theirs.status_code == nothing.status_code == 404
    assert theirs.json()["message"].replace(job["id"], "ID") == nothing.json()["message"].replace(
        "j000000000000", "ID"
    )
    assert _get(hub, "/jobs?all=true", reader).status_code == 403
    assert _get(hub, "/notebooks?all=true", reader).status_code == 403

    # a hub admin (the admin flag) without the gpulab admin scope acts as an ordinary user
    boss = hub.create_user("boss")
    assert hub.request("GET", "/users/boss").json()["admin"] is True
    assert _get(hub, path, boss).status_code == 404
    assert _get(hub, "/jobs?user=alice", boss).status_code == 403
    r = _get(hub, f"{path}/interrupt", boss, method="POST")
    assert r.status_code == 404, r.text
    assert alice.job(job["id"])["state"] not in TERMINAL

    # no or bad credentials: 401; a valid token without access to the service: 403
    for token in (None, "not-a-token"):
        r = _get(hub, "/jobs", token)
        assert r.status_code == 401, r.text
        assert r.headers.get("WWW-Authenticate", "").startswith("token")
    outsider = _token(hub, "alice", ["read:users:name!user=alice"])
    r = _get(hub, "/jobs", outsider)
    assert r.status_code == 403 and "access:services" in r.json()["message"], r.text

    # the notebook push needs notebooks:manage; someone else's notebook is a 404
    jobs_only = _token(
        hub, "alice", ["access:services!service=gpulab", "custom:gpulab:jobs:manage"]
    )
    r = _get(hub, "/notebooks/alice/x/push", jobs_only, method="POST")
    assert r.status_code == 403 and "notebooks:manage" in r.json()["message"], r.text
    assert _get(hub, "/notebooks/alice/x/push", alice.token, method="POST").status_code == 404
    assert _get(hub, "/notebooks/alice/x", bob.token).status_code == 404
    assert _get(hub, "/notebooks/alice/x/push", bob.token, method="POST").status_code == 404
    _interrupt_all(alice)


def test_notebooks_share_the_users_limits_and_gpu_quota(hub, docker_client):
    carol = Api(hub, "carol")
    first = {"cpus": 0.6, "memory": "512M", "gpus": 1}
    hub.spawn("carol", "a", first, token=carol.token)
    hub.wait_ready("carol", "a", timeout=120)

    # a second notebook within the per-notebook maximum, beyond the sum: refused
    hub.spawn("carol", "b", {"cpus": 0.6, "memory": "256M", "gpus": 0}, token=carol.token)
    nb = hub.wait_state("carol", "b", "FAILED")
    assert nb["history"][-1]["reason"] == "LIMIT_EXCEEDED", nb["history"]
    assert "0.6 CPUs in use + 0.6 > 1" in nb["history"][-1]["message"]
    assert not docker_client.containers.list(all=True, filters={"name": nb["container"]})

    # within the notebook limits, but the user's GPU quota (1) is held by the first notebook
    hub.spawn("carol", "c", {"cpus": 0.2, "memory": "256M", "gpus": 1}, token=carol.token)
    nb = hub.wait_state("carol", "c", "FAILED")
    assert nb["history"][-1]["reason"] == "GPU_QUOTA_EXCEEDED", nb["history"]

    # jobs count against the same GPU quota: a GPU job waits while the notebook holds it
    job = carol.submit(command=["sleep", "1"], resources={**SMALL, "gpus": 1})
    time.sleep(3)
    assert carol.job(job["id"])["state"] == "QUEUED"
    hub.stop_server("carol", "a")
    end = carol.wait(job["id"], timeout=60)
    assert end["state"] == "DONE", end


def test_queue_cap_is_atomic_priority_ceiling_and_pages(hub):
    dave = Api(hub, "dave")

    def submit(_):
        r = dave.call("POST", "/jobs", json={"command": ["sleep", "30"], "resources": SMALL})
        return r.status_code

    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        codes = list(pool.map(submit, range(10)))
    assert sorted(codes) == [201] * 3 + [409] * 7, codes

    # the quota counts QUEUED jobs too (gina's allows 2), as atomically; a preemptible job
    # is never refused for the quota (it may only borrow idle GPUs)
    gina = Api(hub, "gina")

    def submit_gina(_):
        r = gina.call("POST", "/jobs", json={"command": ["sleep", "30"], "resources": SMALL})
        return r.status_code, r.json().get("message", "")

    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        answers = list(pool.map(submit_gina, range(10)))
    assert sorted(c for c, _ in answers) == [201] * 2 + [409] * 8, answers
    assert all("your quota allows 2 jobs queued or running" in m for c, m in answers if c == 409), (
        answers
    )
    borrow = gina.call(
        "POST",
        "/jobs",
        json={"command": ["sleep", "30"], "resources": SMALL, "preemptible": True},
    )
    assert borrow.status_code == 201, borrow.text
    for j in gina.call("GET", "/jobs").json()["jobs"]:
        gina.call("POST", f"/jobs/{j['id']}/interrupt")

    page = dave.call("GET", "/jobs", params={"limit": 2}).json()
    assert len(page["jobs"]) == 2 and page["total"] == 3 and page["next"], page
    rest = requests.get(
        hub.url + page["next"], headers={"Authorization": f"token {dave.token}"}, timeout=30
    ).json()
    assert len(rest["jobs"]) == 1 and rest["next"] is None, rest
    ids = [j["id"] for j in page["jobs"] + rest["jobs"]]
    assert len(set(ids)) == 3
    for bad in ({"limit": 0}, {"limit": 501}, {"offset": -1}, {"limit": "x"}):
        r = dave.call("GET", "/jobs", params=bad)
        assert r.status_code == 400 and r.json()["field"] in bad, (bad, r.text)

    _interrupt_all(dave)
    r = dave.call("POST", "/jobs", json={"command": ["true"], "priority": 90, "resources": SMALL})
    assert r.status_code == 403 and r.json()["field"] == "priority", r.text
    admin = Api(hub, "admin")
    job = admin.submit(command=["true"], priority=90, resources=SMALL)
    assert admin.wait(job["id"])["state"] == "DONE"


def test_logs_are_capped_and_volumes_go_with_containers(hub, docker_client):
    erin = Api(hub, "erin")
    # 8 MiB of numbered lines; the engine keeps at most 2 files of 1 MiB
    script = "import sys\nfor i in range(8192):\n    sys.stdout.write(str(i).rjust(1023) + '\\n')\n"
    job = erin.submit(
        command=["sh", "-c", f'python3 -c "{script}"; sleep 4'],
        volumes=["scratch@local/erin:/out:rw"],
        resources=SMALL,
    )
    running = erin.wait(job["id"], states={"RUNNING"})
    container = docker_client.containers.get(running["container"])
    assert container.attrs["HostConfig"]["LogConfig"] == {
        "Type": "json-file",
        "Config": {"max-file": "2", "max-size": "1m"},
    }
    volumes = [m["Name"] for m in container.attrs["Mounts"] if m["Type"] == "volume"]
    assert len(volumes) == 1
    end = erin.wait(job["id"])
    assert end["state"] == "DONE", end
    logs = erin.call("GET", f"/jobs/{job['id']}/logs").content
    assert len(logs) <= 2 * 1024 * 1024, len(logs)
    assert logs.rstrip().endswith(b"8191") and b" 0\n" not in logs[:2048]

    # after the retention delay the container and its data volume are gone; the saved log stays
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (
        docker_client.containers.list(all=True, filters={"name": running["container"]})
        or docker_client.volumes.list(filters={"name": volumes[0]})
    ):
        time.sleep(0.5)
    assert not docker_client.containers.list(all=True, filters={"name": running["container"]})
    assert not docker_client.volumes.list(filters={"name": volumes[0]})
    saved = erin.call("GET", f"/jobs/{job['id']}/logs").content
    assert saved.rstrip().endswith(b"8191") and len(saved) <= 10 * 1024 * 1024


def test_follow_streams_are_released_when_clients_go(hub):
    fred = Api(hub, "fred")
    job = fred.submit(
        command=["sh", "-c", "while true; do echo tick; sleep 0.2; done"], resources=SMALL
    )
    fred.wait(job["id"], states={"RUNNING"})
    url = f"{fred.base}/jobs/{job['id']}/logs?follow=true"
    headers = {"Authorization": f"token {fred.token}"}

    def open_stream() -> requests.Response:
        # a session of its own, kept by the response: requests.get() would close the
        # connection on return (the client going away at once)
        session = requests.Session()
        r = session.get(url, headers=headers, stream=True, timeout=30)
        r.session = session
        return r

    streams = [open_stream() for _ in range(8)]
    # the readers are kept: a discarded one closes its connection (urllib3 does on exit)
    readers = [s.iter_content(64) for s in streams]
    for s, reader in zip(streams, readers, strict=True):
        assert s.status_code == 200 and b"tick" in next(reader)
    r = open_stream()
    assert r.status_code == 429 and "log streams" in r.json()["message"], r.text
    for s in streams:
        s.close()  # the clients go away: each stream's thread and queue must be released
        s.session.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        again = [open_stream() for _ in range(8)]
        codes = [s.status_code for s in again]
        for s in again:
            s.close()
            s.session.close()
        if codes == [200] * 8:
            break
        time.sleep(0.5)
    assert codes == [200] * 8, codes
    _interrupt_all(fred)
