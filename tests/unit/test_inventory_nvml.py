"""GPU discovery through NVML: whole GPUs by index, MIG devices as devices of their own by
UUID. A fake NVML module with NVML's call names and answers: no machine here has a GPU (the
function has not been run against a real driver yet)."""

from __future__ import annotations

from types import SimpleNamespace

from gpulab.gpus.inventory import nvml_devices


class FakeNvml:
    NVML_DEVICE_MIG_ENABLE = 1

    class NVMLError(Exception):
        pass

    def __init__(self, gpus):
        self.gpus = gpus  # [(name, memory, mig slots or None)]

    def nvmlDeviceGetCount(self):  # noqa: N802 (NVML's names)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
        return ("gpu", i)

    def nvmlDeviceGetName(self, h):  # noqa: N802
        return self.gpus[h[1]][0].encode()

    def nvmlDeviceGetMigMode(self, h):  # noqa: N802
        slots = self.gpus[h[1]][2]
        if slots is None:
            raise self.NVMLError("Not Supported")
        return (1 if slots else 0, 0)

    def nvmlDeviceGetMaxMigDeviceCount(self, h):  # noqa: N802
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, j):  # noqa: N802
        slots = self.gpus[h[1]][2]
        if j >= len(slots):
            raise self.NVMLError("Not Found")
        return ("mig", h[1], j)

    def nvmlDeviceGetUUID(self, h):  # noqa: N802
        return f"MIG-{h[1]}-{h[2]}-uuid"

    def nvmlDeviceGetMemoryInfo(self, h):  # noqa: N802
        if h[0] == "gpu":
            return SimpleNamespace(total=self.gpus[h[1]][1])
        return SimpleNamespace(total=self.gpus[h[1]][2][h[2]])


def test_whole_gpus_by_index_and_mig_devices_by_uuid():
    g = 1024**3
    nvml = FakeNvml(
        [
            ("NVIDIA A10", 24 * g, None),  # no MIG support
            ("NVIDIA H100 80GB HBM3", 80 * g, []),  # supports MIG, not enabled
            ("NVIDIA A100-SXM4-40GB", 40 * g, [20 * g, 10 * g, 10 * g]),  # MIG enabled
        ]
    )
    got = [(d.id, d.model, d.memory) for d in nvml_devices(nvml)]
    assert got == [
        ("0", "NVIDIA A10", "24576M"),
        ("1", "NVIDIA H100 80GB HBM3", "81920M"),
        ("MIG-2-0-uuid", "NVIDIA A100-SXM4-40GB MIG 0", "20480M"),
        ("MIG-2-1-uuid", "NVIDIA A100-SXM4-40GB MIG 1", "10240M"),
        ("MIG-2-2-uuid", "NVIDIA A100-SXM4-40GB MIG 2", "10240M"),
    ]
