"""Every state change of a job and of a notebook is logged once, with its id, owner, states
and reason, and no secret reaches the logs (users' secrets, stores' keys, tokens in URLs and
headers of refused requests and writes): a real hub, the gpulab service it starts, the
Docker engine and an S3-speaking server (moto) whose keys the sync helpers get.

The hub's and the service's output both go to ``hub.log`` (the service is the hub's child):
the hub's as text lines, the service's as JSON objects (``log_format = "json"``).
"""

from __future__ import annotations

import json
import re
import secrets
import time
from pathlib import Path

import boto3
import pytest
import requests
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.websocket import websocket_connect

from ..conftest import run_async, wait_until
from ..support.api import Api
from ..support.s3 import TEST_ACCESS_KEY, TEST_SECRET_KEY, MotoS3Server, credentials_file

pytestmark = [pytest.mark.docker, pytest.mark.hub]

CONFIG = """
c.GpulabSettings.gpu_devices = [{{"id": "0"}}]
c.GpulabSettings.gpu_mode = "env"
c.GpulabSettings.supervisor_interval = 0.2
c.GpulabSettings.log_format = "json"
c.GpulabSettings.object_stores = {{
    "s3": {{
        "endpoint_url": "{endpoint}",
        "region": "us-east-1",
        "credentials": {{"file": "{credentials}"}},
    }},
}}
c.GpulabSettings.workspace_store = "s3"
c.GpulabSettings.workspace_bucket = "workspaces-logs"
c.GpulabSettings.volume_grants = [{{"store": "s3", "bucket": "results"}}]
"""
SECRET_VALUE = "wandb-k3y-" + "q9" * 20
#: a state line, as the hub's formatter and the service's write it
LINE = re.compile(
    r"gpulab\.state[^\]]*\] (?P<kind>job|notebook) (?P<id>\S+) owner=(?P<owner>\S+) "
    r"(?P<old>\S*)->(?P<new>[A-Z_]+)(?: reason=(?P<reason>\S+))?"
)


@pytest.fixture(scope="module")
def s3():
    server = MotoS3Server().start()
    boto3.client(
        "s3",
        endpoint_url=server.endpoint,
        region_name="us-east-1",
        aws_access_key_id=TEST_ACCESS_KEY,
        aws_secret_access_key=TEST_SECRET_KEY,
    ).create_bucket(Bucket="results")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def hub(hub_with, tmp_path_factory, s3):
    credentials = credentials_file(tmp_path_factory.mktemp("statelogs"))
    return hub_with(CONFIG.format(endpoint=s3.endpoint, credentials=credentials))


def service_token(hub) -> str:
    """The API token the hub gave its gpulab service (from the service's environment)."""
    for pid in hub.descendants():
        proc = Path(f"/proc/{pid}")
        try:
            if b"gpulab.service" not in (proc / "cmdline").read_bytes():
                continue
            env = dict(
                item.split(b"=", 1)
                for item in (proc / "environ").read_bytes().split(b"\0")
                if b"=" in item
            )
        except OSError:
            continue
        return env[b"JUPYTERHUB_API_TOKEN"].decode()
    raise AssertionError("no gpulab service process below the hub")


def state_lines(hub) -> list[dict]:
    """Every state line of the log, text (the hub's) or JSON (the service's)."""
    out = []
    for line in hub.log_file.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("logger") == "gpulab.state":
                out.append(
                    {
                        "kind": record["workload"],
                        "id": record["workload_id"],
                        "owner": record["owner"],
                        "old": record["old_state"],
                        "new": record["state"],
                        "reason": record["reason"] or None,
                        "exit_code": record["exit_code"],
                        "text": record["message"],
                    }
                )
        elif m := LINE.search(line):
            old = "" if m["old"] == "-" else m["old"]  # "-": created
            out.append({**m.groupdict(), "old": old, "exit_code": None, "text": line})
    return out


def logged(hub, kind: str, workload_id: str) -> list[dict]:
    return [x for x in state_lines(hub) if x["kind"] == kind and x["id"] == workload_id]


def wait_logged(hub, kind: str, workload_id: str, history: list[dict]) -> list[dict]:
    """The logged changes of a workload once as many as its history holds (a line is written
    just after its change commits: the API may show the change a moment before)."""
    deadline = time.monotonic() + 10
    while True:
        lines = logged(hub, kind, workload_id)
        if len(lines) >= len(history) or time.monotonic() > deadline:
            return lines
        time.sleep(0.2)


