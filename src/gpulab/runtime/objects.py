"""Pure builders of what gpulab sends to the container engine (tested without an engine).

Every container carries labels from which any process can rebuild its view of the world after
a restart: who owns it, what kind of workload it is, which workload, which GPUs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .. import __version__

LABEL_PREFIX = "org.gpulab."
L_INSTANCE = LABEL_PREFIX + "instance"
L_KIND = LABEL_PREFIX + "kind"
L_USER = LABEL_PREFIX + "user"
L_SERVER = LABEL_PREFIX + "server"
L_WORKLOAD = LABEL_PREFIX + "workload"
L_GPUS = LABEL_PREFIX + "gpus"
L_VERSION = LABEL_PREFIX + "version"

_UNSAFE = re.compile(r"[^a-z0-9]")


def escape_name(text: str) -> str:
    """Docker-safe, collision-free escaping: a-z0-9 kept, everything else as -XX hex."""
    return _UNSAFE.sub(lambda m: "".join(f"-{b:02x}" for b in m.group().encode()), text)


def notebook_workload_id(instance: str, user: str, server: str) -> str:
    return f"{instance}/notebook/{user}/{server}"


def notebook_container_name(instance: str, user: str, server: str) -> str:
    name = f"{escape_name(instance)}-nb-{escape_name(user)}"
    return f"{name}--{escape_name(server)}" if server else name


def notebook_volume_name(instance: str, user: str, server: str) -> str:
    return notebook_container_name(instance, user, server) + "-workspace"


def workload_labels(
    instance: str, kind: str, user: str, workload: str, gpus: Sequence[str], server: str = ""
) -> dict[str, str]:
    return {
        L_INSTANCE: instance,
        L_KIND: kind,
        L_USER: user,
        L_SERVER: server,
        L_WORKLOAD: workload,
        L_GPUS: ",".join(gpus),
        L_VERSION: __version__,
    }


def gpu_request(gpu_ids: Sequence[str], mode: str) -> tuple[dict, dict[str, str]]:
    """(extra host config, extra environment) that hand exactly ``gpu_ids`` to a container.

    'device_request': Docker DeviceRequest with driver nvidia, capability gpu, explicit IDs.
    'env': NVIDIA_VISIBLE_DEVICES, for hosts whose default runtime is nvidia. Either way a
    container without GPUs is told so explicitly, so that the nvidia runtime does not give it all.
    """
    if mode == "device_request":
        if not gpu_ids:
            return {}, {}
        req = {
            "Driver": "nvidia",
            "DeviceIDs": list(gpu_ids),
            "Capabilities": [["gpu"]],
        }
        return {"device_requests": [req]}, {}
    if mode == "env":
        return {}, {
            "NVIDIA_VISIBLE_DEVICES": ",".join(gpu_ids) if gpu_ids else "void",
            "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
        }
    raise ValueError(f"unknown gpu mode {mode!r}")


def hardened_host_config() -> dict:
    """What every user container gets whatever it asks for."""
    return {
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges:true"],
        "privileged": False,
    }
