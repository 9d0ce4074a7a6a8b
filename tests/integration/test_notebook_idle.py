"""Idle GPUs go back, and the images make no network calls of their own: a real hub, its proxy,
the gpulab service, jupyterhub-idle-culler beside it, and notebooks on the Docker engine.

GPU notebooks get fake GPUs (gpu mode 'env'), an idle time of 12 s and activity reports every
2 s, so that an idle one is stopped within a quarter of a minute. A running cell's notebook
reports activity at most 5 s (the image's look at busy kernels) + 2 s (its report) old, well
inside its idle time.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import threading
import time
from datetime import UTC, datetime

import pytest
import requests

from gpulab.db import Database
from gpulab.gpus.inventory import load_inventory
from gpulab.gpus.ledger import GpuLedger
from gpulab.names import notebook_workload_id

from ..conftest import wait_until
from ..support.kernels import start_code

pytestmark = [pytest.mark.docker, pytest.mark.hub]

IDLE = 12  # seconds: the GPU flavor's idle time
REPORT = 2  # seconds between a notebook's activity reports (IDLE must be at least twice it)
#: jupyterhub-idle-culler's, on every server: well past IDLE plus gpulab's check, so that the
#: GPU notebooks are stopped by gpulab (reason IDLE) before the culler would (reason STOP)
CULLER_TIMEOUT = 30

CONFIG = f"""
import sys
c.GpulabSettings.gpu_devices = [{{"id": "0"}}, {{"id": "1"}}, {{"id": "2"}}]
c.GpulabSettings.gpu_mode = "env"
c.GpulabSettings.max_resources = {{"cpus": 2, "memory": "4G", "gpus": 3}}
c.GpulabSettings.job_quota = {{"gpus": 3, "jobs": 4}}
c.GpulabSettings.activity_report_interval = {REPORT}
c.GpulabSettings.idle_check_interval = 2
c.GpulabSettings.flavors = [
    {{"id": "cpu", "cpus": 0.5, "memory": "512M"}},
    {{"id": "gpu", "cpus": 0.5, "memory": "512M", "gpus": 1, "idle_timeout": {IDLE}}},
]
c.GpulabSettings.default_flavor = "cpu"
"""

CULLER = f"""
c.JupyterHub.services.append({{
    "name": "idle-culler",
    "command": [sys.executable, "-m", "jupyterhub_idle_culler",
                "--timeout={CULLER_TIMEOUT}", "--cull-every=5"],
}})
c.JupyterHub.load_roles.append({{
    "name": "idle-culler",
    "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
    "services": ["idle-culler"],
}})
"""


@pytest.fixture(scope="module")
def hub(hub_with):
    return hub_with(CONFIG + CULLER)


def ledger(hub) -> GpuLedger:
    db = Database(f"sqlite:///{hub.workdir / 'data' / 'gpulab.sqlite'}")
    return GpuLedger(
        db, hub.instance, load_inventory([{"id": "0"}, {"id": "1"}, {"id": "2"}], False)
    )


def held_by(hub, user: str, server: str) -> list[str]:
    workload = notebook_workload_id(hub.instance, user, server)
    return [a["device"] for a in ledger(hub).allocations() if a["workload"] == workload]


def history(hub, user, server) -> list[dict]:
    r = hub.notebook(user, server)
    assert r.status_code == 200, r.text
    return r.json()["history"]


def stopped_for(hub, user, server, timeout: float) -> list[dict]:
    """The history once the notebook is STOPPED after a stop it did not ask for."""

    def done():
        h = history(hub, user, server)
        return h if h[-1]["state"] == "STOPPED" else None

    return wait_until(done, timeout, what=f"{user}/{server} STOPPED")


def spawn_ready(hub, user, server, options, token):
    r = hub.spawn(user, server, options, token=token)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready(user, server)


def start_long_cell(hub, user: str, server: str, token: str, seconds: int) -> str:
    # a cell that prints nothing: only its kernel's busy state says it runs
    return start_code(hub, user, server, token, f"import time; time.sleep({seconds})")


def test_idle_gpu_notebook_is_stopped_and_its_gpu_freed_a_running_cell_is_not(hub, docker_client):
    token = hub.create_user("alice")
    bob = hub.create_user("bob")
    # both at once (the hub answers a spawn once it is ready, unless it takes long): the idle
    # one's clock starts at its start, and what follows (writing a file, poking it, the
    # other's cell) must happen well inside its idle time, however long a spawn takes
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        spawns = [
            pool.submit(
                spawn_ready, hub, "alice", server, {"framework": "python", "flavor": "gpu"}, token
            )
            for server in ("idle", "busy")
        ]
        for spawned in spawns:
            spawned.result()
    idle_nb = hub.notebook("alice", "idle").json()
    assert idle_nb["options"]["idle_timeout"] == IDLE
    assert len(held_by(hub, "alice", "idle")) == 1
    assert len(held_by(hub, "alice", "busy")) == 1
    container = docker_client.containers.get(idle_nb["container"])
    env = dict(e.split("=", 1) for e in container.attrs["Config"]["Env"])
    assert env["JUPYTERHUB_ACTIVITY_INTERVAL"] == str(REPORT)
    # something to push (docker exec is no activity the hub hears of)
    container.exec_run(["sh", "-c", "echo written-before-idle > /workspace/kept.txt"])

    # meanwhile another user, and anyone unauthenticated, sends requests to alice's idle
    # notebook through the proxy: they must not make it look active
    codes: list[int] = []
    stop_poking = threading.Event()

    def poke():
        while not stop_poking.is_set():
            for headers in ({"Authorization": f"token {bob}"}, {}):
                try:
                    r = requests.post(
                        f"{hub.url}/user/alice/idle/api/contents",
                        headers=headers,
                        data=b"x" * 4096,
                        allow_redirects=False,
                        timeout=10,
                    )
                    codes.append(r.status_code)
                    r = requests.get(f"{hub.url}/user/alice/idle/api", timeout=10)
                    codes.append(r.status_code)
                except requests.RequestException:
                    pass
            stop_poking.wait(1)

    poker = threading.Thread(target=poke, daemon=True)
    poker.start()
    # the cell outlasts the check below (at 2 * IDLE + 6 s) by 6 s; any longer is only
    # waited for at the end
    cell_seconds = 2 * IDLE + 12
    try:
        started = time.monotonic()
        start_long_cell(hub, "alice", "busy", token, cell_seconds)
        events = stopped_for(hub, "alice", "idle", timeout=IDLE + 60)
    finally:
        stop_poking.set()
        poker.join(15)
    # some were answered 2xx (the server's unauthenticated /api): the proxy counts those as its
    # route's activity, which is why the hub does not poll it (jupyterhub_config.py)
    assert any(200 <= c < 300 for c in codes), sorted(set(codes))

    # the idle notebook: stopped like a user stop, reason IDLE, GPU back, workspace pushed
    assert [e["state"] for e in events][-2:] == ["STOPPING", "STOPPED"]
    stopping = events[-2]
    assert stopping["reason"] == "IDLE", events
    assert "no activity for" in stopping["message"]
    assert f"its idle time: {IDLE}s" in stopping["message"], stopping
    assert held_by(hub, "alice", "idle") == []
    assert not docker_client.containers.list(all=True, filters={"name": idle_nb["container"]})
    stored = hub.workdir / "data/objects/gpulab-workspaces/workspaces/alice/idle/kept.txt"
    assert stored.read_text() == "written-before-idle\n"
    assert hub.server_model("alice", "idle") is None
    # the API's list shows the reason too
    r = requests.get(
        f"{hub.url}/services/gpulab/api/notebooks",
        headers={"Authorization": f"token {token}"},
        timeout=30,
    )
    listed = {nb["server"]: nb for nb in r.json()["notebooks"]} if r.ok else {}
    assert any(e["reason"] == "IDLE" for e in listed["idle"]["history"]), r.text

    # the notebook running a long, silent cell is not stopped: well past its idle time it runs
    # on, its GPU held, and the hub has heard of its activity lately
    wait_until(lambda: time.monotonic() - started > 2 * IDLE + 6, 120, 0.5, "time passing")
    assert history(hub, "alice", "busy")[-1]["state"] == "RUNNING"
    assert len(held_by(hub, "alice", "busy")) == 1
    model = hub.server_model("alice", "busy")
    seen = datetime.fromisoformat(model["last_activity"].replace("Z", "+00:00"))
    assert (datetime.now(UTC) - seen).total_seconds() < IDLE, model

    # once the cell has ended it is idle like any other, and stopped in its turn
    events = stopped_for(hub, "alice", "busy", timeout=cell_seconds + IDLE + 60)
    assert events[-2]["reason"] == "IDLE"
    assert time.monotonic() - started > cell_seconds + IDLE - 5
    assert held_by(hub, "alice", "busy") == []


def test_idle_culler_works_beside_it_and_cpu_notebooks_have_no_idle_stop(hub):
    """jupyterhub-idle-culler (an admin's service) stops a CPU notebook, which gpulab's own
    idle stop leaves alone, through the same stop path: recorded, pushed, STOPPED."""
    token = hub.create_user("carol")
    spawn_ready(hub, "carol", "cpu", {"framework": "python", "flavor": "cpu"}, token)
    nb = hub.notebook("carol", "cpu").json()
    assert nb["options"]["idle_timeout"] == 0
    started = time.monotonic()
    events = stopped_for(hub, "carol", "cpu", timeout=CULLER_TIMEOUT + 60)
    assert time.monotonic() - started > CULLER_TIMEOUT - 10  # the culler's time, not ours
    assert [e["state"] for e in events][-2:] == ["STOPPING", "STOPPED"]
    assert events[-2]["reason"] == "STOP", events  # a plain stop through the hub API
    assert "culling" in hub.tail(400).lower() or "idle-culler" in hub.tail(400)


@pytest.mark.parametrize("framework", ["python", "pytorch"])
def test_the_image_makes_no_network_calls_of_its_own(hub, docker_client, pytorch_image, framework):
    """The effective settings of a running notebook, read through the hub as its user."""
    token = hub.create_user("dave")
    spawn_ready(hub, "dave", framework, {"framework": framework, "flavor": "cpu"}, token)
    base = f"{hub.url}/user/dave/{framework}"
    auth = {"Authorization": f"token {token}"}

    # the lab front end: news and update checks off (overrides.json in the image)
    r = requests.get(
        f"{base}/lab/api/settings/@jupyterlab/apputils-extension:notification",
        headers=auth,
        timeout=30,
    )
    assert r.status_code == 200, r.text
    props = r.json()["schema"]["properties"]
    assert props["fetchNews"]["default"] == "false"
    assert props["checkForUpdates"]["default"] is False

    # the lab server: no news feed, no update check, no PyPI extension manager
    r = requests.get(f"{base}/lab", headers=auth, timeout=30)
    assert r.status_code == 200, r.text
    page = re.search(
        r'<script id="jupyter-config-data" type="application/json">(.*?)</script>', r.text, re.S
    )
    assert page, r.text[:500]
    config = json.loads(page.group(1))
    assert config["news"] == {"disabled": True}
    assert config["extensionManager"]["name"] == "read-only"
    assert config["extensionManager"]["can_install"] is False
    r = requests.get(f"{base}/lab/api/news", headers=auth, timeout=30)
    assert r.status_code == 200 and r.json()["news"] == [], r.text
    r = requests.get(f"{base}/lab/api/update", headers=auth, timeout=30)
    assert r.status_code == 200 and r.json()["notification"] is None, r.text

    # pip never asks PyPI for its newest version; the activity extension is loaded
    nb = hub.notebook("dave", framework).json()
    c = docker_client.containers.get(nb["container"])
    out = c.exec_run(["printenv", "PIP_DISABLE_PIP_VERSION_CHECK"]).output.decode()
    assert out.strip() == "1", out
    logs = c.logs().decode(errors="replace")
    assert "gpulab: busy kernels count as activity" in logs, logs[-3000:]

    # VS Code (started by the first visit to /vscode/): no telemetry, update check,
    # experiments, recommendations or AI features, in its flags and its machine settings
    r = requests.get(f"{base}/vscode/", headers=auth, timeout=90)
    assert r.status_code == 200 and "workbench" in r.text, (r.status_code, r.text[:300])
    cmdlines = c.exec_run(
        ["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"], user="1000"
    ).output.decode()
    assert "--disable-telemetry" in cmdlines and "--disable-update-check" in cmdlines, cmdlines
    assert "--bind-addr 127.0.0.1:" in cmdlines and "--auth none" in cmdlines, cmdlines
    res = c.exec_run(
        ["cat", "/home/jovyan/.local/share/code-server/Machine/settings.json"], user="1000"
    )
    settings = json.loads(res.output)
    assert settings["telemetry.telemetryLevel"] == "off" and settings["update.mode"] == "none"
    assert settings["extensions.autoCheckUpdates"] is False
    assert settings["chat.disableAIFeatures"] is True
    # workspace trust off (docs/notebooks.md: what that means for shared volumes)
    assert "--disable-workspace-trust" in cmdlines
    hub.stop_server("dave", framework)


def test_the_idle_stop_survives_a_hub_restart(hub_with, docker_client):
    """Judged by the activity the hub recorded, not by a timer: a notebook idle before the hub
    and its service are killed is stopped on its time after the restart, not an idle time after
    the restart."""
    hub = hub_with(CONFIG + "\nc.GpulabSettings.supervisor_lease_ttl = 3\n", fresh=True)
    token = hub.create_user("erin")
    spawn_ready(hub, "erin", "gpu", {"framework": "python", "flavor": "gpu"}, token)
    ready_at = datetime.now(UTC)
    time.sleep(5)
    hub.kill()  # SIGKILL to the hub, its proxy and its service
    hub.start()
    restarted_at = datetime.now(UTC)
    events = stopped_for(hub, "erin", "gpu", timeout=IDLE + 60)
    stopping = events[-2]
    assert stopping["reason"] == "IDLE", events
    at = datetime.fromisoformat(stopping["at"].replace("Z", "+00:00"))
    assert (at - ready_at).total_seconds() >= IDLE - 1  # not before its time
    # an in-memory timer started by the new service would stop it IDLE seconds after this
    assert (at - restarted_at).total_seconds() < IDLE - 2, (ready_at, restarted_at, at)
    assert held_by(hub, "erin", "gpu") == []


def test_the_form_says_when_a_flavor_stops(hub):
    from ..support.hub import login

    s = login(hub, "frank")
    page = s.get(f"{hub.url}/hub/spawn/frank/f", timeout=30)
    assert page.status_code == 200, page.text[-500:]
    options = dict(re.findall(r'<option value="(cpu|gpu)"[^>]*>([^<]*)</option>', page.text))
    assert options["gpu"].endswith(f"· stops after {IDLE}s idle"), options
    assert "stops after" not in options["cpu"], options
    # custom resources with GPUs get gpu_idle_timeout (1 h by default)
    assert "custom resources with GPUs stop after 1h idle" in page.text


def test_a_bad_idle_setting_stops_the_service_at_start_up(tmp_path):
    """The real service process, started as the hub starts it: a clear message, exit 2."""
    import subprocess
    import sys

    config = tmp_path / "bad_config.py"
    config.write_text(
        "c.GpulabSettings.activity_report_interval = 60\n"
        'c.GpulabSettings.flavors = [{"id": "gpu-1", "cpus": 1, "memory": "1G", "gpus": 1,'
        ' "idle_timeout": 30}]\n'
    )
    proc = subprocess.run(
        [sys.executable, "-m", "gpulab.service", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    assert (
        "invalid configuration: flavor 'gpu-1': idle_timeout = 30 s is shorter than twice "
        "activity_report_interval (60 s)" in proc.stderr
    ), proc.stderr
