"""The spawn form (log-in, form, submit), a hub killed and restarted, PyTorch, max run time."""

from __future__ import annotations

import re
import time

import pytest
import requests

from ..support.hub import login

pytestmark = [pytest.mark.docker, pytest.mark.hub]


def test_form_spawn_and_form_errors(hub_with):
    hub = hub_with(
        'c.GpulabSettings.gpu_devices = [{"id": "0"}]\nc.GpulabSettings.gpu_mode = "env"',
        fresh=True,
    )
    s = login(hub, "erin")
    page = s.get(f"{hub.url}/hub/spawn/erin/viaform", timeout=30)
    assert page.status_code == 200
    html = page.text
    for needle in ('name="framework"', 'value="pytorch"', 'name="flavor"', "1 of 1 free now"):
        assert needle in html, needle

    # an invalid custom request comes back on the form page with the reason
    bad = s.post(
        f"{hub.url}/hub/spawn/erin/viaform",
        data={
            "framework": "python",
            "version": "3.11",
            "editor": "jupyterlab",
            "flavor": "custom",
            "cpus": "1",
            "memory": "-2G",
            "gpus": "0",
            "_xsrf": s.cookies["_xsrf"],
        },
        timeout=60,
    )
    assert bad.status_code == 400, bad.status_code
    assert "memory must be" in bad.text

    ok = s.post(
        f"{hub.url}/hub/spawn/erin/viaform",
        data={
            "framework": "python",
            "version": "3.11",
            "editor": "jupyterlab",
            "flavor": "cpu-small",
            "cpus": "",
            "memory": "",
            "gpus": "0",
            "_xsrf": s.cookies["_xsrf"],
        },
        timeout=60,
    )
    assert ok.status_code == 200, ok.status_code
    hub.wait_ready("erin", "viaform")
    nb = hub.notebook("erin", "viaform").json()
    assert nb["options"]["flavor"] == "cpu-small" and nb["state"] == "RUNNING"
    # the browser session reaches JupyterLab through the proxy
    lab = s.get(f"{hub.url}/user/erin/viaform/lab", timeout=60)
    assert lab.status_code == 200 and "JupyterLab" in lab.text

    # progress events name each step
    events = s.get(f"{hub.url}/hub/api/users/erin/servers/viaform/progress", timeout=30)
    assert events.status_code == 200


def test_hub_killed_and_restarted(hub_with, docker_client):
    extra = (
        'c.GpulabSettings.gpu_devices = [{"id": "0"}, {"id": "1"}]\n'
        'c.GpulabSettings.gpu_mode = "env"\n'
        "c.GpulabSettings.gpu_reconcile_grace = 0\n"
        # fred's four notebooks fit his limits and GPU quota: the ledger is what refuses one
        'c.GpulabSettings.max_resources = {"cpus": 8, "memory": "16G", "gpus": 4}\n'
        'c.GpulabSettings.job_quota = {"gpus": 4, "jobs": 4}\n'
        "c.GpulabSettings.notebook_gpu_wait = 0\n"  # no GPU free fails a spawn at once
    )
    hub = hub_with(extra, fresh=True)
    token = hub.create_user("fred")
    one_gpu = {"cpus": 0.5, "memory": "512M", "gpus": 1}
    for server, options in (("keep", one_gpu), ("gone", one_gpu), ("later", {})):
        hub.spawn("fred", server, options, token=token)
    for server in ("keep", "gone", "later"):
        hub.wait_ready("fred", server)
    hub.stop_server("fred", "later")
    keep = hub.notebook("fred", "keep").json()["container"]
    gone = hub.notebook("fred", "gone").json()["container"]

    hub.kill()  # SIGKILL to the hub, its proxy and its service
    assert docker_client.containers.get(keep).status == "running"
    docker_client.containers.get(gone).remove(force=True)  # vanishes while the hub is down
    hub.start()

    # the running notebook is still running and reachable with the same token
    r = requests.get(
        f"{hub.url}/user/fred/keep/api/status",
        headers={"Authorization": f"token {token}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert hub.server_model("fred", "keep")["ready"]
    assert hub.notebook("fred", "keep").json()["state"] == "RUNNING"
    # the vanished notebook's GPU was released; the running one still holds its own
    hub.spawn("fred", "other", one_gpu, token=token)
    hub.wait_ready("fred", "other")
    other = hub.notebook("fred", "other").json()["container"]
    devices = {docker_client.containers.get(c).labels["org.gpulab.gpus"] for c in (keep, other)}
    assert devices == {"0", "1"}
    hub.spawn("fred", "third", one_gpu, token=token)
    refused = hub.wait_state("fred", "third", "FAILED")["history"][-1]
    assert refused["reason"] == "NO_GPU_AVAILABLE" and "2 of 2 in use" in refused["message"]
    # the stopped one starts again, and the running one stops normally
    hub.spawn("fred", "later", {}, token=token)
    hub.wait_ready("fred", "later")
    hub.stop_server("fred", "keep")
    states = [e["state"] for e in hub.notebook("fred", "keep").json()["history"]]
    assert states == ["STARTING", "RUNNING", "STOPPING", "STOPPED"]


def test_pytorch_notebook_imports_torch(hub_with, pytorch_image, docker_client):
    hub = hub_with()
    token = hub.create_user("gina")
    hub.spawn("gina", "torch", {"framework": "pytorch"}, token=token)
    hub.wait_ready("gina", "torch", timeout=180)
    nb = hub.notebook("gina", "torch").json()
    assert nb["options"]["image"] == pytorch_image
    # run code inside the running notebook's container, as its (non-root) user
    out = docker_client.containers.get(nb["container"]).exec_run(
        [
            "python",
            "-c",
            "import os, torch; print(torch.__version__, os.getuid(), torch.ones(2).sum().item())",
        ]
    )
    assert out.exit_code == 0, out.output
    version, uid, total = out.output.decode().split()
    assert version.startswith("2.13.0") and uid == "1000" and float(total) == 2.0


def test_max_run_time_stops_and_auto_restarts(hub_with):
    hub = hub_with(
        "c.GpulabSettings.max_run_time = 4\nc.GpulabSettings.watchdog_interval = 1\n", fresh=True
    )
    token = hub.create_user("hank")
    hub.spawn("hank", "once", {}, token=token)
    hub.spawn("hank", "again", {"auto_restart": True}, token=token)
    # no wait for "ready": a spawn under load can take longer than the 4 s run time, and the
    # watchdog may stop it before it is polled; its history shows that it ran

    nb = hub.wait_state("hank", "once", "STOPPED", timeout=60)
    assert [e["state"] for e in nb["history"]][:2] == ["STARTING", "RUNNING"], nb["history"]
    stopping = [e for e in nb["history"] if e["state"] == "STOPPING"][-1]
    assert stopping["reason"] == "MAX_RUN_TIME", stopping

    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        states = [e["state"] for e in hub.notebook("hank", "again").json()["history"]]
        if states[:6] == ["STARTING", "RUNNING", "STOPPING", "STOPPED", "STARTING", "RUNNING"]:
            break
        time.sleep(0.5)
    else:
        raise AssertionError(states)
    assert hub.notebook("hank", "again").json()["options"]["auto_restart"] is True
    assert re.search("restarting", hub.notebook("hank", "again").json()["history"][2]["message"])
