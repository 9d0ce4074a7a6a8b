"""A GPU workload whose image needs a newer CUDA than the host's NVIDIA driver supports is
refused before anything starts, with the image, both versions and what to do: a job with a 400,
a notebook's spawn with the hub's 400. The driver is the stand-in NVML (tests/support/nvml.py)
saying CUDA 11.8; the image is gpulab/python:3.11 labelled as a CUDA 12.8 build (labels only,
no CUDA in it). The same image without GPUs is accepted, and the pages show each image's build."""

from __future__ import annotations

import re

import pytest
import requests

from gpulab.cuda import CUDA_LABEL, FLAVOUR_LABEL

from ..support.hub import login
from ..support.images import build_from, labelled
from ..support.nvml import build_fake_nvml, nvml_env

pytestmark = [pytest.mark.docker, pytest.mark.hub]

IMAGE = "gpulab-test/cuda-new:1"
CONFIG = f"""
from gpulab.settings import DEFAULT_FRAMEWORKS
c.GpulabSettings.frameworks = [
    *DEFAULT_FRAMEWORKS,
    {{"id": "cudanew", "title": "CUDA new", "versions": [{{"id": "1", "image": "{IMAGE}"}}],
     "editors": ["jupyterlab"]}},
]
c.GpulabSettings.supervisor_interval = 0.2
"""
REFUSED = (
    f"image {IMAGE} needs CUDA 12.8, newer than CUDA 11.8, the newest the NVIDIA driver of "
    "this host supports: upgrade the driver to one for CUDA 12.8 or later, or choose an image "
    "built for CUDA 11.8 (or no GPU)"
)
SMALL = {"cpus": 0.5, "memory": "512M"}


@pytest.fixture(scope="module")
def cuda_new_image(docker_client, images):
    labels = {FLAVOUR_LABEL: "cuda", CUDA_LABEL: "12.8"}
    yield build_from(docker_client, labelled("gpulab/python:3.11", labels), IMAGE)
    docker_client.images.remove(IMAGE, force=True)


@pytest.fixture(scope="module")
def hub(hub_with, tmp_path_factory, cuda_new_image):
    hub = hub_with(CONFIG, start=False)
    library = build_fake_nvml(tmp_path_factory.mktemp("nvml"))
    hub.env.update(nvml_env(library, FAKE_NVML_CUDA="11080"))  # the driver: CUDA 11.8
    hub.env["GPULAB_SERVICE_ENV"] = "FAKE_NVML_GPUS,FAKE_NVML_CUDA"
    hub.start()
    return hub


def test_a_gpu_job_on_it_is_a_400_and_a_cpu_job_is_queued(hub):
    token = hub.create_user("cora")
    jobs = f"{hub.url}/services/gpulab/api/jobs"
    auth = {"Authorization": f"token {token}"}
    body = {"command": "true", "framework": "cudanew"}
    r = requests.post(
        jobs, headers=auth, json={**body, "resources": {**SMALL, "gpus": 1}}, timeout=30
    )
    assert r.status_code == 400, r.text
    assert r.json()["message"] == REFUSED and r.json()["field"] == "framework", r.text
    assert requests.get(jobs, headers=auth, timeout=30).json()["jobs"] == []

    r = requests.post(
        jobs, headers=auth, json={**body, "resources": {**SMALL, "gpus": 0}}, timeout=30
    )
    assert r.status_code == 201, r.text


def test_a_gpu_notebook_on_it_is_refused_at_spawn_with_the_message(hub):
    token = hub.create_user("dora")
    r = hub.spawn("dora", "nb", {"framework": "cudanew", "gpus": "1", **SMALL}, token=token)
    assert r.status_code == 400, r.text
    assert f"version: {REFUSED}" in r.text
    model = hub.server_model("dora", "nb")
    assert model is None or not model.get("ready")


def test_the_pages_show_each_images_build_and_the_drivers_cuda(hub):
    form = login(hub, "erin").get(f"{hub.url}/hub/spawn/erin", timeout=60)
    assert form.status_code == 200, form.text[:300]
    page = form.content.decode()  # UTF-8 (the hub's answer names no charset)
    option = re.search(r'<option value="1" data-framework="cudanew"[^>]*>[^<]*</option>', page)
    assert option and 'data-cuda="12.8"' in option.group(0), option
    assert "CUDA new 1 · CUDA 12.8" in option.group(0)
    assert "(their driver supports CUDA 11.8)" in page

    admin = requests.get(
        f"{hub.url}/services/gpulab/admin",
        headers={"Authorization": f"token {hub.admin_token}"},
        timeout=30,
    )
    row = re.search(rf'<tr data-image="{re.escape(IMAGE)}">(.*?)</tr>', admin.text, re.S)
    assert row and "CUDA 12.8" in row.group(1) and "refused" in row.group(1), admin.text[-3000:]
    assert REFUSED in row.group(1).replace("\n", " ")
