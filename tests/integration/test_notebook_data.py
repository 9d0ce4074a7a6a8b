"""Workspaces and volumes synced with a real S3-speaking server (moto over HTTP).

The hub, its service and the sync helper containers are real; the helper containers reach the
S3 server on loopback through the host network.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import io
import json
import os
import subprocess
import sys
import threading
import time
import zipfile

import pytest
import requests

from ..conftest import wait_until
from ..support.containers import sh
from ..support.hub import SpawnFailed
from ..support.s3 import TEST_ACCESS_KEY, TEST_SECRET_KEY, MotoS3Server, credentials_file

pytestmark = [pytest.mark.docker, pytest.mark.hub]

CONFIG = """
c.GpulabSettings.object_stores = {{
    "s3": {{
        "endpoint_url": "{endpoint}",
        "region": "us-east-1",
        "credentials": {{"file": "{credentials}"}},
    }},
}}
c.GpulabSettings.workspace_store = "s3"
c.GpulabSettings.workspace_bucket = "workspaces-test"
c.GpulabSettings.home_sync = True
c.GpulabSettings.sync_settle = 0.5
c.GpulabSettings.volume_grants = [
    {{"store": "s3", "bucket": "datasets", "modes": ["ro"]}},
    {{"store": "s3", "bucket": "results"}},
]
"""


@pytest.fixture(scope="module")
def s3():
    server = MotoS3Server().start()
    server.client = server.boto_client()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def hub(hub_with, tmp_path_factory, s3):
    credentials = credentials_file(tmp_path_factory.mktemp("data"))
    hub = hub_with(CONFIG.format(endpoint=s3.endpoint, credentials=credentials))
    hub.token = hub.create_user("alice")
    return hub


def keys(s3, bucket: str, prefix: str = "") -> set[str]:
    pages = s3.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return {o["Key"] for page in pages for o in page.get("Contents", [])}


def start(hub, server: str, options: dict, user: str = "alice", token: str = "") -> dict:
    r = hub.spawn(user, server, options, token=token or hub.token)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready(user, server, timeout=120)
    return hub.notebook(user, server).json()


def test_workspace_round_trip_across_stop_and_start(hub, s3, docker_client):
    nb = start(hub, "ws", {})
    code, out = sh(
        docker_client,
        nb["container"],
        "echo hello > /workspace/notes.txt && mkdir -p /workspace/sub "
        "&& head -c 300000 /dev/urandom > /workspace/sub/data.bin && sha256sum /workspace/sub/data.bin",
    )
    assert code == 0, out
    digest = out.split()[0]
    hub.stop_server("alice", "ws")
    nb = hub.notebook("alice", "ws").json()
    assert nb["state"] == "STOPPED", nb["history"][-1]
    assert "pushed workspace: 2 transferred" in nb["history"][-1]["message"]
    assert {"workspaces/alice/ws/notes.txt", "workspaces/alice/ws/sub/data.bin"} <= keys(
        s3, "workspaces-test", "workspaces/alice/ws/"
    )

    # a new host: the local volume is gone, the workspace comes back from object storage
    docker_client.volumes.get(nb["container"] + "-workspace").remove(force=True)
    nb = start(hub, "ws", {})
    code, out = sh(
        docker_client,
        nb["container"],
        "cat /workspace/notes.txt; sha256sum /workspace/sub/data.bin; rm /workspace/notes.txt",
    )
    assert code == 0, out
    assert out.splitlines()[0] == "hello" and digest in out
    # the workspace propagates deletions: a deleted file does not come back
    hub.stop_server("alice", "ws")
    assert "workspaces/alice/ws/notes.txt" not in keys(s3, "workspaces-test")
    assert "workspaces/alice/ws/sub/data.bin" in keys(s3, "workspaces-test")


def vsix() -> bytes:
    """A VS Code extension as a .vsix: a zip of its manifest and its package.json."""
    manifest = (
        '<?xml version="1.0" encoding="utf-8"?><PackageManifest Version="2.0.0" '
        'xmlns="http://schemas.microsoft.com/developer/vsx-schema/2011"><Metadata><Identity '
        'Language="en-US" Id="home-check" Version="0.0.1" Publisher="gpulab-test"/>'
        "<DisplayName>home check</DisplayName><Description>a test</Description></Metadata>"
        '<Installation><InstallationTarget Id="Microsoft.VisualStudio.Code"/></Installation>'
        '<Dependencies/><Assets><Asset Type="Microsoft.VisualStudio.Code.Manifest" '
        'Path="extension/package.json" Addressable="true"/></Assets></PackageManifest>'
    )
    package = {"name": "home-check", "publisher": "gpulab-test", "version": "0.0.1"}
    package["engines"] = {"vscode": "^1.0.0"}
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("extension.vsixmanifest", manifest)
        z.writestr("extension/package.json", json.dumps(package))
    return out.getvalue()


#: what a user does to their home (issue 31): a package installed with pip --user (built
#: here: a container has no network), a VS Code extension from a local .vsix, a dotfile, and
#: a cache that the home's exclusions keep out of the store
CHANGE_THE_HOME = f"""
set -e
cd /tmp && mkdir -p p/hello_home && echo 'X = 41' > p/hello_home/__init__.py
printf '[project]\\nname = "hello-home"\\nversion = "1.0"\\n[build-system]\\n' > p/pyproject.toml
printf 'requires = ["setuptools"]\\nbuild-backend = "setuptools.build_meta"\\n' >> p/pyproject.toml
pip install -q --user --no-index --no-build-isolation /tmp/p
echo {base64.b64encode(vsix()).decode()} | base64 -d > /tmp/x.vsix
d=/home/jovyan/.local/share/code-server
/opt/code-server/bin/node /opt/code-server/lib/node_modules/code-server/out/node/entry.js \\
    --user-data-dir $d --extensions-dir $d/extensions --install-extension /tmp/x.vsix >/dev/null