def as_changes(history: list[dict]) -> list[tuple[str, str, str]]:
    """(old, new, reason) for each transition of a history, as the log lines say them."""
    out, old = [], ""
    for e in history:
        if e.get("kind", "transition") != "transition":
            continue
        out.append((old, e["state"], e["reason"] or None))
        old = e["state"]
    return out


def test_each_state_change_is_logged_once_and_no_secret_is(hub, s3):
    alice = Api(hub, "alice")
    assert alice.call("PUT", "/secrets/wandb", json={"value": SECRET_VALUE}).status_code == 201
    check = "import os; open('/out/ok.txt', 'w').write(str(len(os.environ['WANDB_API_KEY'])))"
    done = alice.submit(
        framework="python",
        command=["python", "-c", check],
        env={"WANDB_API_KEY": {"secret": "wandb"}, "PLAIN": "not-secret"},
        volumes=["results@s3/alice/run1:/out:rw"],
    )
    failed = alice.submit(
        framework="python",
        command=["sh", "-c", "echo WANDB_API_KEY=$WANDB_API_KEY; exit 3"],
        env={"WANDB_API_KEY": {"secret": "wandb"}},
    )
    jobs = {j["id"]: alice.wait(j["id"]) for j in (done, failed)}
    assert jobs[done["id"]]["state"] == "DONE", jobs[done["id"]]
    assert jobs[failed["id"]]["state"] == "FAILED", jobs[failed["id"]]
    assert jobs[failed["id"]]["exit_code"] == 3

    r = hub.spawn("alice", "nb", {"framework": "python", "flavor": "cpu-small"}, token=alice.token)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("alice", "nb")
    hub.stop_server("alice", "nb")
    notebook = hub.wait_state("alice", "nb", "STOPPED")

    # one line per change, in order, with the record's id, owner, states and reason
    for job_id in jobs:
        history = alice.call("GET", f"/jobs/{job_id}").json()["history"]
        changes = as_changes(history)
        assert changes[0][1] == "QUEUED" and len(changes) >= 5, changes
        lines = wait_logged(hub, "job", job_id, changes)
        assert [(x["old"], x["new"], x["reason"]) for x in lines] == changes, hub.tail(80)
        assert {x["owner"] for x in lines} == {"alice"}
    changes = as_changes(notebook["history"])
    assert [c[1] for c in changes] == ["STARTING", "RUNNING", "STOPPING", "STOPPED"], changes
    lines = wait_logged(hub, "notebook", "alice/nb", changes)
    assert [(x["old"], x["new"], x["reason"]) for x in lines] == changes, hub.tail(80)
    assert {x["owner"] for x in lines} == {"alice"}
    # jobs are the service's (JSON, with the fields), notebooks the hub's (text)
    failed_line = logged(hub, "job", failed["id"])[-1]
    assert failed_line["new"] == "FAILED" and failed_line["exit_code"] == 3
    assert failed_line["text"].startswith(f"job {failed['id']} owner=alice FINALIZING->FAILED ")

    # no secret: the user's secret, the store's keys, the service's and the users' tokens
    text = hub.log_file.read_text(errors="replace")
    for secret in (SECRET_VALUE, TEST_SECRET_KEY, service_token(hub), alice.token):
        assert secret not in text


def _handshake(url: str, headers: dict[str, str]) -> int:
    """A WebSocket handshake as a browser makes it (``Sec-Fetch-Mode: websocket``: JupyterHub
    takes ``?token=`` on those): its HTTP status (101 if it opened)."""

    async def connect() -> int:
        request = HTTPRequest(url, headers={"Sec-Fetch-Mode": "websocket", **headers})
        try:
            conn = await websocket_connect(request)
        except HTTPClientError as e:
            return e.code
        conn.close()
        return 101

    return run_async(connect())


