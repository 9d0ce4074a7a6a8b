"""The names gpulab gives to what it creates (pure).

Workload ids (the ledger's and the records' key of a notebook or a job), the engine's object
names (containers, volumes, networks, a distributed job's ranks) and the labels from which any
process rebuilds its view of the world after a restart: who owns an object, what kind of
workload it is, which workload, which GPUs. :data:`LABEL_PREFIX` namespaces every label gpulab
sets; a job may not set one (its labels would claim ownership).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

from . import __version__
from .volumes import VolumeSpec

#: the namespace of every label gpulab sets
LABEL_PREFIX = "org.gpulab."
L_INSTANCE = LABEL_PREFIX + "instance"
L_KIND = LABEL_PREFIX + "kind"
L_USER = LABEL_PREFIX + "user"
L_SERVER = LABEL_PREFIX + "server"
L_WORKLOAD = LABEL_PREFIX + "workload"
L_GPUS = LABEL_PREFIX + "gpus"
L_VERSION = LABEL_PREFIX + "version"
#: on a notebook's workload on a cluster: its gateway route, overlay and port (runtime/gateway.py)
L_ROUTE = LABEL_PREFIX + "route"
L_NETWORK = LABEL_PREFIX + "network"
L_PORT = LABEL_PREFIX + "port"
#: on a distributed job's own network: the job's id
L_JOB = LABEL_PREFIX + "job"

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


def job_container_name(instance: str, job_id: str) -> str:
    return f"{escape_name(instance)}-job-{job_id}"


def job_workload_id(instance: str, job_id: str) -> str:
    return f"{instance}/job/{job_id}"


def rank_name(name: str, rank: int) -> str:
    """The workload name of ``rank`` of the job whose (rank 0) workload is ``name``: rank 0
    keeps the name a one-container job has, rank k > 0 is ``<name>-r<k>``."""
    return name if rank == 0 else f"{name}-r{rank}"


def rank_alias(rank: int) -> str:
    """The name the other workers resolve ``rank`` by, on the job's own network."""
    return f"worker-{rank}"


def volume_name(container: str, spec: VolumeSpec, workspace: bool = False) -> str:
    """The engine volume that holds one of ``container``'s volumes (its workspace, or the
    volume mounted where ``spec`` says)."""
    if workspace:
        return f"{container}-workspace"
    return f"{container}-v-{hashlib.sha256(spec.mount.encode()).hexdigest()[:10]}"


def home_volume_name(container: str) -> str:
    """The engine volume that holds ``container``'s home (a notebook's, kept across stops)."""
    return f"{container}-home"


def user_network_name(instance: str, user: str, driver: str = "bridge") -> str:
    """A user's own network: a bridge on one engine, an overlay across a Swarm."""
    middle = "ovl" if driver == "overlay" else "net"
    return f"{escape_name(instance)}-{middle}-{escape_name(user)}"


def job_network_name(instance: str, job_id: str, driver: str = "bridge") -> str:
    """A distributed job's own network (its workers only)."""
    middle = "jobovl" if driver == "overlay" else "job"
    return f"{escape_name(instance)}-{middle}-{escape_name(job_id)}"


def gpu_agent_service_name(instance: str) -> str:
    """The global service whose task on each node of a Swarm reads that node's GPUs
    (:mod:`gpulab.gpus.agent`)."""
    return f"{escape_name(instance)}-gpu-agent"


def gateway_container_name(instance: str) -> str:
    """The container on a Swarm manager through which the hub reaches notebooks on overlays
    (:mod:`gpulab.runtime.gateway`)."""
    return f"{escape_name(instance)}-gateway"


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
