"""Every state change of a job and of a notebook is logged once, with its id, owner, states
and reason, and no secret reaches the logs: a real hub, the gpulab service it starts, the
Docker engine and an S3-speaking server (moto) whose keys the sync helpers get.

The hub's and the service's output both go to ``hub.log`` (the service is the hub's child):
the hub's as text lines, the service's as JSON objects (``log_format = "json"``).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import boto3
import pytest

from .s3server import TEST_ACCESS_KEY, TEST_SECRET_KEY, MotoS3Server, credentials_file
from .test_jobs import Api

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
def hub(tmp_path_factory, images, s3):
    from ..hubctl import Hub

    workdir = tmp_path_factory.mktemp("statelogs")
    credentials = credentials_file(workdir)
    hub = Hub(
        workdir=workdir, extra_config=CONFIG.format(endpoint=s3.endpoint, credentials=credentials)
    ).start()
    yield hub
    hub.stop()
    hub.remove_workloads()


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
