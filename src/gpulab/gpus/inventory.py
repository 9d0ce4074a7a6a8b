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
    """Ask the NVIDIA driver through NVML; no library or no driver means no GPU."""
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
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h).total
            name = pynvml.nvmlDeviceGetName(h)
            out.append(
                GpuDevice(
                    id=str(i),
                    model=name.decode() if isinstance(name, bytes) else str(name),
                    memory=f"{mem // 1024**2}M",
                )
            )
        return out
    finally:
        pynvml.nvmlShutdown()


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
