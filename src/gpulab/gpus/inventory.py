"""The GPUs of this host: configured by the admin, or discovered with NVML."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuDevice:
    id: str  # what the engine is given: an index ("0") or a UUID ("GPU-...")
    model: str = ""
    memory: str = ""
    node: str = ""  # the cluster node that has it ("" on one host)

    @property
    def key(self) -> str:
        """The ledger's name for it: unique across the cluster ("node/id"; "id" on one host)."""
        return f"{self.node}/{self.id}" if self.node else self.id

    def to_json(self) -> dict:
        out = {"id": self.id, "model": self.model, "memory": self.memory}
        if self.node:
            out["node"] = self.node
        return out


def node_of(key: str) -> str:
    """The node part of a ledger key ("" on one host)."""
    node, sep, _ = key.rpartition("/")
    return node if sep else ""


def device_id(key: str) -> str:
    """The device ID the node's engine knows, from a ledger key."""
    return key.rpartition("/")[2]


def from_config(devices: Sequence[Mapping]) -> list[GpuDevice]:
    out = [
        GpuDevice(id=str(d["id"]), model=str(d.get("model", "")), memory=str(d.get("memory", "")))
        for d in devices
    ]
    ids = [d.id for d in out]
    if len(set(ids)) != len(ids):
        raise ValueError(f"gpu_devices lists a device twice: {ids}")
    return out


def discover_nvml() -> list[GpuDevice]:
    """Ask the NVIDIA driver through NVML; no library or no driver means no GPU.

    A whole GPU is named by its index (what the engine and NVIDIA_VISIBLE_DEVICES take). A GPU
    in MIG mode is not handed out itself: each of its MIG devices is a device of its own,
    named by its UUID (``MIG-...``, which NVIDIA_VISIBLE_DEVICES also takes)."""
    try:
        import pynvml  # provided by nvidia-ml-py
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        log.info("NVML not available (%s): no GPUs discovered", e)
        return []
    try:
        return nvml_devices(pynvml)
    finally:
        pynvml.nvmlShutdown()


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_devices(nvml) -> list[GpuDevice]:
    """The devices an initialised NVML (the ``pynvml`` module) reports, MIG devices apart."""
    out = []
    for i in range(nvml.nvmlDeviceGetCount()):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        name = _text(nvml.nvmlDeviceGetName(h))
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(h)
            mig = current == nvml.NVML_DEVICE_MIG_ENABLE
        except nvml.NVMLError:  # a GPU without MIG support
            mig = False
        if not mig:
            mem = nvml.nvmlDeviceGetMemoryInfo(h).total
            out.append(GpuDevice(id=str(i), model=name, memory=f"{mem // 1024**2}M"))
            continue
        for j in range(nvml.nvmlDeviceGetMaxMigDeviceCount(h)):
            try:
                m = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
            except nvml.NVMLError:  # no MIG device in this slot
                continue
            mem = nvml.nvmlDeviceGetMemoryInfo(m).total
            out.append(
                GpuDevice(
                    id=_text(nvml.nvmlDeviceGetUUID(m)),
                    model=f"{name} MIG {j}",
                    memory=f"{mem // 1024**2}M",
                )
            )
    return out


def from_nodes(nodes) -> tuple[list[GpuDevice], list[str]]:
    """A cluster's GPUs and the nodes that take workloads now (ready and active), from the
    runtime's :class:`~gpulab.runtime.base.Node` list: a node that is down or drained offers
    nothing to new placements (what it holds stays booked until its workloads are gone)."""
    usable = sorted((n for n in nodes if n.ready and n.active), key=lambda n: n.hostname)
    devices = [GpuDevice(id=g, node=n.hostname) for n in usable for g in n.gpus]
    return devices, [n.hostname for n in usable]


def load_inventory(devices: Sequence[Mapping], discover: bool = True) -> list[GpuDevice]:
    if devices:
        return from_config(devices)
    return discover_nvml() if discover else []
