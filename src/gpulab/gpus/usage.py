"""What a host's GPUs are doing now: each device's utilization and memory use, read with
NVML (nvidia-ml-py) on the host that has them.

The service reads its own host's devices (one engine); on a Swarm each node's are read by
gpulab's GPU agent on that node (:mod:`.agent`). Either way they reach the domains through
``Runtime.gpu_usage`` (node -> readings), named as the ledger names devices by :func:`keyed`.

NVML's utilization is the share of its last sample period (1/6 s to 1 s, by model) during
which a kernel ran on the device: a point in time, not an average over minutes, so a caller
that wants "idle for a period" samples it again and again. A MIG device has no utilization
of its own in NVML (``Not Supported``): its memory use is read, its utilization is None.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .inventory import nvml_handles

log = logging.getLogger("gpulab.gpus")


@dataclass(frozen=True)
class DeviceUsage:
    #: what the engine is given (inventory's ids): the GPU's index, or a MIG device's UUID
    id: str
    #: percent of NVML's last sample period a kernel ran; None where NVML cannot say (MIG)
    utilization: int | None
    memory_used: int  # bytes
    memory_total: int  # bytes
    #: the whole GPU's UUID ("GPU-..."), which an admin may have configured instead of its index
    uuid: str = ""

    def names(self) -> tuple[str, ...]:
        return (self.id, self.uuid) if self.uuid else (self.id,)


def usage_of(usages: Iterable[DeviceUsage], devices: Iterable[str]) -> list[DeviceUsage]:
    """The readings of ``devices`` (ids as the ledger books them on one host: an index, a
    GPU's or a MIG device's UUID), in their order; a device not read is left out."""
    by_name = {n: u for u in usages for n in u.names()}
    return [by_name[d] for d in devices if d in by_name]


def keyed(readings: Mapping[str, Sequence[DeviceUsage]]) -> list[DeviceUsage]:
    """``Runtime.gpu_usage``'s readings (node -> its devices', "" on one engine) as one list,
    each device named as the GPU ledger names it: "node/id" (and "node/UUID") on a cluster,
    as read on one engine; so that :func:`usage_of` finds a workload's booked devices on one
    host and on a cluster alike."""
    out = []
    for node, usages in readings.items():
        for u in usages:
            if not node:
                out.append(u)
                continue
            uuid = f"{node}/{u.uuid}" if u.uuid else ""
            out.append(
                DeviceUsage(f"{node}/{u.id}", u.utilization, u.memory_used, u.memory_total, uuid)
            )
    return out


def busiest(usages: Sequence[DeviceUsage]) -> int | None:
    """The highest utilization among ``usages``; None when none of them has one."""
    known = [u.utilization for u in usages if u.utilization is not None]
    return max(known) if known else None


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlUsage:
    """Reads every device of this host through NVML, which it starts once and keeps started
    (a failed read shuts it down; the next read starts it again). When NVML cannot start at
    all (no nvidia-ml-py, no driver) it says why once, at WARNING, and reads nothing after.
    Thread-safe: the supervisor and the metrics endpoint read from their own threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nvml = None
        self.problem = ""  # why nothing can be read ("" while it can)

    def _start(self):
        try:
            import pynvml  # provided by nvidia-ml-py
        except ImportError:
            self._give_up("nvidia-ml-py is not installed")
            return None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound:
            self._give_up("no NVIDIA driver found (libnvidia-ml.so.1 not loadable)")
            return None
        except pynvml.NVMLError as e:
            self._give_up(f"NVML did not start: {e}")
            return None
        self._nvml = pynvml
        return pynvml

    def _give_up(self, why: str) -> None:
        self.problem = why
        log.warning(
            "GPU activity cannot be read: %s; hang detection judges jobs by output and CPU "
            "alone and /metrics has no GPU usage",
            why,
        )

    def read(self) -> list[DeviceUsage]:
        """Every device's usage now (MIG devices as devices of their own), or [] when NVML
        cannot be read."""
        with self._lock:
            if self.problem:
                return []
            nvml = self._nvml or self._start()
            if nvml is None:
                return []
            try:
                return read_devices(nvml)
            except nvml.NVMLError as e:
                log.warning("GPU activity not read this time: %s", e)
                try:
                    nvml.nvmlShutdown()
                finally:
                    self._nvml = None
                return []

    def close(self) -> None:
        with self._lock:
            if self._nvml is not None:
                self._nvml.nvmlShutdown()
                self._nvml = None


def read_devices(nvml) -> list[DeviceUsage]:
    """The usage of every device an initialised NVML (the ``pynvml`` module) reports, named as
    :func:`gpulab.gpus.inventory.nvml_devices` names them."""
    out = []
    for device_id, _model, handle, whole in nvml_handles(nvml):
        mem = nvml.nvmlDeviceGetMemoryInfo(handle)
        if whole:
            util = int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            out.append(DeviceUsage(device_id, util, int(mem.used), int(mem.total), uuid))
            continue
        util = None
        with contextlib.suppress(nvml.NVMLError):  # NVML has none per MIG device
            util = int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        out.append(DeviceUsage(device_id, util, int(mem.used), int(mem.total)))
    return out
