"""GPU activity on a real hub and service, through the real nvidia-ml-py: the service finds two
GPUs through the stand-in libnvidia-ml.so.1 (tests/support/fake_nvml.c) on its library path,
whose utilization and memory use this test sets in a file the library reads at every call. A
job holding a GPU that writes nothing and uses no CPU (``sleep``) is not restarted as hung
while its GPU reads busy, and is once it reads idle for the hang period; /metrics shows the
device's and the job's utilization and memory use meanwhile, the admin page the device's, and
the job's page and its API answer (``gpu_usage``) the job's. Both tests share one hub."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from ..conftest import wait_until
from ..support.api import Api
from ..support.nvml import build_fake_nvml, nvml_env, set_usage

pytestmark = [pytest.mark.docker, pytest.mark.hub]

#: GPUs from the stand-in NVML (discovery: no gpu_devices); this engine is runc: env mode
CONFIG = """
c.GpulabSettings.gpu_mode = "env"
c.GpulabSettings.supervisor_interval = 0.2
"""
PERIOD = 10  # the shortest hang period a job may ask for
MIB = 1024**2


def metrics(hub) -> dict[tuple[str, tuple], float]:
    r = requests.get(
        f"{hub.url}/services/gpulab/metrics",
        headers={"Authorization": f"token {hub.admin_token}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text[:300]
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


#: seconds: the notebook's GPUs' unused time (gpu_unused_timeout), with a look every second
#: (at least twice idle_check_interval, which the service checks at start-up); a policy for
#: notebooks only, so the job's test shares the hub
UNUSED = 4
POLICY = f"""
c.GpulabSettings.gpu_unused_timeout = {UNUSED}
c.GpulabSettings.idle_check_interval = 1
"""


@pytest.fixture(scope="module")
def usage(tmp_path_factory) -> Path:
    """The file the stand-in NVML reads its utilization and memory use from (set_usage)."""
    path = tmp_path_factory.mktemp("usage") / "usage"
    set_usage(path, {})
    return path


@pytest.fixture(scope="module")
def hub(hub_with, usage, tmp_path_factory):
    """One hub for the module, its service seeing two GPUs through the stand-in."""
    hub = hub_with(CONFIG + POLICY, start=False)
    hub.env.update(
        nvml_env(build_fake_nvml(tmp_path_factory.mktemp("nvml")), FAKE_NVML_USAGE=str(usage))
    )
    hub.env["GPULAB_SERVICE_ENV"] = "FAKE_NVML_GPUS,FAKE_NVML_USAGE"
    hub.start()
    return hub


def test_a_busy_gpu_keeps_a_silent_job_from_being_restarted_as_hung(hub, usage):
    set_usage(usage, {"0": (93, 20000), "1": (93, 20000)})  # busy, whichever the job gets
    carl = Api(hub, "carl")

    job = carl.submit(
        command=["sleep", "600"],  # no output, no CPU
        resources={"gpus": 1, "cpus": 0.5, "memory": "512M"},
        hang_restart={"enabled": True, "period": PERIOD},
    )
    running = carl.wait(job["id"], {"RUNNING"}, timeout=120)
    assert running["state"] == "RUNNING", running
    assert len(running["devices"]) == 1, running
    device = running["devices"][0]
    time.sleep(1.5 * PERIOD)  # a period and a half of a busy GPU (a hang is seen after one)
    now = carl.job(job["id"])
    assert now["state"] == "RUNNING" and now["hang_restarts"] == 0, now["history"][-3:]
    assert not [e for e in now["history"] if e["kind"] == "fault-recovery"]

    got = metrics(hub)
    util = {k[1]: v for k, v in got.items() if k[0] == "gpulab_gpu_utilization_percent"}
    assert util == {(("device", "0"),): 93.0, (("device", "1"),): 93.0}, got
    assert got[("gpulab_gpu_memory_used_bytes", (("device", "0"),))] == 20000 * MIB
    mine = [
        (dict(k[1]), v) for k, v in got.items() if k[0] == "gpulab_workload_gpu_utilization_percent"
    ]
    assert len(mine) == 1, mine
    labels, value = mine[0]
    assert value == 93.0 and labels["kind"] == "job" and labels["user"] == "carl"
    assert labels["workload"] == f"{hub.instance}/job/{job['id']}"
    assert labels["device"] == device

    page = requests.get(
        f"{hub.url}/services/gpulab/admin",
        headers={"Authorization": f"token {hub.admin_token}"},  # custom:gpulab:admin
        timeout=30,
    )
    assert page.status_code == 200, page.text[:300]
    row = re.search(rf'<tr class="busy" data-device="{device}">(.*?)</tr>', page.text, re.S)
    assert row, page.text
    assert "now: 93 % busy, 19.5 GiB of " in row.group(1), row.group(1)

    # the job's own page and its API answer: its device's figures now, from the same reader
    mine = requests.get(
        f"{hub.url}/services/gpulab/jobs/{job['id']}",
        headers={"Authorization": f"token {carl.token}"},
        timeout=30,
    )
    assert mine.status_code == 200, mine.text[:300]
    shown = re.search(r'<dd id="job-gpu-usage">(.*?)</dd>', mine.text, re.S)
    assert shown, mine.text
    assert f"{device} now: 93 % busy, 19.5 GiB of " in shown.group(1), shown.group(1)
    usage_now = carl.job(job["id"])["gpu_usage"]
    assert len(usage_now) == 1, usage_now
    assert usage_now[0]["device"] == device and usage_now[0]["rank"] == 0
    assert usage_now[0]["utilization"] == 93 and usage_now[0]["memory_used"] == 20000 * MIB
    total = usage_now[0]["memory_total"]
    assert total > 20000 * MIB and f"19.5 GiB of {total / 1024**3:.1f} GiB used" in shown.group(1)
    listed = carl.call("GET", "/jobs").json()["jobs"]
    assert listed and all("gpu_usage" not in j for j in listed)  # not in lists

    set_usage(usage, {})  # every GPU idle now: output, CPU and GPU all quiet
    deadline = time.monotonic() + 3 * PERIOD
    while time.monotonic() < deadline:
        now = carl.job(job["id"])
        if now["hang_restarts"]:
            break
        time.sleep(0.5)
    notes = [e["message"] for e in now["history"] if e["kind"] == "fault-recovery"]
    assert notes[:1] == [
        f"no output, no CPU progress and no GPU activity for {PERIOD} s: "
        "command restarted in place (1 of 3)"
    ], now["history"][-3:]
    r = carl.call("POST", f"/jobs/{job['id']}/interrupt")
    assert r.status_code == 202, r.text
    assert carl.wait(job["id"])["state"] == "INTERRUPTED"


def test_a_notebook_whose_gpus_go_unused_is_stopped_and_one_in_use_is_not(hub, usage):
    set_usage(usage, {"0": (40, 1000), "1": (40, 1000)})  # in use, whichever it gets
    token = hub.create_user("dana")
    r = hub.spawn("dana", "nb", {"cpus": 0.5, "memory": "512M", "gpus": 1}, token=token)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("dana", "nb")
    nb = hub.notebook("dana", "nb").json()
    assert nb["options"]["gpu_unused_timeout"] == UNUSED, nb["options"]

    time.sleep(3 * UNUSED)  # three of its unused times, its GPU in use all along
    assert hub.notebook("dana", "nb").json()["state"] == "RUNNING"

    set_usage(usage, {})  # every GPU unused from now on
    unused_from = time.monotonic()
    deadline = unused_from + UNUSED + 60
    while time.monotonic() < deadline:
        nb = hub.notebook("dana", "nb").json()
        if nb["state"] == "STOPPED":
            break
        time.sleep(0.5)
    assert nb["state"] == "STOPPED", nb["history"][-3:]
    assert time.monotonic() - unused_from >= UNUSED - 1  # not before its time
    stopping = [e for e in nb["history"] if e["state"] == "STOPPING"][-1]
    assert stopping["reason"] == "IDLE", stopping
    assert stopping["message"].startswith("its GPUs unused for "), stopping
    assert f"(its GPUs' unused time: {UNUSED}s)" in stopping["message"], stopping
    # the record says STOPPED a moment before the spawner's stop returns to the hub, which
    # then forgets the server (about 0.2 s here): wait for that, no longer
    wait_until(lambda: hub.server_model("dana", "nb") is None, 10, 0.1, "the hub forgot nb")
