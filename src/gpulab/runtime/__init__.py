"""The one place gpulab talks to a container engine: :class:`~.base.Runtime` and its backends.

:func:`make_runtime` picks the backend from one setting (``GpulabSettings.runtime``).
"""

from __future__ import annotations

from pathlib import Path

from ..gpus.inventory import read_inventory
from .base import EngineError, Runtime
from .objects import gpu_delivery_refusal
from .pools import (
    DEFAULT_USERS,
    DOCKER_DEFAULT_POOLS,
    POOLS_FIX,
    pool_capacity,
    pool_room,
    pools_warning,
    users_counted,
)

#: gpu_delivery_refusal: the one rule of which engine runtimes can hand GPUs out in a gpu_mode
#: (the start-up check, and ``gpulab doctor`` on what ``Runtime.survey`` read); pool_room,
#: users_counted and pools_warning: the one rule of room in the address pools for a network per
#: user (the service's start-up warning, and the doctor's check)
__all__ = [
    "DEFAULT_USERS",
    "DOCKER_DEFAULT_POOLS",
    "POOLS_FIX",
    "EngineError",
    "Runtime",
    "gpu_delivery_refusal",
    "make_runtime",
    "pool_capacity",
    "pool_room",
    "pools_warning",
    "users_counted",
]

RUNNER = str(Path(__file__).resolve().parent / "job_runner.sh")


def make_runtime(settings, client=None) -> Runtime:
    """The backend the settings name. ``client``: a docker.APIClient to reuse, or a function
    that makes one on first use (the hub's: DockerSpawner's, from its engine settings); None:
    one made from the environment as ``docker.from_env`` does (DOCKER_HOST, DOCKER_TLS_VERIFY,
    DOCKER_CERT_PATH). An engine that does not answer when the client is made comes up as
    an EngineError of the call that needed it, never from here. One engine is given this
    host's GPUs, read once here (``gpu_devices``, else NVML when ``discover_gpus``): its
    ``nodes()`` and ``devices`` report them, its ``inventory`` says what was found (driver,
    CUDA) or why none. A Swarm reads each node's from its labels, as they change."""
    if settings.runtime == "swarm":
        if settings.network_isolation != "user":
            # on the nodes' default bridges the notebook gateway leads to every user's
            # notebooks and job ports: every workload and clone must be on its owner's overlay
            raise ValueError(
                "runtime = 'swarm' needs network_isolation = 'user' (each user's workloads "
                "on an overlay of their own), not " + repr(settings.network_isolation)
            )
        from .gateway import Gateway
        from .swarm import SwarmRuntime
        from .swarm_nodes import node_tls

        return SwarmRuntime(
            client,
            registry=settings.image_registry,
            gpu_label=settings.swarm_gpu_label,
            runner_script=Path(RUNNER).read_text(),
            gateway=Gateway.shared(
                settings.instance,
                settings.swarm_gateway_image,
                settings.swarm_gateway_port,
                settings.swarm_gateway_api_port,
            ),
            node_engine=settings.swarm_node_engine,
            node_tls=node_tls(
                settings.swarm_node_tls_ca,
                settings.swarm_node_tls_cert,
                settings.swarm_node_tls_key,
            ),
            node_engine_plain=settings.swarm_node_engine_plain,
            encrypted=settings.swarm_overlay_encryption,
            check_gpus=settings.check_gpu_runtime,
            gpu_agent_image=(
                (settings.swarm_gpu_agent_image or settings.sync_image)
                if settings.swarm_gpu_agent
                else ""
            ),
            gpu_agent_interval=settings.swarm_gpu_agent_interval,
        )
    from .docker import DockerRuntime

    return DockerRuntime(
        client,
        gpu_mode=settings.gpu_mode,
        runner_path=RUNNER,
        inventory=read_inventory(settings.gpu_devices, settings.discover_gpus),
        registry=settings.image_registry,
    )