echo 'export HOME_CHECK=kept' >> /home/jovyan/.bashrc
mkdir -p /home/jovyan/.cache/pip && head -c 100000 /dev/urandom > /home/jovyan/.cache/pip/big
cd /home/jovyan && python -m venv --without-pip envs/v && mkdir -p .local/bin
printf '#!/bin/sh\necho tool ran\n' > .local/bin/mytool && chmod 755 .local/bin/mytool
ln -s /etc/passwd passwd-link && ln -s ../../nowhere dangling
"""
# after the volume is lost: the script runs, the venv's links work, links stay links
CHECK_LINKS_AND_MODES = (
    "cd /home/jovyan && .local/bin/mytool && stat -c %a .local/bin/mytool"
    " && envs/v/bin/python -c 'import sys; print(sys.prefix)'"
    " && readlink passwd-link dangling envs/v/lib64"
)


def test_a_home_survives_its_stop_and_a_lost_volume(hub, s3, docker_client):
    nb = start(hub, "home", {})
    code, out = sh(docker_client, nb["container"], CHANGE_THE_HOME)
    assert code == 0, out
    hub.stop_server("alice", "home")
    nb = hub.notebook("alice", "home").json()
    assert nb["state"] == "STOPPED" and "; home: " in nb["history"][-1]["message"], nb["history"]
    stored = keys(s3, "workspaces-test", "workspaces/alice/.home/home/")
    assert "workspaces/alice/.home/home/.bashrc" in stored
    assert not [k for k in stored if "/.cache/" in k or "/__pycache__/" in k], stored

    # a new host: the local home is gone; it comes back from object storage
    docker_client.volumes.get(nb["container"] + "-home").remove(force=True)
    nb = start(hub, "home", {})
    check = (
        "python -c 'import hello_home; print(hello_home.X)'; "
        "ls /home/jovyan/.local/share/code-server/extensions; "
        "grep HOME_CHECK /home/jovyan/.bashrc; ls /home/jovyan/.profile /home/jovyan/.cache 2>&1"
    )
    code, out = sh(docker_client, nb["container"], check)
    assert code != 0 and out.startswith("41\n"), out  # ls .cache fails: it was not stored
    assert "gpulab-test.home-check-0.0.1" in out and "export HOME_CHECK=kept" in out
    assert "/home/jovyan/.profile\n" in out  # the image's skeleton, kept from the first start
    assert "/home/jovyan/.cache': No such file or directory" in out
    code, out = sh(docker_client, nb["container"], CHECK_LINKS_AND_MODES)
    assert (code, out) == (
        0,
        "tool ran\n755\n/home/jovyan/envs/v\n/etc/passwd\n../../nowhere\nlib\n",
    ), out
    hub.stop_server("alice", "home")


def test_ro_rw_rwd_volumes(hub, s3, docker_client):
    c = s3.client
    for bucket in ("datasets", "results"):
        c.create_bucket(Bucket=bucket)
    c.put_object(Bucket="datasets", Key="mnist/train.csv", Body=b"1,2,3\n")
    # a large object, in one GET, on the Docker volume
    big = os.urandom(17 * 1024 * 1024 + 5)
    c.put_object(Bucket="datasets", Key="mnist/big.bin", Body=big)
    c.put_object(Bucket="results", Key="run1/old.txt", Body=b"old")
    c.put_object(Bucket="results", Key="run2/gone.txt", Body=b"gone")

    nb = start(
        hub,
        "vols",
        {
            "volumes": [
                "datasets@s3/mnist:/data/mnist",
                "results@s3/run1:/results:rw",
                "results@s3/run2:/results2:rwd",
            ]
        },
    )
    assert nb["options"]["volumes"] == [
        "datasets@s3/mnist:/data/mnist:ro",
        "results@s3/run1:/results:rw",
        "results@s3/run2:/results2:rwd",
    ]
    container = nb["container"]
    assert sh(docker_client, container, "cat /data/mnist/train.csv") == (0, "1,2,3\n")
    code, out = sh(docker_client, container, "sha256sum /data/mnist/big.bin")
    assert code == 0 and out.split()[0] == hashlib.sha256(big).hexdigest()
    code, out = sh(docker_client, container, "touch /data/mnist/new 2>&1")
    assert code != 0 and "Read-only file system" in out
    code, out = sh(
        docker_client,
        container,
        "echo new > /results/new.txt && rm /results/old.txt "
        "&& echo made > /results2/made.txt && rm /results2/gone.txt",
    )
    assert code == 0, out
    hub.stop_server("alice", "vols")
    assert hub.notebook("alice", "vols").json()["state"] == "STOPPED"
    assert keys(s3, "datasets") == {"mnist/train.csv", "mnist/big.bin"}
    # rw: additions pushed, the deletion not propagated
    assert keys(s3, "results", "run1/") == {"run1/old.txt", "run1/new.txt"}
    # rwd: the deletion propagated too
    assert keys(s3, "results", "run2/") == {"run2/made.txt"}


def test_a_job_and_a_notebook_reading_one_dataset_pull_it_once(hub, s3, docker_client):
    """The dataset cache (on by default) across the service's jobs and the hub's notebooks,
    and across users: alice's job pulls a read-only dataset (granted read-only to every
    user) into the host's copy, bob's notebook started after it mounts that copy, read-only,
    mounted twice, and reads every byte; nothing pulls it a second time."""
    from ..support.api import Api

    with contextlib.suppress(s3.client.exceptions.BucketAlreadyOwnedByYou):
        s3.client.create_bucket(Bucket="datasets")
    files = {"shared/a.bin": os.urandom(3 * 1024 * 1024 + 7), "shared/b.txt": b"labels\n"}
    for key, body in files.items():
        s3.client.put_object(Bucket="datasets", Key=key, Body=body)
    sums = "cd /data && sha256sum a.bin b.txt"
    expected = "".join(
        f"{hashlib.sha256(body).hexdigest()}  {key.split('/')[1]}\n" for key, body in files.items()
    )
    api = Api(hub, "alice")
    job = api.wait(
        api.submit(command=["sh", "-c", sums], volumes=["datasets@s3/shared:/data"])["id"]
    )
    assert job["state"] == "DONE", job["message"]
    assert api.call("GET", f"/jobs/{job['id']}/logs").text == expected
    notes = [e["message"] for e in job["history"] if e["reason"] == "SYNC"]
    prefix = f"{hub.instance}-dataset-"
    (pulled,) = [n for n in notes if "into the node's dataset cache" in n]
    copy = pulled.rsplit("(", 1)[1].rstrip(")")
    assert copy.startswith(prefix), pulled
    made = docker_client.volumes.get(copy).attrs["CreatedAt"]

    bob = hub.create_user("bob")  # another user, with the same (read-only) grant
    volumes = ["datasets@s3/shared:/data", "datasets@s3/shared:/again"]
    nb = start(hub, "cached", {"volumes": volumes}, "bob", bob)
    mounts = docker_client.containers.get(nb["container"]).attrs["Mounts"]
    assert sorted((m["Destination"], m["Name"], m["RW"]) for m in mounts if m["Name"] == copy) == [
        ("/again", copy, False),
        ("/data", copy, False),
    ]
    assert sh(docker_client, nb["container"], sums) == (0, expected)  # every byte
    assert sh(docker_client, nb["container"], sums.replace("/data", "/again")) == (0, expected)
    assert sh(docker_client, nb["container"], "touch /data/x 2>&1")[0] != 0
    # one pull, the job's: the copy is the one it made (not removed and pulled again), and
    # the notebook has no volume of its own for the dataset
    assert docker_client.volumes.get(copy).attrs["CreatedAt"] == made
    own = [v.name for v in docker_client.volumes.list() if v.name.startswith(nb["container"])]
    assert not [v for v in own if v.startswith(nb["container"] + "-v-")], own
    hub.stop_server("bob", "cached")


@pytest.mark.parametrize(
    "spec, words",
    [
        ("datasets@nowhere:/data", "unknown object store"),
        ("Bad_Bucket@s3:/data", "invalid bucket name"),
        ("datasets@s3:data", "absolute"),
        ("datasets@s3:/etc/x", "reserved"),
        ("datasets@s3:/workspace", "workspace"),
        ("datasets@s3/a/../b:/data", ".."),
        ("datasets@s3:/data:rw", "mode 'rw' is not allowed"),
        ("secrets@s3:/data", "may not use bucket 'secrets'"),
        ("workspaces-test@s3/workspaces/bob:/bob", "another user's workspace"),
        ("workspaces-test@s3:/all", "other users' workspaces"),
        ("datasets@s3:/data:rwx", "mode"),
    ],
)
def test_bad_volume_specs_are_400(hub, spec, words):
    r = hub.spawn("alice", "badvol", {"volumes": [spec]}, token=hub.token)
    assert r.status_code == 400, (r.status_code, r.text)
    assert words in r.json()["message"], r.json()["message"]


def test_two_volumes_on_one_mount_are_400(hub):
    r = hub.spawn(
        "alice",
        "badvol",
        {"volumes": ["datasets@s3/a:/data", "datasets@s3/b:/data"]},
        token=hub.token,
    )
    assert r.status_code == 400 and "/data" in r.json()["message"], r.text


def test_store_down_push_sync_failed_then_retry(hub, s3, docker_client):
    nb = start(hub, "flaky", {})
    assert sh(docker_client, nb["container"], "echo precious > /workspace/keep.txt")[0] == 0
    s3.stop()
    try:
        hub.stop_server("alice", "flaky")
        nb = hub.wait_state("alice", "flaky", "SYNC_FAILED")
        last = nb["history"][-1]
        assert last["reason"] == "PUSH_FAILED"
        assert "push of workspace, home failed" in last["message"]
        # nothing local was thrown away
        vol = nb["container"] + "-workspace"
        out = docker_client.containers.run(
            "gpulab/python:3.11",
            ["cat", "/w/keep.txt"],
            volumes={vol: {"bind": "/w", "mode": "ro"}},
            remove=True,
        )
        assert out == b"precious\n"
        # a retry while the store is still down fails again, and says so
        r = requests.post(
            f"{hub.url}/services/gpulab/api/notebooks/alice/flaky/push",
            headers={"Authorization": f"token {hub.token}"},
            timeout=120,
        )
        assert r.status_code == 502 and r.json()["state"] == "SYNC_FAILED", r.text
        # a start while the store is down fails its pull and names the volume
        hub.spawn("alice", "flaky", {}, token=hub.token)
        with pytest.raises(SpawnFailed):
            hub.wait_ready("alice", "flaky", timeout=120)
        failed = hub.wait_state("alice", "flaky", "FAILED")["history"][-1]
        assert failed["reason"] == "PULL_FAILED" and "pull of volume workspace" in failed["message"]
    finally:
        s3.start()
    hub.wait_stopped("alice", "flaky")
    # FAILED at pull: the hub's clean-up pushed nothing; the data is still only local. Start
    # again now that the store is back, stop, and everything is pushed.
    start(hub, "flaky", {})
    hub.stop_server("alice", "flaky")
    assert hub.notebook("alice", "flaky").json()["state"] == "STOPPED"
    body = s3.client.get_object(Bucket="workspaces-test", Key="workspaces/alice/flaky/keep.txt")
    assert body["Body"].read() == b"precious\n"


def test_explicit_retry_after_sync_failed(hub, s3, docker_client):
    nb = start(hub, "retry", {})
    # a live push, asked by its owner while it runs, sends what settled (sync_settle 0.5 s)
    assert sh(docker_client, nb["container"], "echo early > /workspace/early.txt")[0] == 0
    time.sleep(0.6)
    push = f"{hub.url}/services/gpulab/api/notebooks/alice/retry/push"
    r = requests.post(push, headers={"Authorization": f"token {hub.token}"}, timeout=60)
    assert r.status_code == 202 and r.json()["state"] == "RUNNING", r.text
    live = wait_until(
        lambda: (hub.notebook("alice", "retry").json().get("live_push") or {}).get("at"),
        what="the live push's end",
    )
    done = hub.notebook("alice", "retry").json()
    assert done["live_push"]["ok"] and live, done["live_push"]
    assert "workspaces/alice/retry/early.txt" in keys(s3, "workspaces-test")
    assert done["history"][-1]["reason"] == "LIVE_PUSH" and done["state"] == "RUNNING"
    assert sh(docker_client, nb["container"], "echo later > /workspace/later.txt")[0] == 0
    s3.stop()
    try:
        hub.stop_server("alice", "retry")
        hub.wait_state("alice", "retry", "SYNC_FAILED")
    finally:
        s3.start()
    other = hub.create_user("mallory")
    r = requests.post(
        f"{hub.url}/services/gpulab/api/notebooks/alice/retry/push",
        headers={"Authorization": f"token {other}"},
        timeout=60,
    )
    assert r.status_code == 404  # someone else's notebook does not exist for mallory
    r = requests.post(
        f"{hub.url}/services/gpulab/api/notebooks/alice/retry/push",
        headers={"Authorization": f"token {hub.token}"},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    assert [e["state"] for e in r.json()["history"]][-3:] == ["SYNC_FAILED", "STOPPING", "STOPPED"]
    assert "workspaces/alice/retry/later.txt" in keys(s3, "workspaces-test")
    r = requests.post(
        f"{hub.url}/services/gpulab/api/notebooks/alice/retry/push",
        headers={"Authorization": f"token {hub.token}"},
        timeout=60,
    )
    assert r.status_code == 409 and "SYNC_FAILED" in r.json()["message"]


def test_progress_shows_sync_and_credentials_never_leak(hub, s3, docker_client):
    with contextlib.suppress(s3.client.exceptions.BucketAlreadyOwnedByYou):
        s3.client.create_bucket(Bucket="workspaces-test")
    s3.client.put_object(Bucket="workspaces-test", Key="workspaces/alice/prog/seed.txt", Body=b"x")
    spawner = threading.Thread(target=hub.spawn, args=("alice", "prog", {}, hub.token))
    spawner.start()
    events: list[dict] = []
    deadline = time.monotonic() + 60
    # the progress stream replays the spawn's events from its start while it is pending
    while not events and time.monotonic() < deadline:
        with requests.get(
            f"{hub.api}/users/alice/servers/prog/progress",
            headers={"Authorization": f"token {hub.token}"},
            stream=True,
            timeout=120,
        ) as r:
            for line in r.iter_lines():
                if line.startswith(b"data:"):
                    events.append(json.loads(line[5:]))
        if len(events) <= 1:  # not pending yet: only the hub's own event
            events.clear()
            time.sleep(0.05)
    spawner.join(120)
    hub.wait_ready("alice", "prog")
    messages = [e.get("message", "") for e in events]
    assert any(m.startswith("Pulling workspace from object store s3") for m in messages), messages
    assert any("Pulled workspace: 1 transferred" in m for m in messages), messages
    assert any("Reserving" in m or "No GPU requested" in m for m in messages), messages

    nb = hub.notebook("alice", "prog").json()
    env = docker_client.containers.get(nb["container"]).attrs["Config"]["Env"]
    text = json.dumps(env) + json.dumps(nb) + json.dumps(events) + hub.log_file.read_text()
    text += hub.request("GET", "/users/alice").text
    assert TEST_SECRET_KEY not in text
    assert TEST_ACCESS_KEY not in text
    hub.stop_server("alice", "prog")


def test_job_links_never_upload_the_helpers_secrets_or_touch_others(hub, s3):
    """Issue 11's link attack against an S3 store, through the real hub: a job's rw volume
    holds links to the sync helper's own environment (its store credentials), to /etc and to
    the sync's own files. Nothing they point at is uploaded; bob's object stays byte-identical;
    no object in the bucket carries the store's secret key."""
    from ..support.api import Api

    with contextlib.suppress(s3.client.exceptions.BucketAlreadyOwnedByYou):
        s3.client.create_bucket(Bucket="results")
    s3.client.put_object(Bucket="results", Key="bob/model.bin", Body=b"bob's weights")
    mallory = Api(hub, "mallory")
    links = [
        "ln -sfn /proc/self/environ /out/env.txt",
        "ln -sfn /proc/1/environ /out/pid1-env.txt",
        "ln -sfn /etc /out/etc",
        "ln -sfn /etc/passwd /out/passwd",
        "ln -sfn /proc/self/environ /out/.gpulab-sync-manifest.json.tmp-1",
        "ln -sfn /proc/self/environ /out/.gpulab-sync.lock",
    ]
    job = mallory.submit(
        command=["sh", "-c", " && ".join(links) + " && echo trained > /out/result.txt"],
        volumes=["results@s3/mallory/run1:/out:rw"],
    )
    done = mallory.wait(job["id"])
    logs = mallory.call("GET", f"/jobs/{job['id']}/logs").text
    assert done["state"] == "DONE", (done["reason"], done["message"], logs)
    assert keys(s3, "results", "mallory/") == {"mallory/run1/result.txt"}
    body = s3.client.get_object(Bucket="results", Key="bob/model.bin")["Body"].read()
    assert body == b"bob's weights"
    for key in keys(s3, "results"):
        data = s3.client.get_object(Bucket="results", Key=key)["Body"].read()
        assert TEST_SECRET_KEY.encode() not in data, key


