"""``gpulab doctor`` on real parts: the real command, as a process, against this machine's Docker
engine, the stand-in NVIDIA driver (tests/support/fake_nvml.c, through the real nvidia-ml-py),
an S3 server that checks credentials and a site configuration written here. The engine has
only runc, so the GPUs the stand-in reports cannot be handed out in gpu_mode 'device_request':
an error naming the fix; a store whose secret is wrong is an error that never shows it."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ..support.images import build_from
from ..support.nvml import build_fake_nvml, nvml_env
from ..support.s3 import CheckingS3Server

pytestmark = [pytest.mark.docker]

#: a framework image built for CUDA 12.4 (the stand-in driver's), as build-images.sh labels it
CUDA_IMAGE = "gpulab-test/doctor-cuda:1"
WRONG_SECRET = "doctor-wrong-secret-" + secrets.token_hex(8)

CONFIG = """\
c = get_config()  # noqa: F821
c.GpulabSettings.instance = {instance!r}
c.GpulabSettings.database_url = {database!r}
c.GpulabSettings.gpu_mode = "device_request"
c.GpulabSettings.frameworks = [
    {{"id": "torch", "title": "Torch", "versions": [{{"id": "2.9", "image": {image!r}}}]}}
]
c.GpulabSettings.sync_image = {sync!r}
c.GpulabSettings.object_stores = {{
    "good": {{
        "endpoint_url": {endpoint!r},
        "credentials": {{"access_key_env": "DOCTOR_GOOD_KEY", "secret_key_env": "DOCTOR_GOOD_SECRET"}},
    }},
    "bad": {{
        "endpoint_url": {endpoint!r},
        "credentials": {{"access_key_env": "DOCTOR_BAD_KEY", "secret_key_env": "DOCTOR_BAD_SECRET"}},
    }},
}}
c.GpulabSettings.volume_grants = [
    {{"store": "good", "bucket": "doctor-data", "modes": ["ro"]}},
    {{"store": "bad", "bucket": "doctor-data", "modes": ["ro"]}},
]
c.ConfigurableHTTPProxy.command = [{proxy!r}]
"""


@pytest.fixture(scope="module")
def cuda_image(docker_client, images):
    dockerfile = f"FROM {images}\nLABEL org.gpulab.flavour=cuda org.gpulab.cuda=12.4\n"
    build_from(docker_client, dockerfile, CUDA_IMAGE)
    return CUDA_IMAGE


@pytest.fixture(scope="module")
def store():
    with CheckingS3Server() as server:
        server.boto_client().create_bucket(Bucket="doctor-data")
        yield server


@pytest.fixture(scope="module")
def site(tmp_path_factory, cuda_image, sync_image, store):
    """The site's configuration file, and the environment the hub would run in."""
    home = tmp_path_factory.mktemp("doctor")
    proxy = home / "configurable-http-proxy"  # only its presence is checked
    proxy.write_text("#!/bin/sh\n")
    proxy.chmod(0o755)
    config = home / "site_config.py"
    config.write_text(
        CONFIG.format(
            instance="tdoc" + secrets.token_hex(3),
            database=f"sqlite:///{home / 'gpulab.sqlite'}",
            image=cuda_image,
            sync=sync_image,
            endpoint=store.endpoint,
            proxy=str(proxy),
        )
    )
    env = {
        **os.environ,
        **nvml_env(build_fake_nvml(home / "nvml")),
        "DOCTOR_GOOD_KEY": store.access_key,
        "DOCTOR_GOOD_SECRET": store.secret_key,
        "DOCTOR_BAD_KEY": store.access_key,
        "DOCTOR_BAD_SECRET": WRONG_SECRET,
        "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"),
    }
    env.pop("GPULAB_CONFIG_FILE", None)
    return config, env


def doctor(site, *args: str) -> subprocess.CompletedProcess:
    """The real ``gpulab doctor`` (the console script when installed, else the CLI module)."""
    config, env = site
    gpulab = shutil.which("gpulab", path=str(Path(sys.executable).parent))
    command = [gpulab] if gpulab else [sys.executable, "-m", "gpulab.cli"]
    return subprocess.run(
        [*command, "doctor", "--config", str(config), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def lines(out: str) -> dict[str, tuple[str, str, str]]:
    """check -> (status, what was found, what to do), from the printed report."""
    found: dict[str, tuple[str, str, str]] = {}
    last = ""
    for line in out.splitlines():
        if line.startswith(" "):
            status, text, _ = found[last]
            found[last] = (status, text, line.strip().removeprefix("-> "))
            continue
        status, _, rest = line.partition(" ")
        if status not in ("ok", "warning", "error"):
            continue
        check, _, text = rest.strip().partition("  ")
        found[check] = (status, text.strip(), "")
        last = check
    return found


def test_the_report_of_a_gpu_host_whose_engine_lacks_the_nvidia_runtime(site, sync_image):
    run = doctor(site)
    assert run.returncode == 1, run.stdout + run.stderr  # errors: exit status 1
    assert "Traceback" not in run.stderr, run.stderr
    report = lines(run.stdout)

    assert report["config"][0] == "ok"
    assert report["engine"][0] == "ok" and report["engine"][1].startswith("Docker ")
    assert report["driver"][:2] == ("ok", "NVIDIA driver 550.54.15, CUDA 12.4 (NVML: 2 device(s))")
    assert report["gpu 0"][:2] == ("ok", "GPU 0: NVIDIA H100 80GB HBM3, 81559M")
    assert report["gpu 1"][:2] == ("ok", "GPU 1: NVIDIA A100-SXM4-40GB, 40960M")

    # this engine has runc only: device requests of driver nvidia cannot be met
    status, found, todo = report["gpu runtime"]
    assert status == "error" and "cannot hand out this host's 2 GPU(s)" in found
    assert "nvidia-ctk runtime configure --runtime=docker" in todo

    assert report[f"image {CUDA_IMAGE}"][:2] == (
        "ok",
        "torch 2.9: CUDA build (needs CUDA 12.4); the driver supports CUDA 12.4",
    )
    assert report[f"image {sync_image}"][:2] == ("ok", "sync helper: present")

    assert report["store good"][0] == "ok"
    assert "doctor-data answer(s) with the keys from $DOCTOR_GOOD_KEY" in report["store good"][1]
    status, found, todo = report["store bad"]
    assert status == "error"
    assert "the secret key from $DOCTOR_BAD_KEY / $DOCTOR_BAD_SECRET does not match" in found
    assert "$DOCTOR_BAD_KEY / $DOCTOR_BAD_SECRET" in todo
    assert report["database"][0] == "ok" and "does not exist yet" in report["database"][1]
    assert report["proxy"][0] == "ok"
    assert report["address pools"][0] in ("ok", "warning")  # depends on the engine's networks

    # no credential is ever printed, the wrong one included
    _, env = site
    for secret in (WRONG_SECRET, env["DOCTOR_GOOD_SECRET"]):
        assert secret not in run.stdout and secret not in run.stderr


def test_json_for_machines(site):
    run = doctor(site, "--json")
    assert run.returncode == 1, run.stderr
    doc = json.loads(run.stdout)
    assert doc["status"] == "error"
    statuses = {c["check"]: c["status"] for c in doc["checks"]}
    assert statuses["engine"] == "ok" and statuses["gpu runtime"] == "error"
    assert statuses["store bad"] == "error" and statuses["gpu 1"] == "ok"
    assert WRONG_SECRET not in run.stdout
