"""The notebook's container, as one :class:`~gpulab.runtime.base.WorkloadSpec` (pure).

Built once per start from the notebook's options, its placement (GPUs, node, network) and
what the hub tells its single-user server (environment, command, URL path, port); the
:class:`~gpulab.runtime.base.Runtime` runs it, on one host and on a Swarm alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..gpus.inventory import device_id
from ..gpus.sharing import is_fraction, share_environment
from ..names import L_NETWORK, L_PORT, L_ROUTE, workload_labels
from ..resources import Resources, container_limits
from ..runtime.base import Mount, WorkloadSpec

#: environment keys a GPU share sets (a previous start's share must not leak into the next)
SHARE_ENV_PREFIXES = ("GPULAB_GPU_FRACTION",)


@dataclass(frozen=True)
class ContainerPolicy:
    """What the configuration says of every notebook container (GpulabSettings)."""

    instance: str
    workspace_dir: str
    pids_limit: int
    shm_fraction: float
    activity_report_interval: float
    log_max_size: str
    log_max_files: int
    #: each user's notebooks join a network of their own (network_isolation "user")
    isolated: bool


@dataclass(frozen=True)
class HubSide:
    """What JupyterHub gives the single-user server: environment, command, URL path, port."""

    env: Mapping[str, str]
    #: the server's command and its arguments (the command: the image's own when empty)
    command: Sequence[str]
    args: Sequence[str]
    base_url: str
    port: int
    user: str  # the uid (or uid:gid) it runs as


def notebook_mounts(
    volume_name: str,
    workspace_dir: str,
    data_mounts: Sequence[tuple[str, str, bool]],
    home: tuple[str, str] | None = None,
    no_copy: frozenset[str] = frozenset(),
) -> list[Mount]:
    """The workspace volume, the home's ((volume, home dir), where homes are kept) and the
    user's data volumes ((volume, mount, read-only)); ``no_copy``: the volumes never filled
    from the image (the dataset cache's copies).

    A new, empty home volume is filled by the engine with what the image has at the home dir
    (its .bashrc, .profile: Docker copies an image's directory into an empty named volume at
    its first mount; a Swarm task's volume mount does the same), once: a home pulled from
    object storage, or used before, is not empty, and keeps the user's own versions."""
    return [
        Mount(volume_name, workspace_dir, False),
        *([Mount(home[0], home[1], False)] if home else []),
        *(Mount(v, target, ro, v in no_copy) for v, target, ro in data_mounts),
    ]


def notebook_spec(
    *,
    policy: ContainerPolicy,
    hub: HubSide,
    name: str,
    image: str,
    user: str,
    server: str,
    workload_id: str,
    resources: Resources,
    gpu_ids: Sequence[str],
    mounts: Sequence[Mount],
    network_id: str,
    node: str,
    image_command: Sequence[str] | None = None,
) -> WorkloadSpec:
    """The notebook's workload: the hardened limits, the GPUs (whole, or a share of a shared
    one: the device, and its share as advice, GPULAB_GPU_FRACTION), labels (with what a
    gateway needs to put its route back), environment and its named volumes (never a host
    path).

    ``image_command``: the image's own command, run when the hub names none (None: unknown,
    then JupyterHub's ``jupyterhub-singleuser``)."""
    share_env = share_environment(resources.gpus) if is_fraction(resources.gpus) and gpu_ids else {}
    limits = container_limits(resources, policy.pids_limit, policy.shm_fraction)
    kept = {k: v for k, v in hub.env.items() if not k.startswith(SHARE_ENV_PREFIXES)}
    env = {
        **kept,
        **share_env,
        # how often the notebook server reports its activity to the hub (the idle stop's input)
        "JUPYTERHUB_ACTIVITY_INTERVAL": str(policy.activity_report_interval),
    }
    labels = {
        **workload_labels(policy.instance, "notebook", user, workload_id, gpu_ids, server=server),
        # what a gateway needs to put the route back (SwarmRuntime.restore_routes)
        L_ROUTE: hub.base_url,
        L_NETWORK: network_id,
        L_PORT: str(hub.port),
    }
    return WorkloadSpec(
        name=name,
        image=image,
        command=[*(hub.command or image_command or ["jupyterhub-singleuser"]), *hub.args],
        env=env,
        labels=labels,
        user=hub.user,
        cpus=resources.cpus,
        memory=limits.mem_limit,
        pids_limit=limits.pids_limit,
        shm_size=limits.shm_size,
        gpu_ids=[device_id(g) for g in gpu_ids],
        mounts=list(mounts),
        network_owner=user if policy.isolated else None,
        node=node,
        log_max_size=policy.log_max_size,
        log_max_files=policy.log_max_files,
        runner=False,
        ports=(hub.port,),
    )
