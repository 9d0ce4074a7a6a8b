"""GPU discovery through the real nvidia-ml-py binding, against a stand-in libnvidia-ml.so.1
compiled here (tests/support/fake_nvml.c): whole GPUs by index, MIG devices as devices of their
own by UUID, the driver and CUDA versions; and, when there is no GPU, why. Each case runs in
a new Python: the loader reads LD_LIBRARY_PATH when a process starts."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from gpulab.gpus.inventory import GpuDevice, Inventory, cuda_version, discover_nvml

from ..support.nvml import build_fake_nvml, nvml_env, run_python

DISCOVER = """
import json
from gpulab.gpus.inventory import discover_nvml
inv = discover_nvml()
print(json.dumps({"devices": [[d.id, d.model, d.memory] for d in inv.devices],
                  "driver": inv.driver, "cuda": inv.cuda, "problem": inv.problem,
                  "summary": inv.summary()}))
"""


@pytest.fixture(scope="module")
def nvml_dir(tmp_path_factory):
    return build_fake_nvml(tmp_path_factory.mktemp("nvml"))


def discover(env) -> dict:
    return json.loads(run_python(DISCOVER, env))


def test_whole_gpus_by_index_and_mig_devices_by_uuid(nvml_dir):
    gpus = ";".join(
        (
            "NVIDIA A10:24576",  # no MIG support
            "NVIDIA H100 80GB HBM3:81920:-",  # supports MIG, not enabled
            "NVIDIA A100-SXM4-40GB:40960:20480,10240,10240",  # MIG enabled: 3 MIG devices
        )
    )
    got = discover(nvml_env(nvml_dir, gpus, FAKE_NVML_DRIVER="535.161.08", FAKE_NVML_CUDA="12020"))
    mig = "MIG-fa4e0000-0000-4000-8000-000002"
    assert got["devices"] == [
        ["0", "NVIDIA A10", "24576M"],
        ["1", "NVIDIA H100 80GB HBM3", "81920M"],
        [mig + "000000", "NVIDIA A100-SXM4-40GB MIG 0", "20480M"],
        [mig + "000001", "NVIDIA A100-SXM4-40GB MIG 1", "10240M"],
        [mig + "000002", "NVIDIA A100-SXM4-40GB MIG 2", "10240M"],
    ]
    assert (got["driver"], got["cuda"], got["problem"]) == ("535.161.08", "12.2", "")
    assert got["summary"].startswith("5 found with NVML (driver 535.161.08, CUDA 12.2): ")
    assert f"{mig}000001 NVIDIA A100-SXM4-40GB MIG 1 10240M" in got["summary"]


def test_why_there_is_no_gpu(nvml_dir):
    absent = discover(nvml_env(None))
    assert absent["devices"] == []
    assert absent["problem"] == "no NVIDIA driver found (libnvidia-ml.so.1 not loadable)"
    assert absent["summary"] == "no GPU: no NVIDIA driver found (libnvidia-ml.so.1 not loadable)"
    none = discover(nvml_env(nvml_dir, ""))
    assert (none["devices"], none["problem"]) == ([], "NVML found 0 devices")
    not_loaded = discover(nvml_env(nvml_dir, FAKE_NVML_INIT="9"))  # the kernel module is not
    assert not_loaded["problem"] == "NVML did not start: Driver Not Loaded"


def test_without_nvidia_ml_py(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    inv = discover_nvml()
    assert inv.devices == () and inv.problem.startswith("nvidia-ml-py not installed")
    with caplog.at_level(logging.INFO, "gpulab.test"):
        inv.log(logging.getLogger("gpulab.test"))
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "GPUs of this host: no GPU: " + inv.problem)
    ]


def test_a_found_or_configured_inventory_is_logged_at_info(caplog):
    found = Inventory(
        (GpuDevice("0", "NVIDIA H100 80GB HBM3", "81559M"),), "nvml", "550.54.15", "12.4"
    )
    configured = Inventory((GpuDevice("0", "A100", "80G"), GpuDevice("1")), "configured")
    with caplog.at_level(logging.INFO, "gpulab.test"):
        for inv in (found, configured, Inventory()):
            inv.log(logging.getLogger("gpulab.test"))
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        (
            "INFO",
            "GPUs of this host: 1 found with NVML (driver 550.54.15, CUDA 12.4): "
            "0 NVIDIA H100 80GB HBM3 81559M",
        ),
        ("INFO", "GPUs of this host: 2 configured (gpu_devices): 0 A100 80G; 1"),
        ("INFO", "GPUs of this host: no GPU: gpu_devices is empty and discover_gpus is off"),
    ]


def test_cuda_version_as_people_write_it():
    assert [cuda_version(n) for n in (12040, 11080, 12000, 0)] == ["12.4", "11.8", "12.0", ""]