def test_snapshot_take_restore_delete_from_the_command_line(hub, s3, docker_client, tmp_path):
    """Issue 31's snapshots on S3: a snapshot of a stopped notebook's workspace, the stored
    workspace changed afterwards, the snapshot restored into the STOPPED notebook (its local
    copy removed, so its start pulls the snapshot's files and only those), someone else's
    snapshots a 404, and a delete that removes the blobs with the manifest."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("GPULAB_", "JUPYTERHUB_"))},
        "GPULAB_CONFIG": str(tmp_path / "none.json"),
        "GPULAB_URL": hub.url,
        "GPULAB_TOKEN": hub.token,
    }

    def cli(*args, token=None):
        r = subprocess.run(
            [sys.executable, "-m", "gpulab.cli", "snapshot", *args],
            env={**env, "GPULAB_TOKEN": token or hub.token},
            capture_output=True,
            text=True,
            timeout=90,
        )
        return r.returncode, r.stdout + r.stderr

    nb = start(hub, "snap", {})
    script = (
        "echo one > /workspace/v.txt && chmod 750 /workspace/v.txt && mkdir /workspace/d "
        "&& echo same > /workspace/d/s.txt"
    )
    assert sh(docker_client, nb["container"], script)[0] == 0
    hub.stop_server("alice", "snap")
    stopped = hub.notebook("alice", "snap").json()
    assert stopped["state"] == "STOPPED", stopped["history"][-1]
    assert cli("create", "v1", "--notebook", "snap") == (0, "snapshot v1: 2 files, 9 (9 new)\n")
    # a later session (written straight to the store: quicker than a start and a stop)
    put = functools.partial(s3.client.put_object, Bucket="workspaces-test")
    put(Key="workspaces/alice/snap/v.txt", Body=b"two\n")
    put(Key="workspaces/alice/snap/later.txt", Body=b"later\n")

    code, out = cli("list")
    assert code == 0 and out.splitlines()[1].split()[0] == "v1", out
    assert "stored: 9 of 100.0G" in out
    mallory = hub.create_user("mallory")
    assert cli("restore", "v1", "--notebook", "snap", "--user", "alice", token=mallory)[1] == (
        "gpulab: error: no snapshot v1 for alice\n"
    )

    code, out = cli("restore", "v1", "--notebook", "snap")
    assert code == 0, out
    assert (code, out) == (0, "snapshot v1 restored into notebook snap: 1 files copied, "
                              "1 deleted, 1 unchanged\n")  # fmt: skip
    nb = start(hub, "snap", {})
    code, out = sh(
        docker_client,
        nb["container"],
        "cat /workspace/v.txt; stat -c %a /workspace/v.txt; ls /workspace",
    )
    assert code == 0 and out.split() == ["one", "750", "d", "v.txt"], out  # its mode too
    code, out = cli("restore", "v1", "--notebook", "snap")
    assert code == 1 and "snap is RUNNING" in out
    hub.stop_server("alice", "snap")

    assert cli("delete", "v1") == (0, "snapshot v1 deleted (9 freed)\n")
    assert not keys(s3, "workspaces-test", "snapshots/alice/")
