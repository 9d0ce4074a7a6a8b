"""Pure builders of what gpulab sends to the container engine (tested without an engine).

Every container carries labels from which any process can rebuild its view of the world after
a restart: who owns it, what kind of workload it is, which workload, which GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..datasync.filesystem import META_DIR
from ..resources import CPU_PERIOD, MIN_CPU_QUOTA, ContainerLimits
from .base import RUNNER_PATH, WorkloadSpec


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


def log_options(max_size: str, max_files: int) -> dict:
    """Host config that caps a container's log on disk: Docker's json-file driver, rotated at
    ``max_size`` (a Docker size such as ``10m``), keeping ``max_files`` files. Without it a
    chatty workload fills the host's disk, and reading its log back costs unbounded memory."""
    return {
        "log_config": {
            "type": "json-file",
            "config": {"max-size": max_size, "max-file": str(max_files)},
        }
    }


def filesystem_store_dirs(bucket: str, prefix: str) -> tuple[str, str]:
    """The two directories of a filesystem store (relative to its root) that a volume on
    ``bucket``/``prefix`` may touch: its objects and their sidecar metadata. An empty prefix
    (a grant on the whole bucket) gives the bucket's directories."""
    trimmed = prefix.strip("/")
    parts = trimmed.split("/") if trimmed else []
    if (
        not bucket
        or "/" in bucket
        or bucket.startswith(".")
        or any(p in ("", ".", "..") or "\x00" in p for p in [bucket, *parts])
    ):
        raise ValueError(f"unsafe store location {bucket!r}/{prefix!r}")
    rel = "/".join([bucket, *parts])
    return rel, f"{META_DIR}/{rel}"


def sync_helper_config(
    *,
    image: str,
    operation: str,
    bucket: str,
    prefix: str,
    mode: str,
    docker_volume: str | None,
    store_kind: str,
    store_root: str | None,
    endpoint_url: str | None,
    region: str,
    labels: dict[str, str],
    environment: dict[str, str],
    user: str = "1000:100",
    mirror: bool = False,
    max_bytes: int | None = None,
) -> dict:
    """Keyword arguments for ``create_container`` of a short-lived ``gpulab-sync`` helper.

    ``max_bytes``: a pull refuses a prefix whose objects weigh more than this together (what
    the owner's disk quota booked for the volume: :mod:`gpulab.disk_ledger`).

    ``mirror``: a pull also removes local files whose object was deleted since the volume's
    last sync (``--delete``; files changed locally are kept), for a volume that may be an older
    copy (a cluster node the workload left and came back to).

    The helper mounts the workload's volume at /data. For the embedded filesystem store it
    sees only what that volume may touch, never the store root: the volume's own directory
    ``<store_root>/<bucket>/<prefix>`` and its metadata directory
    ``<store_root>/.gpulab-meta/<bucket>/<prefix>`` (:func:`filesystem_store_dirs`), each
    bound at the same path under /store so that ``file:///store`` works unchanged. They are
    read-only unless the operation writes the store (a push of an rw/rwd volume, a purge).
    ``store_root`` must be the canonical path whose directories the caller has checked (see
    :func:`gpulab.workload_data.prepare_store_dirs`). The helper uses the host's
    network so that it reaches the same endpoints as the hub (a loopback endpoint included).
    It never runs user code.
    """
    command = [operation, "--bucket", bucket, "--prefix", prefix, "--json-progress"]
    binds: dict[str, dict] = {}
    if operation != "purge":
        command += ["--local", "/data", "--mode", mode]
        if mirror and operation == "pull":
            command.append("--delete")
        if max_bytes is not None and operation == "pull":
            command += ["--max-bytes", str(int(max_bytes))]
        if docker_volume is None:
            raise ValueError("pull and push need a volume")
        binds[docker_volume] = {"bind": "/data", "mode": "rw"}
    if store_kind == "filesystem":
        if not store_root:
            raise ValueError("a filesystem store needs its root")
        command += ["--store-endpoint", "file:///store"]
        writes = operation == "purge" or (operation == "push" and mode in ("rw", "rwd"))
        for rel in filesystem_store_dirs(bucket, prefix):
            host = f"{store_root.rstrip('/')}/{rel}"
            binds[host] = {"bind": f"/store/{rel}", "mode": "rw" if writes else "ro"}
    else:
        if endpoint_url:
            command += ["--store-endpoint", endpoint_url]
        command += ["--region", region]
    return {
        "image": image,
        "command": command,
        "labels": labels,
        "environment": environment,
        "user": user,
        "host_config": {
            "binds": binds,
            "network_mode": "host",
            "auto_remove": False,
            **hardened_host_config(),
        },
    }


def workload_container_config(spec: WorkloadSpec, gpu_mode: str, runner: str) -> dict:
    """Keyword arguments for ``create_container`` of a workload on one Docker engine.

    With ``spec.runner``, PID 1 is gpulab's runner (``runner``: its path on this host, mounted
    read-only), which runs the command and can run it again in place after a hang. The
    workload joins its owner's network (only that one; the caller puts the network's ID in
    ``network_mode``), or the engine's default bridge when ``spec.network_owner`` is None.
    """
    gpu_host, gpu_env = gpu_request(spec.gpu_ids, gpu_mode)
    limits = ContainerLimits(
        cpu_period=CPU_PERIOD,
        cpu_quota=max(MIN_CPU_QUOTA, round(spec.cpus * CPU_PERIOD)),
        mem_limit=spec.memory,
        pids_limit=spec.pids_limit,
        shm_size=spec.shm_size,
    ).host_config()
    binds = {
        m.volume: {"bind": m.target, "mode": "ro" if m.read_only else "rw"} for m in spec.mounts
    }
    command = list(spec.command)
    if spec.runner:
        binds[runner] = {"bind": RUNNER_PATH, "mode": "ro"}
        command = ["/bin/sh", RUNNER_PATH, *command]
    extra_host = {"network_mode": spec.network_owner} if spec.network_owner else {}
    if spec.read_only:  # the runner and most tools need a writable /tmp
        tmp = f"rw,nosuid,nodev,size={spec.tmp_size},mode=1777"
        extra_host = {**extra_host, "read_only": True, "tmpfs": {"/tmp": tmp}}
    return {
        "image": spec.image,
        "name": spec.name,
        "command": command,
        "environment": {**spec.env, **gpu_env},
        "labels": spec.labels,
        "user": spec.user,
        **({"working_dir": spec.working_dir} if spec.working_dir else {}),
        **({"hostname": spec.hostname} if spec.hostname else {}),
        "host_config": {
            "binds": binds,
            "auto_remove": False,
            **hardened_host_config(),
            **limits,
            **log_options(spec.log_max_size, spec.log_max_files),
            **gpu_host,
            **extra_host,
        },
    }


def docker_epoch(stamp: str) -> float | None:
    """Docker's RFC 3339 time (nanoseconds, 'Z') as epoch seconds; None for its zero time."""
    from datetime import datetime

    if not stamp or stamp.startswith("0001-"):
        return None
    head, _, frac = stamp.rstrip("Z").partition(".")
    try:
        base = datetime.fromisoformat(head + "+00:00").timestamp()
    except ValueError:
        return None
    return base + (float("0." + frac[:6]) if frac.isdigit() else 0.0)
