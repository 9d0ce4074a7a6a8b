"""The GPU inventory at start-up, on a real hub and service, through the real nvidia-ml-py: with
a stand-in libnvidia-ml.so.1 (tests/support/fake_nvml.c) on their library path, two devices are
found, logged by both at start-up, shown on the admin page and offered in the spawn form;
without it (this machine has no NVIDIA driver), none, with the warning that says why."""

from __future__ import annotations

import re

import pytest
import requests

from ..support.hub import login
from ..support.nvml import build_fake_nvml, nvml_env

pytestmark = [pytest.mark.docker, pytest.mark.hub]

#: (the hub's logger, the service's): each process reads and logs its own inventory
LOGGERS = (r"gpulab\.notebooks\.spawner \w+:\d+", r"gpulab\.service")


def started_lines(hub, level: str, text: str) -> list[str]:
    """The start-up lines of ``hub``'s log (the hub's and its service's) that say ``text``
    at ``level``, one per process."""
    log = hub.log_file.read_text(errors="replace")
    found = []
    for logger in LOGGERS:
        pattern = rf"^\[{level} [^\]]* {logger}\] GPUs of this host: {re.escape(text)}$"
        found += re.findall(pattern, log, re.MULTILINE)
    return found


def admin_page(hub) -> str:
    page = requests.get(
        f"{hub.url}/services/gpulab/admin",
        headers={"Authorization": f"token {hub.admin_token}"},  # custom:gpulab:admin
        timeout=30,
    )
    assert page.status_code == 200, page.text[:300]
    return page.text


def test_two_gpus_found_through_nvml(hub_with, tmp_path_factory):
    hub = hub_with("# GPUs: discovered through the stand-in NVML\n", start=False)
    hub.env.update(nvml_env(build_fake_nvml(tmp_path_factory.mktemp("nvml"))))
    # the hub hands its service LD_LIBRARY_PATH (jupyterhub_config.py); the stand-in's GPUs
    # are forwarded as any variable is
    hub.env["GPULAB_SERVICE_ENV"] = "FAKE_NVML_GPUS"
    hub.start()

    found = (
        "2 found with NVML (driver 550.54.15, CUDA 12.4): "
        "0 NVIDIA H100 80GB HBM3 81559M; 1 NVIDIA A100-SXM4-40GB 40960M"
    )
    assert len(started_lines(hub, "I", found)) == 2, hub.tail()

    page = admin_page(hub)
    assert "Found with NVML: driver 550.54.15, CUDA 12.4." in page
    for device, model in (("0", "NVIDIA H100 80GB HBM3"), ("1", "NVIDIA A100-SXM4-40GB")):
        row = re.search(rf'<tr class="free" data-device="{device}">(.*?)</tr>', page, re.S)
        assert row and model in row.group(1), page

    s = login(hub, "nina")
    form = s.get(f"{hub.url}/hub/spawn/nina", timeout=30)
    assert form.status_code == 200 and "2 of 2 free now" in form.text, form.text[-2000:]


def test_no_driver_no_gpu_and_a_warning(hub_with):
    hub = hub_with()  # this machine has no NVIDIA driver: nothing on the hub's library path
    why = "no NVIDIA driver found (libnvidia-ml.so.1 not loadable)"
    assert len(started_lines(hub, "W", f"no GPU: {why}")) == 2, hub.tail()

    page = admin_page(hub)
    assert why in page and "This host has no GPU configured or discovered." in page

    s = login(hub, "olaf")
    form = s.get(f"{hub.url}/hub/spawn/olaf", timeout=30)
    assert form.status_code == 200 and "0 of 0 free now" in form.text, form.text[-2000:]
