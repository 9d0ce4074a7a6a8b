"""scripts/build-images.sh never turns a CUDA image into a CPU one by itself: on a host without
an NVIDIA driver (this one), a tag that holds a CUDA image is kept, --force too, and said so;
only --gpu cpu replaces it. The CUDA image here is a label-only stand-in (gpulab/python:3.11
labelled org.gpulab.flavour=cuda), so nothing is downloaded; the replacing run is shown by the
decision it logs, then stopped by a base that cannot be read (nothing is built)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpulab.cuda import CUDA_LABEL, FLAVOUR_LABEL

from ..conftest import ROOT
from ..support.images import build_from, labelled

pytestmark = [pytest.mark.docker]

SCRIPT = ROOT / "scripts" / "build-images.sh"
TAG = "gpulab-test/pytorch-cuda:1"
#: a base no engine can read: a registry on a closed port answers at once
NO_BASE = "localhost:1/gpulab-test/no-base:0"


@pytest.fixture
def cuda_image(docker_client, images):
    if Path("/proc/driver/nvidia/version").exists():
        pytest.skip("this host has an NVIDIA driver: its default build is the CUDA one")
    labels = {FLAVOUR_LABEL: "cuda", CUDA_LABEL: "12.8"}
    build_from(docker_client, labelled("gpulab/python:3.11", labels), TAG)
    yield docker_client.images.get(TAG).id
    docker_client.images.remove(TAG, force=True)


def build(tmp_path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(SCRIPT), *args],
        env={
            **os.environ,
            "GPULAB_BUILD_DIR": str(tmp_path),  # its own lock, logs and wheels
            "GPULAB_PYTORCH_IMAGE": TAG,
            **env,
        },
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_a_cuda_image_is_kept_by_a_build_the_host_made_cpu(tmp_path, docker_client, cuda_image):
    kept = (
        f"{TAG}: kept, it is a CUDA image (CUDA 12.8) and this build would be CPU (no NVIDIA "
        "driver found on this host); --gpu cpu (make images GPU=cpu) replaces it"
    )
    for args in (["pytorch"], ["--force", "pytorch"]):
        run = build(tmp_path, *args)
        assert run.returncode == 0, run.stderr
        assert "framework images: cpu build (no NVIDIA driver on this host" in run.stderr
        assert kept in run.stderr, run.stderr
        assert docker_client.images.get(TAG).id == cuda_image


def test_gpu_cpu_replaces_it(tmp_path, docker_client, cuda_image):
    run = build(tmp_path, "--gpu", "cpu", "pytorch", GPULAB_PYTHON_IMAGE=NO_BASE)
    assert "framework images: cpu build (asked: --gpu cpu)" in run.stderr
    assert "kept" not in run.stderr
    assert f"{TAG}: exists but is stale" in run.stderr and "rebuilding as cpu" in run.stderr
    # the base cannot be read: the run stops there, before any build, and says why
    assert run.returncode != 0
    assert f"cannot tell the Python version of {NO_BASE}" in run.stderr, run.stderr
    assert docker_client.images.get(TAG).id == cuda_image


def test_an_unknown_flavour_is_refused(tmp_path):
    run = build(tmp_path, "--gpu", "rocm", "pytorch")
    assert run.returncode == 1
    assert "--gpu (GPU=, GPULAB_GPU) is auto, cuda or cpu, not 'rocm'" in run.stderr
