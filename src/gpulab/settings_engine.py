"""The admin's settings of the GPUs and the container engine: which GPUs there are and how
they reach a container (whole or shared), and the engine gpulab drives (one Docker host or a
Swarm). Part of :class:`~gpulab.settings.GpulabSettings` (configured as
``c.GpulabSettings.<name>``)."""

from __future__ import annotations

from traitlets import Bool, Dict, Enum, Integer, List, Unicode
from traitlets.config import Configurable


class EngineSettings(Configurable):
    """GPUs and the container engine (a base of GpulabSettings)."""

    gpu_devices = List(
        Dict(),
        default_value=[],
        help="""The GPUs of this host: a list of {id (index or UUID), model, memory}. Empty
        means discover them with NVML (nvidia-ml-py) when a driver is present.""",
    ).tag(config=True)

    gpu_mode = Enum(
        ["device_request", "env"],
        default_value="device_request",
        help="""How GPUs reach a container: 'device_request' (Docker DeviceRequest, driver nvidia,
        explicit device IDs; needs the NVIDIA container toolkit) or 'env' (NVIDIA_VISIBLE_DEVICES,
        for hosts whose default runtime is nvidia).""",
    ).tag(config=True)

    gpu_sharing = Dict(
        default_value={},
        help="""GPUs that notebooks may share, and into how many slots: {device: slots}, for
        example {"0": 4} (device 0 in quarters: notebooks may ask for 0.25, 0.5 or 0.75 of a
        GPU). A device is named by its ID (on every node of a cluster) or as "node/id". Slots
        are 2 to 16. A shared device is handed out whole only while no share of it is held,
        and no share of it while a whole-GPU workload holds it; jobs always take whole GPUs.
        Isolation is gpu_sharing_mode's. Empty (default): whole GPUs only.""",
    ).tag(config=True)

    gpu_sharing_mode = Enum(
        ["time-slicing", "mps"],
        default_value="time-slicing",
        help="""How the notebooks sharing a GPU share it. 'time-slicing' (default): each
        sharer is given the device as a whole GPU is; the driver time-slices their kernels and
        nothing isolates their memory (one sharer can take it all). 'mps': the sharers are
        NVIDIA MPS clients (the admin runs nvidia-cuda-mps-control on the host): each gets
        CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (its share of the compute) and
        CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (its share of the device's memory, from the
        inventory's memory) and the MPS pipe directory (mps_pipe_directory).""",
    ).tag(config=True)

    mps_pipe_directory = Unicode(
        "/tmp/nvidia-mps",
        help="""With gpu_sharing_mode 'mps': the MPS control daemon's pipe directory on the
        host (CUDA_MPS_PIPE_DIRECTORY); it is mounted at the same path into the containers
        that share a GPU, and only into those.""",
    ).tag(config=True)

    runtime = Enum(
        ["docker", "swarm"],
        default_value="docker",
        help="""The container engine gpulab drives. 'docker' (default): the one Docker engine
        of this host (DOCKER_HOST). 'swarm': a Docker Swarm cluster, through a manager's engine
        (DOCKER_HOST pointing at a manager): workloads run as services pinned to the node that
        gpulab's placement chose; each node's GPUs come from its node label
        ``org.gpulab.gpus`` (see swarm_gpu_label); images come from ``image_registry``.""",
    ).tag(config=True)

    image_registry = Unicode(
        "",
        help="""Registry prefix for images whose name has no registry, such as
        ``registry.example.com:5000/``: on a cluster every node pulls the images from it (the
        catalog keeps the short names). Empty: the names as they are (one host).""",
    ).tag(config=True)

    placement = Enum(
        ["pack", "spread"],
        default_value="pack",
        help="""Which node a workload goes to when several can take it. 'pack' (default): the
        node with the fewest free GPUs that still fit it, keeping whole nodes free for big
        requests. 'spread': the node with the most free GPUs (then the fewest workloads), for
        less contention.""",
    ).tag(config=True)

    swarm_gpu_label = Unicode(
        "org.gpulab.gpus",
        help="""Swarm node label that lists a node's GPUs (device IDs separated by commas, e.g.
        ``0,1,2,3`` or GPU UUIDs), set by the operator with ``docker node update --label-add``.
        A node without it offers no GPU (CPU workloads only).""",
    ).tag(config=True)

    swarm_gateway_port = Integer(
        8002,
        help="""On a Swarm: the port of the notebook gateway, published on the manager's
        127.0.0.1 only. The gateway is a configurable-http-proxy container on the manager,
        attached to each user's overlay, through which the hub (and its proxy) reach notebooks
        on the worker nodes (runtime/gateway.py). Pick a port free on the hub's host.""",
    ).tag(config=True)

    swarm_gateway_api_port = Integer(
        8003,
        help="On a Swarm: the notebook gateway's API port (127.0.0.1 of the manager only).",
    ).tag(config=True)

    swarm_gateway_image = Unicode(
        "gpulab/proxy:5.3.0",
        help="""On a Swarm: the image of the notebook gateway, on the manager's engine (built by
        ``scripts/build-images.sh proxy``; the upstream configurable-http-proxy image works
        too).""",
    ).tag(config=True)

    swarm_node_engine = Unicode(
        "tcp://{address}:2376",
        help="""On a Swarm: how the service reaches a node's own Docker engine, to exec into a
        job's container there (`gpulab job exec`, `gpulab job shell`, the job page's terminal:
        a manager's API has no exec). A URL template filled with the node's ``{address}`` (its
        Swarm address), ``{hostname}`` and ``{node_id}``. A node's engine port is root on that
        node for whoever reaches it: in production it must require TLS client certificates
        (dockerd --tlsverify) and the swarm_node_tls_* settings name the service's.""",
    ).tag(config=True)

    swarm_node_tls_ca = Unicode(
        "",
        help="""On a Swarm: CA certificate (PEM file) that the nodes' engines' certificates are
        checked against. Setting any swarm_node_tls_* turns TLS on (verified against the
        system's CAs without this one).""",
    ).tag(config=True)

    swarm_node_tls_cert = Unicode(
        "", help="On a Swarm: the service's TLS client certificate (PEM file) for nodes' engines."
    ).tag(config=True)

    swarm_node_tls_key = Unicode(
        "", help="On a Swarm: the key (PEM file, mode 0600) of swarm_node_tls_cert."
    ).tag(config=True)

    swarm_node_engine_plain = Bool(
        False,
        help="""On a Swarm: allow swarm_node_engine over TCP without a TLS client certificate.
        Off by default, and the service refuses to start without one: a node's engine port is
        root on that node for whoever reaches it, and every container on the node can reach
        the node's addresses. Turn it on in a lab only (the swarm lab does).""",
    ).tag(config=True)

    swarm_overlay_encryption = Bool(
        True,
        help="""On a Swarm: users' and distributed jobs' overlay networks encrypt their traffic
        between nodes (IPsec ESP, Docker's ``--opt encrypted``), so that nobody on the nodes'
        network reads or injects it. Needs the nodes' kernels' IPsec support (the xfrm and esp
        modules) and IP protocol 50 (ESP) open between nodes; turn it off where that is not
        available (a lab in containers). Applies to overlays made from then on: an existing
        overlay keeps what it was made with until it is removed (when its user's or job's last
        workload is gone).""",
    ).tag(config=True)

    discover_gpus = Bool(True, help="Discover GPUs with NVML when gpu_devices is empty.").tag(
        config=True
    )
