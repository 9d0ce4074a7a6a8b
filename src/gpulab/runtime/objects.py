"""Pure builders of what gpulab sends to the container engine (tested without an engine).

Every container carries labels from which any process can rebuild its view of the world after
a restart: who owns it, what kind of workload it is, which workload, which GPUs.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Mapping, Sequence

from ..resources import CPU_PERIOD, MIN_CPU_QUOTA, ContainerLimits
from .base import HELPER_FILES_DIR, RUNNER_PATH, HelperSpec, WorkloadSpec

#: NVIDIA_VISIBLE_DEVICES of a container that booked no GPU: the NVIDIA runtime and its hook
#: hand it none, whatever its image says (every CUDA base image sets ``all``)
NO_GPU = "void"


def visible_devices_env(gpu_ids: Sequence[str]) -> dict[str, str]:
    """The environment that tells the NVIDIA runtime exactly which GPUs a container gets:
    the IDs it booked, or none (``void``). A container's own environment overrides its
    image's, so an image's ``ENV NVIDIA_VISIBLE_DEVICES=all`` gives it nothing more."""
    return {
        "NVIDIA_VISIBLE_DEVICES": ",".join(gpu_ids) if gpu_ids else NO_GPU,
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
    }


def gpu_request(gpu_ids: Sequence[str], mode: str) -> tuple[dict, dict[str, str]]:
    """(extra host config, extra environment) that hand exactly ``gpu_ids`` to a container,
    and nothing to a container that booked none, in every mode.

    'device_request': Docker DeviceRequest with driver nvidia, capability gpu, explicit IDs,
    for a container with GPUs. 'env': no request: the NVIDIA runtime, the engine's default,
    reads the environment. Either way the environment names the devices (``void`` for none):
    on a host whose default runtime is nvidia an image's ``NVIDIA_VISIBLE_DEVICES=all`` would
    otherwise hand a CPU workload every GPU of the host.
    """
    if mode not in ("device_request", "env"):
        raise ValueError(f"unknown gpu mode {mode!r}")
    env = visible_devices_env(gpu_ids)
    if mode == "env" or not gpu_ids:
        return {}, env
    req = {
        "Driver": "nvidia",
        "DeviceIDs": list(gpu_ids),
        "Capabilities": [["gpu"]],
    }
    return {"device_requests": [req]}, env


def _is_nvidia(name: str, runtime: Mapping | None) -> bool:
    path = str((runtime or {}).get("path") or "")
    return name == "nvidia" or path.rsplit("/", 1)[-1].startswith("nvidia-container-runtime")


def gpu_delivery_refusal(
    mode: str,
    gpus: int,
    runtimes: Mapping[str, Mapping | None],
    default_runtime: str,
    swarm: bool = False,
) -> str | None:
    """Why an engine with these runtimes (``docker info``: ``Runtimes``, ``DefaultRuntime``)
    cannot hand ``gpus`` booked GPUs to containers in ``mode``, and what to configure; None
    when it can (or there is no GPU to hand out).

    'env' needs the NVIDIA runtime as the engine's default: nothing else reads
    NVIDIA_VISIBLE_DEVICES, and a GPU workload would run without its GPUs while the ledger
    books them. 'device_request' needs the engine's nvidia device driver, which Docker has
    when the NVIDIA Container Toolkit is installed (nvidia-container-runtime-hook on dockerd's
    PATH); ``docker info`` does not list drivers, so the toolkit's registered nvidia runtime
    is what shows it (``nvidia-ctk runtime configure``, part of installing the toolkit).

    ``swarm``: the engine is a Swarm node's, asked in mode 'env' (a Swarm service has no
    device requests: its tasks get their GPUs by NVIDIA_VISIBLE_DEVICES alone), so the way out
    is the NVIDIA runtime as its default, not another gpu_mode."""
    if gpus <= 0:
        return None
    listed = ", ".join(sorted(runtimes)) or "none"
    nvidia = sorted(n for n, r in runtimes.items() if _is_nvidia(n, r))
    if mode == "env":
        if _is_nvidia(default_runtime, runtimes.get(default_runtime)):
            return None
        has = (
            f"it has the {nvidia[0]!r} runtime, but not as its default"
            if nvidia
            else "it has no NVIDIA runtime"
        )
        return (
            f"gpu_mode 'env' hands GPUs out with NVIDIA_VISIBLE_DEVICES, which only the NVIDIA "
            f"runtime reads, and the engine's default runtime is {default_runtime or '?'!r} "
            f"({has}; runtimes: {listed}). Install the NVIDIA Container Toolkit and make it "
            "the default (nvidia-ctk runtime configure --runtime=docker --set-as-default, "
            "then restart dockerd)"
            + (
                " on that node: a Swarm service has no device requests"
                if swarm
                else ", or use gpu_mode 'device_request'"
            )
        )
    if mode == "device_request":
        if nvidia:
            return None
        return (
            "gpu_mode 'device_request' asks the engine for devices of driver 'nvidia', which "
            "Docker has only with the NVIDIA Container Toolkit (nvidia-container-runtime-hook "
            f"on dockerd's PATH), and the engine lists no NVIDIA runtime (runtimes: {listed}). "
            "Install the toolkit and register it (nvidia-ctk runtime configure "
            "--runtime=docker), then restart dockerd"
        )
    raise ValueError(f"unknown gpu mode {mode!r}")


def limits_host_config(limits: ContainerLimits) -> dict:
    """Keyword arguments for docker's ``create_host_config`` that enforce ``limits``."""
    return {
        "cpu_period": limits.cpu_period,
        "cpu_quota": limits.cpu_quota,
        "mem_limit": limits.mem_limit,
        # no extra swap beyond the memory limit
        "memswap_limit": limits.mem_limit,
        "pids_limit": limits.pids_limit,
        "shm_size": limits.shm_size,
    }


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


