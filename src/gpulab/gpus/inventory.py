"""The GPUs of this host: configured by the admin, or discovered with NVML."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class GpuDevice:
    id: str  # what the engine is given: an index ("0") or a UUID ("GPU-...")
    model: str = ""
    memory: str = ""
    node: str = ""  # the cluster node that has it ("" on one host)
    #: the node pools its node is in (``node_pools`` on one host, a Swarm node's label)
    pools: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """The ledger's name for it: unique across the cluster ("node/id"; "id" on one host)."""
        return f"{self.node}/{self.id}" if self.node else self.id

    def to_json(self) -> dict:
        out = {"id": self.id, "model": self.model, "memory": self.memory}
        if self.node:
            out["node"] = self.node
        if self.pools:
            out["pools"] = list(self.pools)
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


@dataclass(frozen=True)
class Inventory:
    """What a host's GPU inventory found: its devices and where they came from, the driver's
    version and the CUDA version it supports (NVML), or why there is no GPU."""

    devices: tuple[GpuDevice, ...] = ()
    #: "configured" (gpu_devices), "nvml" (asked the driver) or "" (discovery off)
    source: str = ""
    driver: str = ""
    cuda: str = ""
    #: why NVML gave no GPU ("" when it gave some, or was not asked)
    problem: str = ""

    def summary(self) -> str:
        """One line for a log or a page: the devices with their model and memory, MIG devices
        included, the driver and CUDA versions; or why there is none."""
        if not self.devices:
            if self.problem:
                return f"no GPU: {self.problem}"
            return "no GPU: gpu_devices is empty and discover_gpus is off"
        listed = "; ".join(" ".join(filter(None, (d.id, d.model, d.memory))) for d in self.devices)
        if self.source == "configured":
            return f"{len(self.devices)} configured (gpu_devices): {listed}"
        return (
            f"{len(self.devices)} found with NVML (driver {self.driver or '?'}, "
            f"CUDA {self.cuda or '?'}): {listed}"
        )

    def log(self, logger: logging.Logger) -> None:
        """The summary at INFO, or at WARNING when NVML was asked and gave no GPU."""
        level = logging.WARNING if self.problem else logging.INFO
        logger.log(level, "GPUs of this host: %s", self.summary())


def cuda_version(number: int) -> str:
    """NVML's CUDA version number (12040) as people write it ("12.4")."""
    return f"{number // 1000}.{number % 1000 // 10}" if number > 0 else ""


def discover_nvml() -> Inventory:
    """Ask the NVIDIA driver through NVML (nvidia-ml-py, which loads libnvidia-ml.so.1); no
    library, no driver or no device means no GPU, and the inventory says which.

    A whole GPU is named by its index (what the engine and NVIDIA_VISIBLE_DEVICES take). A GPU
    in MIG mode is not handed out itself: each of its MIG devices is a device of its own,
    named by its UUID (``MIG-...``, which NVIDIA_VISIBLE_DEVICES also takes)."""
    try:
        import pynvml  # provided by nvidia-ml-py
    except ImportError:
        return Inventory(
            source="nvml",
            problem="nvidia-ml-py not installed (pip install nvidia-ml-py): NVML cannot be asked",
        )
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        return Inventory(
            source="nvml", problem="no NVIDIA driver found (libnvidia-ml.so.1 not loadable)"
        )
    except pynvml.NVMLError as e:
        return Inventory(source="nvml", problem=f"NVML did not start: {e}")
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        cuda = cuda_version(pynvml.nvmlSystemGetCudaDriverVersion())
        devices = tuple(nvml_devices(pynvml))
    except pynvml.NVMLError as e:
        return Inventory(source="nvml", problem=f"NVML could not list the GPUs: {e}")
    finally:
        pynvml.nvmlShutdown()
    problem = "" if devices else "NVML found 0 devices"
    return Inventory(devices, "nvml", driver, cuda, problem)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_handles(nvml):
    """Each device an initialised NVML (the ``pynvml`` module) reports, as gpulab names it:
    ``(id, model, handle, whole)``, a whole GPU by its index, a MIG device by its UUID (what the
    engine is given either way). The one walk of NVML's devices, for the inventory and the
    usage alike."""
    for i in range(nvml.nvmlDeviceGetCount()):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        name = _text(nvml.nvmlDeviceGetName(h))
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(h)
            mig = current == nvml.NVML_DEVICE_MIG_ENABLE
        except nvml.NVMLError:  # a GPU without MIG support
            mig = False
        if not mig:
            yield str(i), name, h, True
            continue
        for j in range(nvml.nvmlDeviceGetMaxMigDeviceCount(h)):
            try:
                m = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
            except nvml.NVMLError:  # no MIG device in this slot
                continue
            yield _text(nvml.nvmlDeviceGetUUID(m)), f"{name} MIG {j}", m, False


def nvml_devices(nvml) -> list[GpuDevice]:
    """The devices an initialised NVML (the ``pynvml`` module) reports, MIG devices apart."""
    return [
        GpuDevice(
            id=device_id,
            model=model,
            memory=f"{nvml.nvmlDeviceGetMemoryInfo(handle).total // 1024**2}M",
        )
        for device_id, model, handle, _whole in nvml_handles(nvml)
    ]


def described(
    devices: Sequence[GpuDevice], models: Mapping[str, str], pools: Sequence[str] = ()
) -> list[GpuDevice]:
    """``devices`` with the admin's names: ``models`` (``gpu_models``: ledger key -> model)
    fills in or overrides each one's model (NVML's name, a node's label), and ``pools``
    (``node_pools``, one host) are the pools of a device whose node gave none."""
    return [
        replace(d, model=models.get(d.key) or d.model, pools=d.pools or tuple(pools))
        for d in devices
    ]


def node_pools_of(nodes) -> dict[str, tuple[str, ...]]:
    """{hostname: its pools} of the nodes (the runtime's :class:`~gpulab.runtime.base.Node`
    list) that take workloads now."""
    return {n.hostname: tuple(n.pools) for n in nodes if n.ready and n.active}


def from_nodes(nodes) -> tuple[list[GpuDevice], list[str]]:
    """A cluster's GPUs and the nodes that take workloads now (ready and active), from the
    runtime's :class:`~gpulab.runtime.base.Node` list (each device with its node's GPU model
    and pools, from its labels): a node that is down or drained offers
    nothing to new placements, and one whose GPUs are refused (``gpus_refused``: its engine
    cannot hand them out, or did not say) offers no GPU, only its CPUs (what either holds
    stays booked until its workloads are gone)."""
    usable = sorted((n for n in nodes if n.ready and n.active), key=lambda n: n.hostname)
    devices = [
        GpuDevice(id=g, node=n.hostname, model=n.gpu_model, pools=tuple(n.pools))
        for n in usable
        if not n.gpus_refused
        for g in n.gpus
    ]
    return devices, [n.hostname for n in usable]


def read_inventory(devices: Sequence[Mapping], discover: bool = True) -> Inventory:
    """This host's GPUs: the configured ones (``gpu_devices``), else NVML's when
    ``discover``."""
    if devices:
        return Inventory(tuple(from_config(devices)), "configured")
    return discover_nvml() if discover else Inventory()


def load_inventory(devices: Sequence[Mapping], discover: bool = True) -> list[GpuDevice]:
    """The devices of :func:`read_inventory`."""
    return list(read_inventory(devices, discover).devices)
