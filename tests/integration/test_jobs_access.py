"""A running job reached and fed: its ports behind the hub's login (HTTP and websockets), the
owner's secrets in its environment and nowhere else, working_dir and a read-only root file
system. A real hub, the gpulab service it starts, the Docker engine."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import http.client
import json
import os
import socket
import time

import pytest
import requests
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

from ..conftest import run_async
from ..support.api import TERMINAL, Api
from ..support.programs import APP

pytestmark = [pytest.mark.docker, pytest.mark.hub]

CONFIG = """
c.GpulabSettings.gpu_devices = [{"id": "0"}]
c.GpulabSettings.gpu_mode = "env"
c.GpulabSettings.supervisor_interval = 0.2
c.GpulabSettings.job_container_retention = 3600
"""
#: a small app on port 8765 (tornado is in the python image): what it was sent, and an echo
#: websocket; it sets a cookie on the whole origin, which only its owner's browser may get
SECRET_VALUE = "wandb-k3y-" + "x7" * 20


@pytest.fixture(scope="module")
def hub(hub_with):
    return hub_with(CONFIG)


@pytest.fixture(scope="module")
def users(hub):
    return {name: Api(hub, name) for name in ("owner", "friend", "stranger")}


@pytest.fixture(scope="module")
def app_job(users):
    owner = users["owner"]
    job = owner.submit(
        name="app",
        framework="python",
        command=["python", "-c", APP],
        ports=[{"port": 8765, "name": "app", "users": ["friend"]}],
    )
    running = owner.wait(job["id"], {"RUNNING", *TERMINAL})
    assert running["state"] == "RUNNING", running
    url = owner.hub.url + running["ports"][0]["url"]
    for _ in range(100):  # until the app listens
        r = requests.get(url, headers={"Authorization": f"token {owner.token}"}, timeout=10)
        if r.status_code == 200:
            break
        assert r.status_code == 502, r.text
        time.sleep(0.2)
    return running, url


def get(url, token=None, **kw):
    headers = kw.pop("headers", {})
    if token:
        headers["Authorization"] = f"token {token}"
    return requests.get(url, headers=headers, timeout=30, allow_redirects=False, **kw)


def test_a_port_opens_for_its_owner_and_no_hub_credential_reaches_the_app(users, app_job):
    job, url = app_job
    owner = users["owner"]
    assert job["ports"] == [
        {"name": "app", "port": 8765, "url": f"/services/gpulab/jobs/{job['id']}/ports/app/"}
    ]
    r = get(url + "x?token=" + owner.token + "&keep=1", owner.token)
    assert r.status_code == 200, r.text
    seen = r.json()
    # the whole path is forwarded (the app was told its prefix), the hub token is not
    assert seen["uri"] == f"/services/gpulab/jobs/{job['id']}/ports/app/x?keep=1"
    assert "Authorization" not in seen["headers"]
    assert owner.token not in json.dumps(seen)
    # the owner's own app: its cookie in the port's namespace, on the port's path only
    assert r.headers.get("Set-Cookie") == (
        f"gpulab.{job['id']}.app.planted=1; Path=/services/gpulab/jobs/{job['id']}/ports/app/"
    )
    # the hub's and the service's cookies never reach it, whatever their names; its own do
    jar = {"service-gpulab": "stolen", "jupyterhub-session-id": "s", "_xsrf": "x",
           f"gpulab.{job['id']}.app.planted": "1", f"gpulab.{job['id']}.other.planted": "2"}  # fmt: skip
    cookie = "; ".join(f"{k}={v}" for k, v in jar.items())
    seen = get(url + "?access_token=" + owner.token, owner.token, headers={"Cookie": cookie}).json()
    assert seen["headers"]["Cookie"] == "planted=1"
    assert seen["uri"].endswith("/ports/app/") and owner.token not in json.dumps(seen)
    assert "Content-Security-Policy" not in r.headers
    # the job was told where it lives
    env = owner.call("GET", f"/jobs/{job['id']}").json()["spec"]
    assert env["ports"][0]["name"] == "app"
    # /ports/app (no slash) leads to /ports/app/
    bare = get(url.rstrip("/"), owner.token)
    assert bare.status_code == 302 and bare.headers["Location"].endswith("/ports/app/")


def test_others_are_refused_and_sharees_get_a_sandboxed_page(hub, users, app_job):
    job, url = app_job
    stranger, friend = users["stranger"], users["friend"]
    refused = get(url, stranger.token)
    missing = get(url.replace(job["id"], "nosuchjob1"), stranger.token)
    assert refused.status_code == missing.status_code == 404
    assert refused.json()["message"] == f"no job {job['id']}"
    assert get(url).status_code == 401
    browser = get(url, headers={"Accept": "text/html"})
    assert browser.status_code == 302 and "/oauth2/authorize" in browser.headers["Location"]
    # a path that a proxy would normalize into another job's port, a service worker: refused
    owner = users["owner"].token
    # (the hub's proxy normalizes paths itself: sent to the service directly, as a proxy that
    # forwards raw paths would)
    raw = http.client.HTTPConnection("127.0.0.1", hub.service_port, timeout=30)
    raw.request("GET", url.split(hub.url)[1] + "%2e%2e/%2e%2e/%2e%2e/x/ports/app/",
                headers={"Authorization": f"token {owner}"})  # fmt: skip
    escape = raw.getresponse()
    assert escape.status == 400, escape.read()
    worker = get(url + "sw.js", owner, headers={"Service-Worker": "script"})
    assert worker.status_code == 403
    # a port not declared, for its owner: 404 naming the ports there are
    other = get(url.replace("/ports/app/", "/ports/other/"), users["owner"].token)
    assert other.status_code == 404 and "its ports: app" in other.json()["message"]
    # the user it is shared with gets through, in an opaque origin, with no cookie planted
    shared = get(url, friend.token)
    assert shared.status_code == 200
    assert shared.headers["Content-Security-Policy"].startswith("sandbox ")
    assert "allow-same-origin" not in shared.headers["Content-Security-Policy"]
    assert "Set-Cookie" not in shared.headers
    # an admin too (never as the hub's origin)
    as_admin = get(url, hub.admin_token)
    assert as_admin.status_code == 200, as_admin.text
    assert as_admin.headers["Content-Security-Policy"].startswith("sandbox ")


def test_a_websocket_echoes_through_the_port(users, app_job):
    job, url = app_job
    ws_url = url.replace("http://", "ws://") + "ws"

    async def talk(token: str) -> str:
        req = HTTPRequest(ws_url, headers={"Authorization": f"token {token}"})
        conn = await websocket_connect(req)
        await conn.write_message("hello")
        answer = await asyncio.wait_for(conn.read_message(), 10)
        conn.close()
        return answer

    assert run_async(talk(users["owner"].token)) == "echo:hello"
    with pytest.raises(Exception) as refused:
        run_async(talk(users["stranger"].token))
    assert "404" in str(refused.value)


def _unread(hub, path: str, token: str, websocket: bool) -> socket.socket:
    """A client that asks for ``path`` on the hub (HTTP, or a websocket handshake), reads the
    answer's head and then nothing more."""
    conn = socket.create_connection(("127.0.0.1", hub.port), timeout=30)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    upgrade = (
        "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
        f"Sec-WebSocket-Key: {base64.b64encode(os.urandom(16)).decode()}\r\n"
        if websocket
        else ""
    )
    conn.sendall(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{hub.port}\r\n"
        f"Authorization: token {token}\r\n{upgrade}\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += conn.recv(1)
    status = int(head.split()[1])
    assert status == (101 if websocket else 200), head
    return conn


def test_relays_are_bounded_and_nobody_reading_costs_no_memory(hub, users, app_job):
    """Websockets count against the per-user limit as requests do (the 33rd of one user's is
    refused, and closing them gives the places back), and a relay whose client reads nothing
    of an app that writes as fast as it can holds the service's memory flat."""
    from gpulab.jobs.ports import MAX_RELAYS_PER_USER as MAX_PER_USER

    job, url = app_job
    owner = users["owner"].token
    path = url.split(users["owner"].hub.url, 1)[1]
    ws_url = url.replace("http://", "ws://") + "ws"

    async def many(count: int) -> list:
        opened = []
        for _ in range(count):
            req = HTTPRequest(ws_url, headers={"Authorization": f"token {owner}"})
            opened.append(await websocket_connect(req))
        return opened

    async def over_the_limit() -> str:
        held = await many(MAX_PER_USER)
        try:
            with pytest.raises(Exception) as refused:
                await many(1)
            # a plain request counts too
            assert get(url, owner).status_code == 429
            return str(refused.value)
        finally:
            for conn in held:
                conn.close()

    # handshakes tornado refuses (no key: a 400 with no on_close) give their places back
    for _ in range(MAX_PER_USER + 1):
        conn = socket.create_connection(("127.0.0.1", hub.port), timeout=30)
        conn.sendall(
            f"GET {path}ws HTTP/1.1\r\nHost: 127.0.0.1:{hub.port}\r\n"
            f"Authorization: token {owner}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        assert conn.recv(12).split()[1] == b"400"
        conn.close()
    assert "429" in run_async(over_the_limit())
    # the places come back once they are closed (the friend, meanwhile, was never limited)
    time.sleep(1)
    assert len(run_async(many(1))) == 1
    assert get(url, users["friend"].token).status_code == 200

    before = hub.service_rss()
    clients = [
        _unread(hub, path + "flood", owner, True),
        _unread(hub, path + "stream", owner, False),
    ]
    samples = []
    for _ in range(10):  # 10 s of an app writing 4 MiB messages and 1 MiB chunks, unread
        time.sleep(1)
        samples.append(hub.service_rss())
    grew = (max(samples) - before) / 2**20
    print(f"service RSS {before / 2**20:.0f} MiB, +{grew:.1f} MiB at most over 10 s unread")
    for conn in clients:
        conn.close()
    # a few messages in flight per relay (MAX_WS_MESSAGE = 4 MiB), never the app's output
    assert grew < 48, samples


def test_a_port_closes_with_its_job(users, app_job):
    job, url = app_job
    owner = users["owner"]
    assert owner.call("POST", f"/jobs/{job['id']}/interrupt").status_code == 202
    owner.wait(job["id"])
    r = get(url, owner.token)
    assert r.status_code == 503 and "RUNNING" in r.json()["message"]


def test_a_secret_reaches_the_container_and_nowhere_else(hub, users, docker_client):
    owner = users["owner"]
    # the API takes it and never shows it back
    r = owner.call("PUT", "/secrets/wandb", json={"value": SECRET_VALUE})
    assert r.status_code == 201 and r.json()["name"] == "wandb", r.text
    assert SECRET_VALUE not in r.text
    assert owner.call("PUT", "/secrets/wandb", json={"value": SECRET_VALUE}).status_code == 200
    listed = owner.call("GET", "/secrets")
    assert [s["name"] for s in listed.json()["secrets"]] == ["wandb"]
    assert users["stranger"].call("GET", "/secrets").json()["secrets"] == []
    unknown = users["stranger"].call("GET", "/secrets/wandb")
    assert unknown.status_code == 404 and unknown.json()["message"] == "you have no secret wandb"
    bad = owner.call("PUT", "/secrets/Bad", json={"value": "x"})
    assert bad.status_code == 400 and bad.json()["field"] == "name"
    assert owner.call("PUT", "/secrets/x", json={"value": ""}).status_code == 400
    # a job refers to it; another user's job cannot
    refused = users["stranger"].call(
        "POST",
        "/jobs",
        json={"command": ["true"], "env": {"K": {"secret": "wandb"}}, "resources": {"gpus": 0}},
    )
    assert refused.status_code == 400 and refused.json()["field"] == "env.K", refused.text
    digest = hashlib.sha256(SECRET_VALUE.encode()).hexdigest()
    check = (
        "import hashlib, os; "
        "print(hashlib.sha256(os.environ['WANDB_API_KEY'].encode()).hexdigest(), "
        "os.environ['PLAIN'])"
    )
    job = owner.submit(
        framework="python",
        command=["python", "-c", check],
        env={"WANDB_API_KEY": {"secret": "wandb"}, "PLAIN": "not-secret"},
    )
    done = owner.wait(job["id"])
    assert done["state"] == "DONE", done
    logs = owner.call("GET", f"/jobs/{job['id']}/logs").text
    assert logs.split() == [digest, "not-secret"]
    # it reached the container's environment (what `docker inspect` shows an engine admin)
    container = docker_client.containers.get(f"{hub.instance}-job-{job['id']}")
    assert f"WANDB_API_KEY={SECRET_VALUE}" in container.attrs["Config"]["Env"]
    # ... and nowhere else: API answers, the service's and hub's log, the database files
    answers = [
        owner.call("GET", f"/jobs/{job['id']}").text,
        owner.call("GET", f"/jobs/{job['id']}/events").text,
        owner.call("GET", "/jobs").text,
        owner.call("GET", "/secrets").text,
        owner.call("GET", "/secrets/wandb").text,
    ]
    assert done["spec"]["env"]["WANDB_API_KEY"] == {"secret": "wandb"}
    for text in answers:
        assert SECRET_VALUE not in text
    assert SECRET_VALUE not in hub.log_file.read_text(errors="replace")
    files = list((hub.workdir / "data").glob("gpulab.sqlite*"))
    assert files
    for f in files:
        assert SECRET_VALUE.encode() not in f.read_bytes(), f
    # deleted before a job starts: the job fails naming it, and shows no value
    assert owner.call("DELETE", "/secrets/wandb").status_code == 204
    again = owner.call("DELETE", "/secrets/wandb")
    assert again.status_code == 404 and again.json()["message"] == "you have no secret wandb"
    gone = owner.call(
        "POST",
        "/jobs",
        json={"command": ["true"], "env": {"K": {"secret": "wandb"}}, "resources": {"gpus": 0}},
    )
    assert gone.status_code == 400 and "gpulab secret set wandb" in gone.json()["message"]


def test_working_dir_and_a_read_only_root(users):
    owner = users["owner"]
    job = owner.submit(
        command=[
            "sh",
            "-c",
            "pwd; touch /etc/gpulab-x 2>/dev/null || echo root-read-only; "
            "touch /tmp/y && echo tmp-writable; touch /workspace/z 2>/dev/null || echo ws-ro",
        ],
        working_dir="/home/jovyan",
        read_only_rootfs=True,
    )
    done = owner.wait(job["id"])
    assert done["state"] == "DONE", done
    lines = owner.call("GET", f"/jobs/{job['id']}/logs").text.split()
    assert lines[:3] == ["/home/jovyan", "root-read-only", "tmp-writable"]
    bad = owner.call("POST", "/jobs", json={"command": ["true"], "working_dir": "/etc"})
    assert bad.status_code == 400 and bad.json()["field"] == "working_dir"