def test_no_token_reaches_the_logs(hub):
    """Tokens in ``?token=`` (refused shell and port WebSockets, reads and writes), in
    ``Authorization`` headers of refused requests and writes, an OAuth code and state, an XSRF
    token: not one of them is in any line the hub, its proxy or the service writes."""
    owner, intruder, other = Api(hub, "lena"), Api(hub, "mallory"), Api(hub, "oscar")
    fake = secrets.token_hex(16)  # shaped like a hub token, known to nobody
    code, state, xsrf = (secrets.token_urlsafe(24) for _ in range(3))
    used = {
        "lena's token": owner.token,
        "mallory's token": intruder.token,
        "oscar's token": other.token,
        "an unknown token": fake,
        "the OAuth code": code,
        "the XSRF token": xsrf,
    }
    job = owner.submit(command=["sleep", "600"], ports=[{"port": 8765, "name": "app"}])
    api = f"{hub.url}/services/gpulab/api"
    ws_api = api.replace("http://", "ws://")
    ws_job = f"{ws_api}/jobs/{job['id']}"
    ws_port = f"{hub.url.replace('http://', 'ws://')}/services/gpulab/jobs/{job['id']}/ports/app"

    # refused WebSocket handshakes, the token in the query as browsers must send it
    refused = {
        f"{ws_job}/shell?token={intruder.token}": 404,  # someone else's job
        f"{ws_api}/jobs/j000000000000/shell?token={intruder.token}": 404,  # no such job
        f"{ws_port}/ws?token={intruder.token}": 404,  # someone else's port
        f"{ws_job}/shell?token={fake}": 401,  # an unknown token
        f"{ws_job}/shell?%74oken={other.token}": 404,  # "token", percent-encoded
        f"{ws_job}/shell?cols=80&access_token={fake}&_xsrf={xsrf}": 401,
    }
    for url, status in refused.items():
        assert _handshake(url, {}) == status, url
    foreign = {"Origin": "http://evil.example"}
    assert _handshake(f"{ws_job}/shell?token={owner.token}", foreign) == 403
    # the owner's port, whose app does not listen (or whose job is not running yet)
    assert _handshake(f"{ws_port}/ws?token={owner.token}", {}) in (409, 502, 503)

    # plain requests: refused ones and writes, the token in the header and in the query
    def call(method: str, path: str, token: str | None, **kw) -> int:
        headers = {"Authorization": f"token {token}"} if token else {}
        return requests.request(method, api + path, headers=headers, timeout=60, **kw).status_code

    assert call("GET", "/jobs/j000000000000", owner.token) == 404
    assert call("GET", f"/jobs/{job['id']}", intruder.token) == 404
    assert call("GET", "/jobs", fake) == 401
    assert call("POST", "/jobs", owner.token, json={"command": []}) == 400
    assert call("POST", f"/jobs?token={owner.token}", None, json={"command": ["true"]}) in (
        401,
        403,
    )
    assert call("DELETE", f"/jobs/j000000000000?token={intruder.token}", intruder.token) == 404
    assert call(
        "PUT", f"/secrets/wandb?token={owner.token}", owner.token, json={"value": "v" * 9}
    ) in (
        200,
        201,
    )
    assert call("GET", f"/jobs?token={other.token}&limit=0", other.token) == 400
    # the hub's own API and the service's OAuth callback, with what they must not log
    r = requests.get(f"{hub.api}/users/lena?token={intruder.token}", timeout=30)
    assert r.status_code in (403, 404), r.text
    r = requests.get(
        f"{hub.url}/services/gpulab/oauth_callback?code={code}&state={state}",
        timeout=30,
        allow_redirects=False,
    )
    assert 400 <= r.status_code < 500, r.text

    # every refused request was logged (so the check below has lines to look at)...
    paths = [f"/api/jobs/{job['id']}/shell", "/api/jobs/j000000000000/shell", "/ports/app/ws"]
    paths += ["/api/jobs/j000000000000", "/api/secrets/wandb", "/oauth_callback"]

    def all_logged() -> str:
        text = hub.log_file.read_text(errors="replace")
        return text if all(p in text for p in paths) else ""

    text = wait_until(all_logged, timeout=10, what="the requests' log lines")
    # ...and no line holds any of the secrets used
    leaked = {
        what: [line for line in text.splitlines() if value in line][:3]
        for what, value in used.items()
        if value in text
    }
    assert not leaked, leaked
    # the OAuth state is a nonce, not a credential: out of the URLs, but JupyterHub's HubOAuth
    # itself names a mismatched one ("oauth state argument '...' != cookie ...=...")
    assert [
        line for line in text.splitlines() if state in line and "state argument" not in line
    ] == []
