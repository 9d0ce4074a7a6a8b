"""GPU activity through the real nvidia-ml-py binding, against the stand-in libnvidia-ml.so.1
(tests/support/fake_nvml.c), whose utilization and memory use the test sets in a file that
the library reads again at every call: NvmlUsage reads each device, whole GPUs by index (and
UUID), MIG devices by UUID with no utilization of their own; a change of the file is seen by
the next read of the same NVML session. Each case runs in a new Python (the loader reads
LD_LIBRARY_PATH when a process starts)."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from gpulab.gpus.usage import DeviceUsage, NvmlUsage, busiest, usage_of
from gpulab.metrics import GpuUsageCollector

from ..support.nvml import build_fake_nvml, nvml_env, run_python, set_usage

MIB = 1024**2

READ_TWICE = """
import json, os
from gpulab.gpus.usage import NvmlUsage
reader = NvmlUsage()
first = reader.read()
with open(os.environ["FAKE_NVML_USAGE"], "w") as f:  # the workload's GPU went idle
    f.write("0 0 512\\n")
second = reader.read()
as_json = lambda us: [[u.id, u.utilization, u.memory_used, u.memory_total, u.uuid] for u in us]
print(json.dumps({"first": as_json(first), "second": as_json(second),
                  "problem": reader.problem}))
"""


@pytest.fixture(scope="module")
def nvml_dir(tmp_path_factory):
    return build_fake_nvml(tmp_path_factory.mktemp("nvml"))


def test_utilization_and_memory_of_each_device_read_again_at_every_call(nvml_dir, tmp_path):
    usage = tmp_path / "usage"
    set_usage(usage, {"0": (87, 30000), "1:1": (55, 4096)})
    gpus = "NVIDIA H100 80GB HBM3:81559;NVIDIA A100-SXM4-40GB:40960:20480,10240"
    got = json.loads(run_python(READ_TWICE, nvml_env(nvml_dir, gpus, FAKE_NVML_USAGE=str(usage))))
    mig = "MIG-fa4e0000-0000-4000-8000-000001"
    assert got["problem"] == ""
    assert got["first"] == [
        ["0", 87, 30000 * MIB, 81559 * MIB, "GPU-fa4e0000-0000-4000-8000-000000000000"],
        [mig + "000000", None, 0, 20480 * MIB, ""],  # MIG: NVML has no utilization
        [mig + "000001", None, 4096 * MIB, 10240 * MIB, ""],
    ]
    assert got["second"][0][:3] == ["0", 0, 512 * MIB]


def test_no_driver_reads_nothing_and_says_why_once(nvml_dir):
    code = (
        "from gpulab.gpus.usage import NvmlUsage\n"
        "r = NvmlUsage()\n"
        "print(r.read(), r.read(), r.problem)\n"
    )
    out = run_python(code, nvml_env(None))
    assert out.strip() == "[] [] no NVIDIA driver found (libnvidia-ml.so.1 not loadable)"


def test_without_nvidia_ml_py_a_warning_once(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    reader = NvmlUsage()
    with caplog.at_level(logging.WARNING, "gpulab.gpus"):
        assert reader.read() == [] and reader.read() == []
    assert [r.getMessage() for r in caplog.records] == [
        "GPU activity cannot be read: nvidia-ml-py is not installed; hang detection judges "
        "jobs by output and CPU alone and /metrics has no GPU usage"
    ]


def test_a_workloads_devices_by_index_or_uuid_and_the_busiest():
    usages = [
        DeviceUsage("0", 10, 0, 1, "GPU-a"),
        DeviceUsage("1", 90, 0, 1, "GPU-b"),
        DeviceUsage("MIG-c", None, 0, 1),
    ]
    assert [u.id for u in usage_of(usages, ["GPU-b", "0", "7"])] == ["1", "0"]
    assert busiest(usage_of(usages, ["0", "GPU-b"])) == 90
    assert busiest(usage_of(usages, ["MIG-c"])) is None
    assert busiest([]) is None


def scrape(collector) -> dict[tuple[str, tuple], float]:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_per_device_and_per_workload_that_holds_one():
    usages = [
        DeviceUsage("0", 87, 30 * 2**30, 80 * 2**30, "GPU-a"),
        DeviceUsage("1", 0, 0, 80 * 2**30, "GPU-b"),
        DeviceUsage("MIG-c", None, 2**30, 10 * 2**30),
    ]
    held = [
        {"device": "0", "kind": "job", "owner": "ann", "workload": "t/job/j1"},
        {"device": "MIG-c", "kind": "notebook", "owner": "bob", "workload": "t/notebook/bob/"},
        {"device": "7", "kind": "job", "owner": "cy", "workload": "t/job/gone"},  # not read
    ]
    got = scrape(GpuUsageCollector(lambda: usages, lambda: held, ["0", "GPU-b", "MIG-c"]))
    assert {k: v for k, v in got.items() if k[0] == "gpulab_gpu_utilization_percent"} == {
        ("gpulab_gpu_utilization_percent", (("device", "0"),)): 87.0,
        # the ledger names this one by its UUID: so does the metric
        ("gpulab_gpu_utilization_percent", (("device", "GPU-b"),)): 0.0,
    }
    assert got[("gpulab_gpu_memory_used_bytes", (("device", "MIG-c"),))] == 2**30
    assert got[("gpulab_gpu_memory_total_bytes", (("device", "0"),))] == 80 * 2**30
    job = (("device", "0"), ("kind", "job"), ("user", "ann"), ("workload", "t/job/j1"))
    nb = (
        ("device", "MIG-c"),
        ("kind", "notebook"),
        ("user", "bob"),
        ("workload", "t/notebook/bob/"),
    )
    workload_series = {k: v for k, v in got.items() if k[0].startswith("gpulab_workload_")}
    assert workload_series == {
        ("gpulab_workload_gpu_utilization_percent", job): 87.0,
        ("gpulab_workload_gpu_memory_used_bytes", job): 30 * 2**30,
        ("gpulab_workload_gpu_memory_used_bytes", nb): 2**30,
    }


def test_no_reading_no_gpu_series():
    got = scrape(GpuUsageCollector(list, lambda: [{"device": "0"}], ["0"]))
    assert not [k for k in got if "gpu" in k[0]]


def test_registering_the_collector_reads_no_gpu():
    """The service registers it on its event loop; a read there (which waits for that loop)
    stalled every start-up 20 s, until the reader's time-out."""
    from prometheus_client import CollectorRegistry, generate_latest

    reads = []

    def read():
        reads.append(1)
        return [DeviceUsage("0", 50, 1, 2)]

    registry = CollectorRegistry(auto_describe=True)  # as the global REGISTRY the service uses
    registry.register(GpuUsageCollector(read, list, ["0"]))
    assert reads == []
    assert b'gpulab_gpu_utilization_percent{device="0"} 50.0' in generate_latest(registry)
    assert reads == [1]
