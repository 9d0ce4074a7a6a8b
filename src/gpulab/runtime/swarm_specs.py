"""What gpulab asks of a Swarm manager, as data: the service of a workload, the service of a
sync helper, and what a service's tasks say of its workload. Pure functions (no engine), used
by :class:`~gpulab.runtime.swarm.SwarmRuntime` and tested on their own."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from datetime import datetime

from ..names import L_INSTANCE, L_KIND, LABEL_PREFIX
from .base import RUNNER_PATH, WorkloadSpec, WorkloadState
from .objects import docker_epoch, visible_devices_env

L_NODE = LABEL_PREFIX + "node"
#: on a stopped service: its task was told to stop and none may run until it is started again
L_STOPPED = LABEL_PREFIX + "stopped"
#: a constraint no node meets: how a service is stopped with its ended task kept (scaling to 0
#: would delete the task, and with it the exit code and the logs)
NOWHERE = "node.labels.org.gpulab.nowhere==true"
#: task states in which a task has not ended (it runs, or is on its way to)
LIVE = frozenset(
    {"new", "pending", "assigned", "accepted", "ready", "preparing", "starting", "running"}
)
#: seconds a new task may take to start (its node pulls the image first)
START_TIMEOUT = 600.0
#: the kind label of the GPU agent's service
GPU_AGENT_KIND = "gpu-agent"
#: on the GPU agent's service: a digest of the spec gpulab asked for (unchanged: no update)
L_SPEC = LABEL_PREFIX + "spec"
#: seconds a helper may run (a pull of a big dataset) before it is given up
HELPER_TIMEOUT = 3600.0
#: on a Swarm secret that holds a helper's file (``HelperSpec.files``): the name of the helper
#: service it was made for (the service that may take it away with itself)
L_SECRET_OF = LABEL_PREFIX + "secret-of"
#: seconds a helper's secret must have existed, referenced by no service, before a sweep
#: removes it: a helper being started makes its secrets a moment before its service
HELPER_SECRET_GRACE = 60.0


def service_spec(spec: WorkloadSpec, runner_config: dict | None, network_id: str | None) -> dict:
    """The Swarm service that runs ``spec`` (pure: tested without an engine).

    The task is pinned to ``spec.node``; GPUs reach it as NVIDIA_VISIBLE_DEVICES (Swarm has
    no device requests: nodes run the nvidia runtime by default), ``void`` when it booked
    none; /dev/shm is a tmpfs of ``shm_size``; every capability is dropped."""
    env = {**spec.env, **visible_devices_env(spec.gpu_ids)}
    mounts = [
        {
            "Type": "volume",
            "Source": m.volume,
            "Target": m.target,
            "ReadOnly": m.read_only,
            # a shared dataset copy missing on the node is mounted empty, never filled from
            # the image (as ``nocopy`` on one engine)
            **({"VolumeOptions": {"NoCopy": True}} if m.no_copy else {}),
        }
        for m in spec.mounts
    ]
    mounts.append(
        {"Type": "tmpfs", "Target": "/dev/shm", "TmpfsOptions": {"SizeBytes": spec.shm_size}}
    )
    if spec.read_only:  # the runner and most tools need a writable /tmp
        mounts.append(
            {
                "Type": "tmpfs",
                "Target": "/tmp",
                "TmpfsOptions": {"SizeBytes": spec.tmp_size, "Mode": 0o1777},
            }
        )
    command = list(spec.command)
    container: dict = {
        "Image": spec.image,
        "Env": [f"{k}={v}" for k, v in env.items()],
        "Labels": dict(spec.labels),
        "User": spec.user,
        "Mounts": mounts,
        "StopGracePeriod": int(spec.stop_grace * 1e9),
        "CapabilityDrop": ["ALL"],
        **({"ReadOnly": True} if spec.read_only else {}),
        **({"Dir": spec.working_dir} if spec.working_dir else {}),
        **({"Hostname": spec.hostname} if spec.hostname else {}),
    }
    if spec.runner:
        if runner_config is None:
            raise ValueError("a workload with the runner needs the runner's config")
        command = ["/bin/sh", RUNNER_PATH, *command]
        container["Configs"] = [
            {
                **runner_config,
                "File": {"Name": RUNNER_PATH, "UID": "0", "GID": "0", "Mode": 0o444},
            }
        ]
    # Args, not Command: the image's entrypoint stays, as with ``docker create``'s command
    container["Args"] = command
    labels = {**spec.labels, L_NODE: spec.node}
    task: dict = {
        "ContainerSpec": container,
        "Resources": {
            "Limits": {
                "NanoCPUs": int(spec.cpus * 1e9),
                "MemoryBytes": int(spec.memory),
                "Pids": int(spec.pids_limit),
            }
        },
        "RestartPolicy": {"Condition": "none", "MaxAttempts": 0},
        "Placement": {"Constraints": [f"node.hostname=={spec.node}"] if spec.node else []},
        "LogDriver": {
            "Name": "json-file",
            "Options": {"max-size": spec.log_max_size, "max-file": str(spec.log_max_files)},
        },
    }
    if network_id:
        task["Networks"] = [
            {"Target": network_id, **({"Aliases": list(spec.aliases)} if spec.aliases else {})}
        ]
    return {
        "Name": spec.name,
        "Labels": labels,
        "TaskTemplate": task,
        "Mode": {"Replicated": {"Replicas": 1}},
        # one task and no published port: no virtual IP (nor the kernel's IPVS) is needed;
        # the owner's other workloads reach it by its task address
        "EndpointSpec": {"Mode": "dnsrr"},
    }


def helper_service_spec(
    config: dict, node: str, secrets: Sequence[tuple[str, str, str]] = ()
) -> dict:
    """A helper (a ``HelperSpec``, as ``objects.helper_container_config`` makes it) as a
    one-task service on ``node``. Only named volumes travel: a filesystem store (host paths)
    is refused. ``secrets``: the Swarm's secrets (ID, name, file name) that hold the helper's
    secret files, each at ``HELPER_FILES_DIR/<file name>``, readable by its user only."""
    host = config["host_config"]
    mounts = []
    for source, bind in (host.get("binds") or {}).items():
        if source.startswith("/"):
            raise ValueError(
                "the filesystem store cannot be used on a Swarm (its directory is on the hub's "
                "host): configure an S3 store"
            )
        mounts.append(
            {
                "Type": "volume",
                "Source": source,
                "Target": bind["bind"],
                "ReadOnly": bind.get("mode") == "ro",
            }
        )
    env = config.get("environment") or {}
    task = {
        "ContainerSpec": {
            "Image": config["image"],
            "Args": list(config["command"]),
            "Env": [f"{k}={v}" for k, v in env.items()],
            "Labels": dict(config.get("labels") or {}),
            "User": config.get("user") or "1000:100",
            "Mounts": mounts,
            "CapabilityDrop": ["ALL"],
            **_helper_secrets(config.get("user") or "1000:100", secrets),
        },
        "RestartPolicy": {"Condition": "none", "MaxAttempts": 0},
        "Placement": {"Constraints": [f"node.hostname=={node}"] if node else []},
    }
    # the sync helper: the node's own network, as on one host (the store endpoint is the
    # operator's, the helper runs no user code). A helper on a network (a git clone, whose
    # URL is the user's: their overlay) joins it; one that asks for the default bridge gets
    # the node's default bridge, where a task with no network is put
    network = host.get("network_mode", "host")
    if network == "host":
        task["Networks"] = [{"Target": "host"}]
    elif network not in ("bridge", "default"):
        task["Networks"] = [{"Target": network}]
    limits = {
        k: int(host[h])
        for k, h in (("MemoryBytes", "mem_limit"), ("Pids", "pids_limit"))
        if host.get(h)
    }
    if limits:
        task["Resources"] = {"Limits": limits}
    labels = {**(config.get("labels") or {}), L_NODE: node}
    return {
        "Name": config.get("name") or "",
        "Labels": labels,
        "TaskTemplate": task,
        "Mode": {"Replicated": {"Replicas": 1}},
    }


def gpu_agent_spec(
    name: str, image: str, interval: float, instance: str, own_node_id: str, version: str
) -> dict:
    """The GPU agent (pure): a global service, one task on every node but the manager the
    service runs beside (which takes no workloads), that prints its node's GPUs' usage every
    ``interval`` seconds (:mod:`gpulab.gpus.agent`). It gets every GPU of its node for
    reading only (the NVIDIA runtime's ``utility`` capability: NVML, no compute), runs as
    nobody on a read-only root file system with no capability and no mount, within small
    limits, restarted when it ends. ``Labels`` carry a digest of the rest (:data:`L_SPEC`),
    so that an unchanged agent is never updated."""
    labels = {L_INSTANCE: instance, L_KIND: GPU_AGENT_KIND, LABEL_PREFIX + "version": version}
    task = {
        "ContainerSpec": {
            "Image": image,
            # the image's entrypoint is gpulab-sync: the agent is another program of it
            "Command": ["python", "-m", "gpulab.gpus.agent"],
            "Args": ["--interval", f"{interval:g}"],
            "Env": [
                "GPULAB_NODE={{.Node.Hostname}}",
                "NVIDIA_VISIBLE_DEVICES=all",
                "NVIDIA_DRIVER_CAPABILITIES=utility",
            ],
            "Labels": dict(labels),
            "User": "65534:65534",
            "ReadOnly": True,
            "CapabilityDrop": ["ALL"],
            "Mounts": [],
            "StopGracePeriod": int(5e9),
        },
        "Resources": {"Limits": {"NanoCPUs": int(0.2e9), "MemoryBytes": 128 * 1024**2, "Pids": 32}},
        "RestartPolicy": {"Condition": "any", "Delay": int(10e9)},
        "Placement": {"Constraints": [f"node.id!={own_node_id}"] if own_node_id else []},
        "LogDriver": {"Name": "json-file", "Options": {"max-size": "1m", "max-file": "2"}},
    }
    body = {"Name": name, "TaskTemplate": task, "Mode": {"Global": {}}}
    digest = hashlib.sha256(json.dumps([body, labels], sort_keys=True).encode()).hexdigest()
    return {**body, "Labels": {**labels, L_SPEC: digest[:16]}}


def _helper_secrets(user: str, secrets: Sequence[tuple[str, str, str]]) -> dict:
    if not secrets:
        return {}
    uid, _, gid = user.partition(":")
    return {
        "Secrets": [
            {
                "SecretID": sid,
                "SecretName": name,
                "File": {"Name": fname, "UID": uid or "0", "GID": gid or "0", "Mode": 0o400},
            }
            for sid, name, fname in secrets
        ]
    }


def helper_secret_labels(labels: dict[str, str], service: str) -> dict[str, str]:
    """The labels of the secrets made for the helper service ``service``: the helper's own
    (its instance, its kind, its workload) and the service's name (:data:`L_SECRET_OF`)."""
    return {**labels, L_SECRET_OF: service}


def referenced_secrets(service: dict) -> list[str]:
    """The IDs of the secrets a service's spec hands its tasks."""
    container = ((service.get("Spec") or {}).get("TaskTemplate") or {}).get("ContainerSpec") or {}
    return [s["SecretID"] for s in container.get("Secrets") or [] if s.get("SecretID")]


def made_for(secret: dict, service: dict) -> bool:
    """Whether gpulab made ``secret`` for ``service`` (pure): both of the same instance, and
    the secret labelled with the service's name. A secret that someone else attached to it
    is not its to take away."""
    spec = service.get("Spec") or {}
    labels = (secret.get("Spec") or {}).get("Labels") or {}
    instance = (spec.get("Labels") or {}).get(L_INSTANCE, "")
    return (
        bool(instance)
        and labels.get(L_INSTANCE) == instance
        and labels.get(L_SECRET_OF) == spec.get("Name")
    )


def helper_secret_of(secret: dict, instance: str) -> bool:
    """Whether ``secret`` holds a file of one of ``instance``'s helpers (pure): labelled with
    the instance and with the helper service it was made for (or, made before that label, with
    the helpers' kind ``sync-helper``: sync and git clone helpers alike)."""
    labels = (secret.get("Spec") or {}).get("Labels") or {}
    return (
        bool(instance)
        and labels.get(L_INSTANCE) == instance
        and (L_SECRET_OF in labels or labels.get(L_KIND) == "sync-helper")
    )


def engine_time(stamp: str) -> float | None:
    """An engine's RFC 3339 time ('Z' or an offset, up to nanoseconds) as epoch seconds;
    None for its zero time or what does not read as a time."""
    if not stamp or stamp.startswith("0001-"):
        return None
    try:
        return datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return None


def leftover_helper_secrets(
    secrets: Iterable[dict],
    services: Iterable[dict],
    instance: str,
    now: float,
    grace: float = HELPER_SECRET_GRACE,
) -> list[dict]:
    """The secrets of ``instance``'s helpers that a sweep removes (pure): those that no
    service references (their helper died before it made its service, or after its service
    went without them) and that were made at least ``grace`` seconds before ``now`` (the
    manager's clock: a helper being started has made its secrets a moment before its
    service). Another's secrets, and one whose age cannot be read, stay."""
    used = {sid for svc in services for sid in referenced_secrets(svc)}
    out = []
    for s in secrets:
        made = engine_time(s.get("CreatedAt") or "")
        if not helper_secret_of(s, instance) or s.get("ID") in used or made is None:
            continue
        if now - made >= grace:
            out.append(s)
    return out


def task_state(tasks: list[dict], node: dict | None, stopped: bool = False) -> WorkloadState:
    """What a one-task service's tasks say (pure). ``node``: the node it is pinned to, as the
    manager reports it (None: not in the cluster any more). ``stopped``: the service was
    stopped (its replacement task waits, unplaceable, and says nothing)."""
    hostname = (node or {}).get("Description", {}).get("Hostname", "")
    if stopped:
        tasks = [t for t in tasks if (t.get("Status") or {}).get("State") not in ("new", "pending")]
        if not tasks:
            return WorkloadState(running=False, node=hostname, error="stopped")
    newest = max(tasks, key=lambda t: (t.get("CreatedAt") or "", t.get("ID") or ""), default=None)
    status = (newest or {}).get("Status") or {}
    state = status.get("State", "")
    cstatus = status.get("ContainerStatus") or {}
    started = docker_epoch((newest or {}).get("CreatedAt") or "")
    # only a node that is down or drained loses its work: "unknown" and "disconnected" are
    # what a new manager leader or a missed heartbeat says for a while of healthy nodes
    node_ok = (
        node is not None
        and (node.get("Status") or {}).get("State") != "down"
        and (node.get("Spec") or {}).get("Availability") == "active"
    )
    if newest is not None and state in ("complete", "failed") and "ExitCode" in cstatus:
        return WorkloadState(
            running=False,
            exit_code=int(cstatus["ExitCode"]),
            started_at=started,
            node=hostname,
            error=status.get("Err") or "",
        )
    if not node_ok:
        why = "not in the cluster" if node is None else _node_trouble(node)
        return WorkloadState(running=False, started_at=started, node=hostname, error=why, lost=True)
    if newest is None:
        return WorkloadState(running=True, node=hostname)  # being scheduled
    desired = newest.get("DesiredState", "running")
    if state in LIVE and desired in ("running", "ready", "accepted"):
        return WorkloadState(running=True, started_at=started, node=hostname)
    if state == "shutdown" and "ExitCode" in cstatus:
        code = int(cstatus["ExitCode"])
        return WorkloadState(running=False, exit_code=code, started_at=started, node=hostname)
    if state in LIVE:  # told to stop and not there yet
        return WorkloadState(running=True, started_at=started, node=hostname)
    return WorkloadState(
        running=False,
        started_at=started,
        node=hostname,
        error=status.get("Err") or f"task {state or 'unknown'}",
    )


def _node_trouble(node: dict) -> str:
    name = (node.get("Description") or {}).get("Hostname", "?")
    st = (node.get("Status") or {}).get("State", "unknown")
    avail = (node.get("Spec") or {}).get("Availability", "unknown")
    if st != "ready":
        return f"node {name} is {st}"
    return f"node {name} is {avail}"


__all__ = [
    "HELPER_SECRET_GRACE",
    "GPU_AGENT_KIND",
    "HELPER_TIMEOUT",
    "L_SECRET_OF",
    "L_NODE",
    "L_SPEC",
    "L_STOPPED",
    "LIVE",
    "NOWHERE",
    "START_TIMEOUT",
    "engine_time",
    "helper_secret_labels",
    "helper_secret_of",
    "gpu_agent_spec",
    "helper_service_spec",
    "leftover_helper_secrets",
    "made_for",
    "referenced_secrets",
    "service_spec",
    "task_state",
]
