"""What gpulab asks of a Swarm manager, as data: the service of a workload, the service of a
sync helper, and what a service's tasks say of its workload. Pure functions (no engine), used
by :class:`~gpulab.runtime.swarm.SwarmRuntime` and tested on their own."""

from __future__ import annotations

from collections.abc import Sequence

from ..names import LABEL_PREFIX
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
#: seconds a helper may run (a pull of a big dataset) before it is given up
HELPER_TIMEOUT = 3600.0


def service_spec(spec: WorkloadSpec, runner_config: dict | None, network_id: str | None) -> dict:
    """The Swarm service that runs ``spec`` (pure: tested without an engine).

    The task is pinned to ``spec.node``; GPUs reach it as NVIDIA_VISIBLE_DEVICES (Swarm has
    no device requests: nodes run the nvidia runtime by default), ``void`` when it booked
    none; /dev/shm is a tmpfs of ``shm_size``; every capability is dropped."""
    env = {**spec.env, **visible_devices_env(spec.gpu_ids)}
    mounts = [
        {"Type": "volume", "Source": m.volume, "Target": m.target, "ReadOnly": m.read_only}
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
    "HELPER_TIMEOUT",
    "L_NODE",
    "L_STOPPED",
    "LIVE",
    "NOWHERE",
    "START_TIMEOUT",
    "helper_service_spec",
    "service_spec",
    "task_state",
]