def helper_container_config(spec: HelperSpec) -> dict:
    """Keyword arguments for ``create_container`` of a helper (pure): its named volumes and
    host directories bound, its network, its limits, hardened like every user container."""
    binds = {
        m.volume: {"bind": m.target, "mode": "ro" if m.read_only else "rw"} for m in spec.mounts
    }
    for host, (inside, read_only) in spec.host_dirs.items():
        binds[host] = {"bind": inside, "mode": "ro" if read_only else "rw"}
    limits = {k: v for k, v in (("mem_limit", spec.memory), ("pids_limit", spec.pids_limit)) if v}
    return {
        "image": spec.image,
        "command": list(spec.command),
        "labels": dict(spec.labels),
        # a helper never has a GPU, whatever its image says (visible_devices_env)
        "environment": {**spec.env, "NVIDIA_VISIBLE_DEVICES": NO_GPU},
        "user": spec.user,
        "host_config": {
            "binds": binds,
            "network_mode": spec.network,
            "auto_remove": False,
            **limits,
            **hardened_host_config(),
        },
    }


def helper_files_archive(spec: HelperSpec) -> bytes:
    """A helper's secret files as a tar archive to unpack at ``/`` of its created container
    (pure): ``HELPER_FILES_DIR`` (0700) and each file (0400), owned by the helper's user."""
    uid, _, gid = spec.user.partition(":")
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:

        def entry(name: str, kind: bytes, mode: int, size: int = 0) -> tarfile.TarInfo:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.size = kind, mode, size
            info.uid, info.gid = int(uid or 0), int(gid or 0)
            return info

        top = HELPER_FILES_DIR.strip("/")
        tar.addfile(entry(top, tarfile.DIRTYPE, 0o700))
        for name, content in sorted(spec.files.items()):
            if not name or "/" in name or name in (".", ".."):
                raise ValueError(f"a helper's file needs a plain name, not {name!r}")
            tar.addfile(
                entry(f"{top}/{name}", tarfile.REGTYPE, 0o400, len(content)), io.BytesIO(content)
            )
    return out.getvalue()


def workload_container_config(spec: WorkloadSpec, gpu_mode: str, runner: str) -> dict:
    """Keyword arguments for ``create_container`` of a workload on one Docker engine.

    With ``spec.runner``, PID 1 is gpulab's runner (``runner``: its path on this host, mounted
    read-only), which runs the command and can run it again in place after a hang. The
    workload joins its owner's network (only that one; the caller puts the network's ID in
    ``network_mode``), or the engine's default bridge when ``spec.network_owner`` is None.
    """
    gpu_host, gpu_env = gpu_request(spec.gpu_ids, gpu_mode)
    limits = limits_host_config(
        ContainerLimits(
            cpu_period=CPU_PERIOD,
            cpu_quota=max(MIN_CPU_QUOTA, round(spec.cpus * CPU_PERIOD)),
            mem_limit=spec.memory,
            pids_limit=spec.pids_limit,
            shm_size=spec.shm_size,
        )
    )
    # a list, not a dict by volume: one volume may be mounted at two paths (the dataset
    # cache's one copy of a prefix a workload mounts twice)
    binds = [
        f"{m.volume}:{m.target}:{'ro' if m.read_only else 'rw'}{',nocopy' if m.no_copy else ''}"
        for m in spec.mounts
    ]
    command = list(spec.command)
    if spec.runner:
        binds.append(f"{runner}:{RUNNER_PATH}:ro")
        command = ["/bin/sh", RUNNER_PATH, *command]
    extra_host = {"network_mode": spec.network_owner} if spec.network_owner else {}
    ports = {}
    if spec.ports:
        ports = {"ports": list(spec.ports)}
        if not (spec.network_owner or spec.network_job):  # on the default bridge
            extra_host["port_bindings"] = {p: ("127.0.0.1",) for p in spec.ports}
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
        **ports,
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
