"""Settings shared by the hub's spawner and the gpulab service, as one traitlets Configurable.

Both processes read the same ``jupyterhub_config.py`` (``c.GpulabSettings.*``), so the catalog,
flavors, limits, GPU inventory and database are defined once.
"""

from __future__ import annotations

import logging
import math
import os
from functools import cached_property
from pathlib import Path

from traitlets import (
    Bool,
    Dict,
    Enum,
    Float,
    Integer,
    List,
    Set,
    TraitError,
    Unicode,
    Union,
    default,
    validate,
)
from traitlets.config import Config, Configurable, PyFileConfigLoader

from . import __version__
from .bounds import MAX_REQUEST_BODY
from .data.sync import check_stores
from .datasync.exclude import check_patterns as check_exclude_patterns
from .disk_quota import DEFAULT_DISK_QUOTA, DEFAULT_GIT_MAX_BYTES, disk_quota_for, parse_size
from .forwarded import DEFAULT_TRUSTED_PROXIES, trusted_networks
from .frameworks import Catalog
from .gpus.sharing import check_sharing, fraction_refusal, sharing_mode_refusal
from .idle import gpu_unused_timeout_for, idle_timeout_for
from .imagerefs import PULL_POLICIES, ImageRefError, check_patterns
from .live_push import check_interval, interval_for
from .notices import NotifyRules, check_host_patterns, check_networks
from .resources import (
    Flavor,
    Limits,
    Quota,
    Quotas,
    Resources,
    check_gpu_model,
    check_gpu_wait,
    check_idle_timeout,
    check_node_pool,
    effective_limits,
)
from .storage import DEFAULT_HOME_EXCLUDE, StorageConfig

DEFAULT_FRAMEWORKS = [
    {
        "id": "python",
        "title": "Python 3.11 (JupyterLab)",
        "versions": [{"id": "3.11", "image": "gpulab/python:3.11"}],
        "editors": ["jupyterlab", "vscode"],
    },
    {
        "id": "pytorch",
        "title": "PyTorch",
        "versions": [{"id": "2.13", "image": "gpulab/pytorch:2.13", "title": "2.13 (CPU build)"}],
        "editors": ["jupyterlab", "vscode"],
    },
    {
        "id": "tensorflow",
        "title": "TensorFlow",
        "versions": [
            {"id": "2.20", "image": "gpulab/tensorflow:2.20", "title": "2.20 (CPU build)"}
        ],
        "editors": ["jupyterlab", "vscode"],
    },
    {
        "id": "jax",
        "title": "JAX",
        "versions": [{"id": "0.7", "image": "gpulab/jax:0.7", "title": "0.7 (CPU build)"}],
        "editors": ["jupyterlab", "vscode"],
    },
]

DEFAULT_EDITORS = {
    "jupyterlab": {"title": "JupyterLab", "default_url": "/lab"},
    "vscode": {"title": "VS Code", "default_url": "/vscode/"},
}

DEFAULT_FLAVORS = [
    {"id": "cpu-small", "title": "CPU small: 1 CPU, 2 GiB", "cpus": 1, "memory": "2G"},
    {"id": "cpu-large", "title": "CPU large: 2 CPUs, 8 GiB", "cpus": 2, "memory": "8G"},
    {"id": "gpu-1", "title": "1 GPU, 2 CPUs, 8 GiB", "cpus": 2, "memory": "8G", "gpus": 1},
    {"id": "gpu-2", "title": "2 GPUs, 2 CPUs, 16 GiB", "cpus": 2, "memory": "16G", "gpus": 2},
]


class ConfigError(ValueError):
    """A setting that gpulab refuses; the message names it and says what is allowed."""


log = logging.getLogger(__name__)
#: the start-up warnings already logged by this process (settings are read more than once)
_warned: set[str] = set()


class GpulabSettings(Configurable):
    """What the admin configures once for the whole platform."""

    # --- the GPUs (which there are, how they reach a container, whole or shared) and the
    # container engine gpulab drives (one Docker host or a Swarm) ---

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
        for hosts whose default runtime is nvidia). In both, every container's environment
        names exactly the devices it booked (NVIDIA_VISIBLE_DEVICES=void when none), so that
        an image's NVIDIA_VISIBLE_DEVICES=all gives it nothing on an nvidia runtime.""",
    ).tag(config=True)

    check_gpu_runtime = Bool(
        True,
        help="""At start-up, ask the engine which runtimes it has (docker info) and refuse a
        gpu_mode that cannot hand out this host's GPUs: the service stops (and with it the
        hub that manages it), saying what to configure; the hub refuses GPU notebooks. On a
        Swarm each GPU node's own engine is asked instead (at swarm_node_engine), again every
        few minutes: a node that cannot hand its GPUs out (its default runtime is not the
        NVIDIA one), or whose engine does not answer, has its GPUs kept out of placement
        until it can, named in the log with what to configure; the other nodes work. Turn
        it off only for an engine whose GPUs reach containers in a way docker info does not
        show (no NVIDIA runtime registered, only the toolkit's hook on dockerd's PATH) or for
        made-up gpu_devices on an engine without GPUs (the tests).""",
    ).tag(config=True)

    gpu_sharing = Dict(
        default_value={},
        help="""GPUs that notebooks may share, and into how many slots: {device: slots}, for
        example {"0": 4} (device 0 in quarters: notebooks may ask for 0.25, 0.5 or 0.75 of a
        GPU). A device is named by its ID (on every node of a cluster) or as "node/id". Slots
        are 2 to 16. A shared device is handed out whole only while no share of it is held,
        and no share of it while a whole-GPU workload holds it; jobs always take whole GPUs.
        Sharers are not isolated (gpu_sharing_mode). Empty (default): whole GPUs only.""",
    ).tag(config=True)

    gpu_sharing_mode = Unicode(
        "time-slicing",
        help="""How the notebooks sharing a GPU share it: 'time-slicing', the one mode. Each
        sharer is given the device as a whole GPU is, and GPULAB_GPU_FRACTION (advice for its
        framework, which nothing enforces); the driver time-slices their kernels and nothing
        isolates them: a sharer can use all of the device's memory and compute. For isolation
        use MIG devices (each one is a GPU of its own in the inventory). 'mps' was removed (its
        limits were CUDA_MPS_* variables a user could unset, and nothing ran the MPS control
        daemon): a configuration that still says 'mps' stops the hub and the service at
        start-up, saying so. The setting stays so that such a configuration is refused
        rather than silently shared without limits.""",
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
        help="""On a Swarm: how the hub and the service reach a node's own Docker engine, for
        what a manager's API cannot do: exec into a job's container there (`gpulab job exec`,
        `gpulab job shell`, the job page's terminal), pull a user's image from a registry onto
        the node that runs it (with the user's credentials, for that pull only), and find,
        list and remove the node's volumes (the dataset cache, the removal of a workload's
        volumes). A URL template filled with the node's ``{address}`` (its
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

    swarm_gpu_agent = Bool(
        True,
        help="""On a Swarm: read each node's GPUs' usage (utilization, memory) with gpulab's GPU
        agent, a global service (``<instance>-gpu-agent``, one task on every node but the
        manager the service runs beside) that the service creates or updates at start-up and
        reads through the manager's service logs; hang detection, the idle-GPU policy, the
        jobs' and admin pages and /metrics then count the nodes' GPUs as on one host. Off: no
        GPU usage on a Swarm, and the service removes the agent at its start-up.""",
    ).tag(config=True)

    swarm_gpu_agent_image = Unicode(
        "",
        help="""On a Swarm: the GPU agent's image (``python -m gpulab.gpus.agent`` with
        nvidia-ml-py); empty: sync_image, which has both.""",
    ).tag(config=True)

    swarm_gpu_agent_interval = Float(
        10.0,
        min=1.0,
        help="""On a Swarm: seconds between two readings of a node's GPUs by its agent. A
        node's newest reading counts for three intervals and 10 s more; after that its GPUs'
        usage is unknown (never taken as idle) until the agent reads again.""",
    ).tag(config=True)

    discover_gpus = Bool(True, help="Discover GPUs with NVML when gpu_devices is empty.").tag(
        config=True
    )

    gpu_models = Dict(
        default_value={},
        help="""Each GPU's model, as users ask for it (a job's or a notebook's gpu_model):
        {device: model}, a device named as the GPU ledger names it ("0" on one host,
        "node/0" on a Swarm). It fills in or overrides NVML's name (give short names, such
        as {"0": "A100", "1": "T4"}); on a Swarm a node's label org.gpulab.gpu-model names
        the model of all its GPUs, which this setting overrides per device. A request matches
        a model by its name with case, spaces, hyphens and underscores folded, never a part
        of it. Empty (default): NVML's names, or the labels.""",
    ).tag(config=True)

    node_pools = List(
        Unicode(),
        default_value=[],
        help="""The node pools this host is in (one host; a Swarm node's pools are its label
        org.gpulab.pools, names separated by commas), for requests that ask for a node_pool.
        Names of letters, digits, '.', '_' and '-', compared without case. Empty (default):
        in no pool (a request for a pool is refused).""",
    ).tag(config=True)

    @validate("gpu_models")
    def _gpu_models(self, proposal):
        for key, model in proposal["value"].items():
            if not isinstance(key, str) or not isinstance(model, str):
                raise TraitError(f"gpu_models: {key!r}: {model!r} must map a device to a name")
            try:
                check_gpu_model(model, f"gpu_models: {key!r}")
            except ValueError as e:
                raise TraitError(str(e)) from None
        return proposal["value"]

    @validate("node_pools")
    def _node_pools(self, proposal):
        for name in proposal["value"]:
            try:
                check_node_pool(name, "node_pools")
            except ValueError as e:
                raise TraitError(str(e)) from None
        return proposal["value"]

    # --- the installation: where the hub listens and keeps its state (read by
    # jupyterhub_config.py once the site file is read), and who may log in ---

    data_dir = Unicode(
        "",
        help="""Directory of the installation's state: JupyterHub's database, cookie secret and
        proxy token, gpulab's database (unless database_url names another), the secrets key
        (secrets_key_file), the trial log-in's passwords and the embedded object store
        (objects/). Default: the environment's GPULAB_DATA_DIR, else data/ beside
        jupyterhub_config.py. Created at start-up if missing.""",
    ).tag(config=True)

    @default("data_dir")
    def _default_data_dir(self):
        return os.environ.get("GPULAB_DATA_DIR", "")

    bind_url = Unicode(
        "http://127.0.0.1:8000",
        help="""Where the hub's proxy listens for browsers and API clients (JupyterHub's
        bind_url). Default: http://127.0.0.1 on the environment's GPULAB_PORT, else 8000.
        Behind a TLS reverse proxy keep 127.0.0.1; 'http://0.0.0.0:8000' listens on every
        address of the host.""",
    ).tag(config=True)

    @default("bind_url")
    def _default_bind_url(self):
        return f"http://127.0.0.1:{os.environ.get('GPULAB_PORT', '8000')}"

    public_url = Unicode(
        "",
        help="""The URL users reach gpulab at when it is not bind_url, e.g.
        'https://gpulab.example.org/' behind a reverse proxy (JupyterHub's public_url: the
        hub's redirects and an OAuth provider's callback use it). Empty: bind_url.""",
    ).tag(config=True)

    hub_port = Integer(
        8081,
        help="""Port of the hub's own API (JupyterHub's hub_port). It listens on the Docker
        bridge's gateway only, where notebook containers reach it. Default: the environment's
        GPULAB_HUB_PORT, else 8081.""",
    ).tag(config=True)

    @default("hub_port")
    def _default_hub_port(self):
        return int(os.environ.get("GPULAB_HUB_PORT", "8081"))

    proxy_api_port = Integer(
        8001,
        help="""Port of the proxy's REST API on 127.0.0.1 (configurable-http-proxy's
        api_url). Default: the environment's GPULAB_PROXY_API_PORT, else 8001.""",
    ).tag(config=True)

    @default("proxy_api_port")
    def _default_proxy_api_port(self):
        return int(os.environ.get("GPULAB_PROXY_API_PORT", "8001"))

    service_port = Integer(
        10101,
        help="""Port of the gpulab service on 127.0.0.1; browsers reach it through the hub's
        proxy at /services/gpulab/. Default: the environment's GPULAB_SERVICE_PORT, else
        10101.""",
    ).tag(config=True)

    @default("service_port")
    def _default_service_port(self):
        return int(os.environ.get("GPULAB_SERVICE_PORT", "10101"))

    trusted_proxies = List(
        Unicode(),
        default_value=list(DEFAULT_TRUSTED_PROXIES),
        help="""Addresses or networks (CIDR) of the proxies whose X-Forwarded-For, -Proto and
        -Host the gpulab service believes: the hub's proxy (on 127.0.0.1) and a TLS front
        door in front of it (the shipped nginx site, deploy/nginx/gpulab.conf). The service
        walks the forwarded hops from the nearest one out while each is in this list, so the
        scheme and host a job's port app is told (X-Forwarded-Proto, -Host), and the cookies'
        Secure flag, come from the outermost trusted proxy, never from what a client claims.
        Default: loopback (127.0.0.1, ::1), for a front door on the hub's host; add the front
        door's address where it runs on another one (docs/https.md). Every process that can
        connect from a listed address is trusted like a proxy.""",
    ).tag(config=True)

    @validate("trusted_proxies")
    def _check_trusted_proxies(self, proposal):
        try:
            trusted_networks(proposal["value"])
        except ValueError as e:
            raise TraitError(f"c.GpulabSettings.trusted_proxies: {e}") from None
        return proposal["value"]

    @cached_property
    def trusted_proxy_networks(self) -> tuple:
        """:attr:`trusted_proxies` as networks (gpulab.forwarded)."""
        return trusted_networks(self.trusted_proxies)

    allow_any_identity = Bool(
        False,
        help="""Let the hub start with an authenticator other than the trial's shared password
        and ``allow_all = True``: every account the identity provider knows (an LDAP
        directory, an OAuth provider's whole user base) may then log in and use the GPUs.
        Off by default: the hub refuses to start so configured, and says to name who may log
        in instead (the authenticator's allowed_groups or allowed_users). Turn it on only
        when the identity provider itself holds nobody but your users.""",
    ).tag(config=True)

    admin_groups = Set(
        Unicode(),
        default_value=set(),
        help="""Groups whose members are gpulab admins: they get the gpulab-admin role
        (custom:gpulab:admin: every user's jobs and notebooks) and, with a real
        authenticator, the hub's admin flag. There a user's groups are those the
        authenticator reports at each log-in (the hub keeps them as its groups:
        Authenticator.manage_groups), so leaving the group in the directory takes the rights
        away at the next log-in; a user's name never makes an admin. The groups that
        per-group limits and quotas name (group_max_resources, group_job_quotas,
        group_disk_quotas) are the same groups. With the trial's shared
        password, the hub's own groups (JupyterHub.load_groups).""",
    ).tag(config=True)

    # --- the platform ---

    instance = Unicode(
        "gpulab",
        help="""Name of this gpulab installation. It prefixes container and volume names and is
        put on every container's labels, so several installations (or test runs) can share one
        engine without touching each other's workloads.""",
    ).tag(config=True)

    database_url = Unicode(
        "sqlite:///gpulab.sqlite",
        help="""SQLAlchemy URL of gpulab's own database (notebook history, GPU ledger, jobs).
        SQLite by default; PostgreSQL with a postgresql+psycopg:// URL (psycopg 3, pip install
        gpulab[postgres]; a bare postgresql:// asks SQLAlchemy for psycopg2, which gpulab does
        not install). Shared by the hub and the service.""",
    ).tag(config=True)

    frameworks = List(
        Dict(),
        default_value=DEFAULT_FRAMEWORKS,
        help="""The framework catalog: a list of {id, title, versions: [{id, image, title}],
        editors: [editor ids]}. The first version of each framework is its default.""",
    ).tag(config=True)

    editors = Dict(
        default_value=DEFAULT_EDITORS,
        help="""Editors by id: {title, default_url}; default_url is the path inside the notebook
        server the user is sent to. gpulab's images carry JupyterLab (/lab) and VS Code
        (code-server behind jupyter-server-proxy, /vscode/); a framework offers the editors its
        ``editors`` list names, the first being its default.""",
    ).tag(config=True)

    default_framework = Unicode(
        "", help="Framework preselected in the form and used when none is given (default: first)."
    ).tag(config=True)

    flavors = List(
        Dict(),
        default_value=DEFAULT_FLAVORS,
        help="""Resource flavors: a list of {id, title, cpus, memory ('8G'), gpus,
        idle_timeout, gpu_unused_timeout, gpu_wait, gpu_model, node_pool, sync_interval}.
        ``sync_interval`` (seconds, optional): the flavor's own sync_interval. ``idle_timeout``
        (seconds, optional): a
        notebook of this flavor with no kernel, terminal or editor activity for that long is
        stopped like a user stop (reason IDLE); 0 never stops it; absent: gpu_idle_timeout for
        flavors with GPUs, cpu_idle_timeout for the others. ``gpu_unused_timeout`` and
        ``gpu_wait`` (seconds, optional): the flavor's own gpu_unused_timeout and
        notebook_gpu_wait. ``gpu_model`` and ``node_pool`` (optional): the GPU model and node
        pool its notebooks and jobs run on (see gpu_models, node_pools); a request may repeat
        them, never ask for another.""",
    ).tag(config=True)

    notebook_gpu_wait = Float(
        600.0,
        help="""Seconds a notebook asking for GPUs may wait for them when none are free: it waits
        in the queue it shares with jobs (priority 50, then fair share, then since when), its
        place shown in the spawn's progress, until its turn comes, it is cancelled (its server
        stopped) or this time passes (then it fails with NO_GPU_AVAILABLE, saying it waited).
        0: it never waits (no GPU free now fails it at once). A flavor's own ``gpu_wait``
        wins for its notebooks. The hub's start timeout of such a notebook grows by the
        same time.""",
    ).tag(config=True)

    @validate("notebook_gpu_wait")
    def _notebook_gpu_wait(self, proposal):
        try:
            return check_gpu_wait(proposal["value"], "c.GpulabSettings.notebook_gpu_wait")
        except ValueError as e:
            raise TraitError(str(e)) from None

    gpu_idle_timeout = Float(
        3600.0,
        help="""Seconds without activity after which a notebook with GPUs is stopped like a user
        stop (workspace pushed, GPUs released, reason IDLE in its history), unless its flavor
        sets its own idle_timeout. 0 turns it off. Activity is what the notebook server reports
        to the hub (kernels, a cell that runs, terminals, the editor's use of the server). At
        least twice activity_report_interval.""",
    ).tag(config=True)

    cpu_idle_timeout = Float(
        0.0,
        help="""The same as gpu_idle_timeout for notebooks without GPUs: 0 (the default) never
        stops them for being idle.""",
    ).tag(config=True)

    gpu_unused_timeout = Float(
        0.0,
        help="""Seconds a notebook's GPUs may go unused before the notebook is stopped like a
        user stop (workspace pushed, GPUs released, reason IDLE with "its GPUs unused for ..."
        in its history), even while its kernel is open and reports activity: a policy for
        sites where GPUs are scarce. 0 (the default) turns it off; a flavor's own
        ``gpu_unused_timeout`` overrides it for that flavor's notebooks. Unused: under 1 %
        utilization (NVML, read by the gpulab service every idle_check_interval) on every one
        of its GPUs at every look since the clock started; a notebook whose GPUs cannot be
        read (no NVML, MIG devices, a Swarm node) is never stopped for it. Decided at the
        spawn and kept with the notebook, like idle times. At least twice
        idle_check_interval.""",
    ).tag(config=True)

    activity_report_interval = Integer(
        60,
        help="""Seconds between a notebook server's reports of its activity to the hub
        (JUPYTERHUB_ACTIVITY_INTERVAL in its environment; JupyterHub's own default is 300).
        The idle stop judges by these reports, so every idle time must be at least twice this.""",
    ).tag(config=True)

    idle_check_interval = Float(
        60.0,
        help="""Seconds between the gpulab service's checks for idle notebooks. A notebook is
        stopped at most this long after its idle time ran out.""",
    ).tag(config=True)

    default_flavor = Unicode("cpu-small", help="Flavor used when a request names none.").tag(
        config=True
    )

    max_resources = Dict(
        default_value={"cpus": 2, "memory": "16G", "gpus": 2},
        help="Most that one user's notebooks may hold together (STARTING, RUNNING and "
        "STOPPING ones): {cpus, memory, gpus}. GPUs also count against the user's GPU quota "
        "(job_quota), shared with their jobs.",
    ).tag(config=True)

    user_max_resources = Dict(
        default_value={},
        help="Per-user maximums, {username: {cpus, memory, gpus}}; they override group maximums.",
    ).tag(config=True)

    group_max_resources = Dict(
        default_value={},
        help="Per-group maximums, {group: {cpus, memory, gpus}}; a member gets the most "
        "generous of their groups.",
    ).tag(config=True)

    allowed_images = List(
        Unicode(),
        default_value=[],
        help="""Images outside the catalog that users may name with the `image` option.
        Empty by default: users choose from the catalog only.""",
    ).tag(config=True)

    image_registries = List(
        Unicode(),
        default_value=[],
        help="""Registries and repositories that users may run notebooks and jobs from, as
        patterns REGISTRY/REPOSITORY matched against the image's normalised name: `*` stops at
        a `/`, `**` does not (e.g. "ghcr.io/acme/*", "registry.example.org:5000/**"; Docker
        Hub's official images are "docker.io/library/NAME"). Each pattern names its registry
        without wildcards. A private image is pulled with the user's own gpulab secret
        (`image_pull_secret`). Empty by default: users run catalog images (and
        allowed_images) only.""",
    ).tag(config=True)

    @validate("image_registries")
    def _image_registries(self, proposal):
        try:
            return list(check_patterns(proposal["value"]))
        except ImageRefError as e:
            raise TraitError(str(e)) from None

    image_pull_policy = Enum(
        list(PULL_POLICIES),
        default_value="if-not-present",
        help="""When an image from a registry (image_registries) is pulled, unless the
        request says otherwise: "always" (at every start; layers already on the node are
        not fetched again), "if-not-present" (only when the node lacks the digest the
        registry names) or "never" (the node must hold it). Whatever the policy, gpulab asks
        the registry for the image's digest with the user's credentials at every start, and
        runs that digest: an image another user pulled is never run without the registry's
        consent.""",
    ).tag(config=True)

    image_max_bytes = Union(
        [Integer(), Unicode()],
        default_value="50G",
        help="""Most that one image from a registry may weigh ("50G", or bytes: its layers'
        download size as the registry announces them). A bigger pull is given up and its
        workload fails with IMAGE_PULL_FAILED naming the cap; the engine's image store is the
        host's disk, shared by every user.""",
    ).tag(config=True)

    @validate("image_max_bytes")
    def _check_image_max_bytes(self, proposal):
        try:
            if not parse_size(proposal["value"], "image_max_bytes"):
                raise ValueError("a size above 0")
        except ValueError as e:
            raise TraitError(f"c.GpulabSettings.image_max_bytes: {e}") from None
        return proposal["value"]

    @property
    def image_max_size(self) -> int:
        """:attr:`image_max_bytes` in bytes."""
        return int(parse_size(self.image_max_bytes, "image_max_bytes"))

    dataset_cache_max_bytes = Union(
        [Integer(), Unicode()],
        default_value="100G",
        help="""Most that the dataset cache may hold on one node ("100G", or bytes; 0 turns it
        off), over the service's jobs and the hub's notebooks together. A job's or a
        notebook's read-only volume whose store, bucket, prefix and content (every object's
        key, size and ETag) another workload already pulled to that node is mounted from
        that copy, read-only, instead of being pulled again; the least recently used copies
        that no container uses and no starting workload was handed are removed to make room.
        A dataset bigger than this is pulled into the workload's own volume, as without the
        cache. Users' disk quotas count a cached dataset as before, once per workload that
        mounts it.""",
    ).tag(config=True)

    @validate("dataset_cache_max_bytes")
    def _check_dataset_cache(self, proposal):
        if proposal["value"] in (0, "0"):
            return 0  # off
        try:
            parse_size(proposal["value"], "dataset_cache_max_bytes")
        except ValueError as e:
            raise TraitError(f"c.GpulabSettings.dataset_cache_max_bytes: {e}") from None
        return proposal["value"]

    @property
    def dataset_cache_max_size(self) -> int:
        """:attr:`dataset_cache_max_bytes` in bytes (0: the cache is off)."""
        if self.dataset_cache_max_bytes in (0, "0"):
            return 0
        return int(parse_size(self.dataset_cache_max_bytes, "dataset_cache_max_bytes"))

    image_pull_timeout = Float(
        1800.0,
        help="Seconds the pull of a workload's image from a registry may take before it is "
        "given up (the workload then fails with IMAGE_PULL_FAILED); on a Swarm, one deadline "
        "for the pulls onto all of a job's nodes together.",
    ).tag(config=True)

    pids_limit = Integer(4096, help="Most processes one notebook container may run.").tag(
        config=True
    )

    shm_fraction = Float(
        0.5, help="Size of /dev/shm as a fraction of the memory limit (data loaders need it)."
    ).tag(config=True)

    workspace_dir = Unicode(
        "/workspace", help="Where a notebook's workspace is mounted in its container."
    ).tag(config=True)

    home_sync = Bool(
        True,
        help="""Keep each notebook's home (home_dir: packages installed with pip --user, conda
        and virtual environments under it, VS Code's extensions and settings, JupyterLab's
        settings, dotfiles, shell history) across its stops: a volume of its own,
        <container>-home, pulled from the workspace store at the start and pushed at the stop
        beside the workspace, under <workspace_root>/<user>/.home/<server>/ (the user's own
        prefix, nobody else's), purged when the notebook is deleted for good. Without a
        workspace_store it is a local volume only (kept until the deletion). False: a home
        starts as the image made it, every time, as before this setting.""",
    ).tag(config=True)

    home_dir = Unicode(
        "/home/jovyan",
        help="""Where the notebook images' user has its home (gpulab's images: /home/jovyan,
        uid 1000); the image's own content there (.bashrc, .profile) fills a new home once, at
        its first start. Absolute; neither the workspace_dir nor inside it.""",
    ).tag(config=True)

    home_max_bytes = Union(
        [Integer(), Unicode()],
        default_value="10G",
        allow_none=True,
        help="""Cap of one notebook's home in object storage ("10G", or bytes; None:
        unlimited), home_exclude's paths not counted. A home over it is not pushed at the
        stop (its local volume keeps it, nothing is deleted; the rest of the notebook is
        pushed as usual, and its record and next start say so).""",
    ).tag(config=True)

    home_exclude = List(
        Unicode(),
        default_value=list(DEFAULT_HOME_EXCLUDE),
        help="""Paths of a home its sync leaves alone (caches and logs, which cost storage and
        come back by themselves): neither pushed nor pulled, nor deleted on either side.
        Gitignore-like patterns relative to home_dir: a name with a trailing / is a directory
        at any depth (__pycache__/), a path with a / inside is anchored at the home
        (.local/share/Trash/), *, ? and ** as in gitignore; at most 100. The default:
        docs/notebooks.md. Applies from the next push or pull: what was stored before stays
        until the notebook is deleted.""",
    ).tag(config=True)

    @validate("home_dir")
    def _check_home_dir(self, proposal):
        value = proposal["value"]
        norm = os.path.normpath(value) if value.startswith("/") else ""
        if not norm or norm == "/" or norm != value.rstrip("/") or "//" in value:
            raise TraitError(
                f"c.GpulabSettings.home_dir: {value!r} must be an absolute, normalised path, not /"
            )
        return norm

    def check_home(self) -> None:
        """home_dir against workspace_dir, once both are read (a start-up check): the home's
        volume is synced on its own, so the workspace is neither it nor inside it."""
        home, ws = self.home_dir.rstrip("/"), os.path.normpath(self.workspace_dir)
        if home == ws or home.startswith(ws + "/"):
            raise ConfigError(
                f"c.GpulabSettings.home_dir: {self.home_dir!r} is the workspace_dir {ws!r} "
                "or inside it"
            )

    @validate("home_max_bytes")
    def _check_home_max_bytes(self, proposal):
        try:
            parse_size(proposal["value"], "home_max_bytes")
        except ValueError as e:
            raise TraitError(f"c.GpulabSettings.home_max_bytes: {e}") from None
        return proposal["value"]

    @validate("home_exclude")
    def _check_home_exclude(self, proposal):
        try:
            return check_exclude_patterns(proposal["value"])
        except ValueError as e:
            raise TraitError(f"c.GpulabSettings.home_exclude: {e}") from None

    max_run_time = Float(
        7 * 24 * 3600.0,
        help="Seconds a notebook may run before it is stopped (restarted if auto_restart).",
    ).tag(config=True)

    watchdog_interval = Float(
        60.0, help="Seconds between the service's checks of notebooks' run time."
    ).tag(config=True)

    gpu_reconcile_grace = Float(
        600.0,
        help="""When a restarted hub reconciles the GPU ledger with the engine, reservations
        younger than this many seconds are kept even without a container: their spawn may still
        be pulling data before it creates one.""",
    ).tag(config=True)

    job_quota = Dict(
        default_value={"gpus": 2, "jobs": 10},
        help="""Default quota of a user: {gpus, jobs}. ``gpus``: the most GPUs the user may hold
        in quota, their notebooks and their INITIALIZING, PENDING and RUNNING jobs together;
        ``jobs``: the most jobs they may have in the quota states at once, QUEUED included
        (the job concept: QUEUED, INITIALIZING, PENDING and RUNNING count against the quota),
        checked at submission (409) and again when a job starts. None means unlimited (not
        advised on a shared host). Preemptible jobs may go beyond it on idle GPUs (their
        submission is never refused for the quota, and those running beyond it do not count)
        and are preempted for in-quota work.""",
    ).tag(config=True)

    user_job_quotas = Dict(
        default_value={},
        help="Per-user quotas {user: {gpus, jobs}} (see job_quota); they win over groups.",
    ).tag(config=True)

    group_job_quotas = Dict(
        default_value={},
        help="Per-group quotas {group: {gpus, jobs}} (see job_quota); a member gets the most "
        "generous of their groups'.",
    ).tag(config=True)

    fair_share_half_life = Float(
        7 * 86400.0,
        help="""Seconds after which a GPU-hour counts half in the fair share (Slurm's
        PriorityDecayHalfLife; default 7 days). Each user's GPU-hours (jobs and notebooks,
        a shared GPU's slot by its weight), decayed by this half-life, order queued jobs of
        equal priority (the less a user and their groups used recently, the sooner) and
        decide whose borrowed (over-quota) GPUs are taken back first. 0 turns decay off:
        everything ever used counts the same (docs/jobs.md, "Fair share").""",
    ).tag(config=True)

    fair_share_interval = Float(
        15.0,
        help="""Seconds between two additions of the GPUs held (by jobs and notebooks) to
        each user's recent usage in the fair share; the job supervisor makes them.""",
    ).tag(config=True)

    fair_share_user_weights = Dict(
        default_value={},
        help="""Each user's share of the GPUs in the fair share, before normalising: {user:
        weight}; 1 for anyone not named. A user with weight 2 may use twice as much as one
        with weight 1 before their work goes behind theirs.""",
    ).tag(config=True)

    fair_share_group_weights = Dict(
        default_value={},
        help="""Each group's share of the GPUs in the fair share, before normalising: {group:
        weight}; 1 for any group not named. A group's usage is the sum of its members'; a job
        is judged by the most-used of its owner's groups first, then by its owner.""",
    ).tag(config=True)

    @validate("fair_share_half_life", "fair_share_interval")
    def _fair_share_half_life(self, proposal):
        value = proposal["value"]
        if not math.isfinite(value) or value < 0:
            name = proposal["trait"].name
            raise TraitError(f"{name} must be 0 or more seconds, not {value!r}")
        return value

    @validate("fair_share_user_weights", "fair_share_group_weights")
    def _fair_share_weights(self, proposal):
        name = proposal["trait"].name
        for key, weight in proposal["value"].items():
            if (
                not isinstance(key, str)
                or isinstance(weight, bool)
                or not isinstance(weight, int | float)
                or not math.isfinite(weight)
                or weight <= 0
            ):
                raise TraitError(
                    f"{name}: {key!r} needs a positive number as its weight, not {weight!r}"
                )
        return proposal["value"]

    disk_quota = Union(
        [Integer(), Unicode()],
        default_value=DEFAULT_DISK_QUOTA,
        allow_none=True,
        help="""Default disk quota of a user on what their workloads pull onto a node: a size
        ("200G", "512M") or bytes; None means unlimited. What counts: every volume pulled from an
        object store (jobs' and notebooks' volumes, read-only or writable, and notebooks'
        workspaces: the total size of the objects under the volume's prefix) and every git
        clone of a job (the pack received and the files checked out), from before the pull
        until the volume is removed (a job's after job_container_retention, a notebook's when
        it is deleted). What a running workload writes into its volumes is not counted. A pull
        that does not fit is refused before anything is fetched (reason DISK_QUOTA).""",
    ).tag(config=True)

    user_disk_quotas = Dict(
        default_value={},
        help="Per-user disk quotas {user: size or None} (see disk_quota); they win over groups.",
    ).tag(config=True)

    group_disk_quotas = Dict(
        default_value={},
        help="Per-group disk quotas {group: size or None} (see disk_quota); a member gets the "
        "most generous of their groups'.",
    ).tag(config=True)

    git_max_bytes = Union(
        [Integer(), Unicode()],
        default_value=DEFAULT_GIT_MAX_BYTES,
        help="""Cap of one git repository of a job ("10G", or bytes): on the pack received
        and, separately, on the files checked out, enforced while they arrive. A repository
        over it fails the job (GIT_FAILED) and its clone volume is emptied. While a clone
        runs it books up to twice this (or what the owner's disk_quota leaves, if less); once
        done, what it took.""",
    ).tag(config=True)

    snapshot_quota = Union(
        [Integer(), Unicode()],
        default_value="100G",
        allow_none=True,
        help="""Most bytes a user's workspace snapshots may hold in object storage together
        ("100G", or bytes; None: unlimited): their content-addressed blobs, each distinct
        content counted once however many snapshots share it. A snapshot that would go over
        is refused (409) before anything is copied. docs/snapshots.md.""",
    ).tag(config=True)

    max_snapshots = Integer(
        20,
        min=0,
        help="Most snapshots a user may keep (0: snapshots are off); one more is refused (409).",
    ).tag(config=True)

    @validate("disk_quota", "git_max_bytes", "snapshot_quota")
    def _check_disk_size(self, proposal):
        name = proposal["trait"].name
        try:
            parse_size(proposal["value"], name)
        except ValueError as e:
            raise TraitError(f"c.GpulabSettings.{name}: {e}") from None
        return proposal["value"]

    @validate("user_disk_quotas", "group_disk_quotas")
    def _check_disk_quotas(self, proposal):
        name = proposal["trait"].name
        for who, value in proposal["value"].items():
            try:
                parse_size(value, f"{name}[{who!r}]")
            except ValueError as e:
                raise TraitError(f"c.GpulabSettings.{e}") from None
        return proposal["value"]

    max_user_priority = Integer(
        50,
        help="""Highest job priority (0-100) a user may ask for; higher ones need the
        custom:gpulab:admin scope. Priority orders every user's queued jobs together, so the
        default lets users lower theirs but not jump ahead of others'.""",
    ).tag(config=True)

    max_queued_jobs = Integer(
        1000, help="Most jobs one user may have queued or active at once (QUEUED counts)."
    ).tag(config=True)

    max_job_workers = Integer(
        16,
        help="""Most workers (containers) one user's active jobs may have together: a
        distributed job of more is refused at submission (400, field workers), one that would
        take a user past it waits in the queue. Each worker has the per-job resource limits,
        so this bounds what one user's jobs can hold (CPUs, memory, engine networks). A
        one-worker job counts one. From 1 to 64.""",
    ).tag(config=True)

    @validate("max_job_workers")
    def _check_max_job_workers(self, proposal):
        value = proposal["value"]
        if not 1 <= value <= 64:
            raise TraitError(f"max_job_workers must be from 1 to 64, not {value}")
        return value

    max_job_tasks = Integer(
        1000,
        help="""Most tasks of one job array (a sweep: its completions, or its parameter
        sets); more is refused at submission (400, field completions or parameters). Each
        task is a job record, and a user's queued and active tasks also count against
        max_queued_jobs. From 1 to 1000.""",
    ).tag(config=True)

    @validate("max_job_tasks")
    def _check_max_job_tasks(self, proposal):
        value = proposal["value"]
        if not 1 <= value <= 1000:
            raise TraitError(f"max_job_tasks must be from 1 to 1000, not {value}")
        return value

    max_request_body = Integer(
        MAX_REQUEST_BODY,
        help="""Largest request body (bytes) the gpulab service accepts; a larger one is
        answered 413 with this limit in the message, before it is parsed. 1 MiB holds any job
        submission within the other caps (docs/limits.md). A body declared larger is read
        and discarded, unbuffered, up to 64 times this size; a chunked one is buffered up to
        four times this size; past those the connection is closed.""",
    ).tag(config=True)

    container_log_max_size = Unicode(
        "10m",
        help="""Largest log file of one notebook or job container before Docker rotates it
        (json-file driver, a Docker size such as 10m or 1g). With container_log_max_files it
        bounds each container's log on disk; a job's saved log keeps its last 10 MiB.""",
    ).tag(config=True)

    container_log_max_files = Integer(
        3, help="Rotated log files Docker keeps per notebook or job container (at least 1)."
    ).tag(config=True)

    preemption_grace = Float(
        30.0, help="Seconds a preempted or interrupted job has between SIGTERM and SIGKILL."
    ).tag(config=True)

    job_container_retention = Float(
        600.0,
        help="Seconds a finished job's container is kept (for its logs) before it is removed; "
        "the job's record and saved logs stay.",
    ).tag(config=True)

    job_retention = Float(
        None,
        allow_none=True,
        help="""Seconds an ended job's record, history, events and saved logs are kept after
        its end before the service deletes them in the background (a job's own
        `auto_delete_after` wins); notebooks' history events older than this go too (each
        notebook's newest 20 stay). None (the default): kept forever, as before this setting:
        deleting what users may still want to read is the operator's choice, not a default.
        Set it to bound the database and the log directory (docs/jobs.md#retention-and-storage:
        about 2 KB of database and the log's size per job). Billing is kept apart (monthly
        totals, and a notebook's deleted history's billed time on its row), so deleting
        records never changes what was billed. A job whose push failed (SYNC_FAILED) is
        never deleted.""",
    ).tag(config=True)

    job_retention_max = Float(
        None,
        allow_none=True,
        help="""The longest `auto_delete_after` a job may ask for (seconds; a longer one is a
        400 naming the field). None: up to ten years. With `job_retention`, it bounds what the
        database and the log directory hold.""",
    ).tag(config=True)

    job_retention_interval = Float(
        60.0,
        help="""Seconds between the service's looks for ended jobs whose retention is over.
        Each look deletes them in batches of `job_retention_batch`, pausing between
        batches so that no batch holds the database's write lock long.""",
    ).tag(config=True)

    job_retention_batch = Integer(
        100,
        help="Ended jobs deleted per transaction by the retention sweep (1 to 1000).",
    ).tag(config=True)

    @validate("job_retention", "job_retention_max", "job_retention_interval")
    def _job_retention(self, proposal):
        value = proposal["value"]
        name = proposal["trait"].name
        if value is None and name != "job_retention_interval":
            return value
        if value is None or not math.isfinite(value) or value <= 0:
            raise TraitError(f"{name} must be a positive number of seconds, not {value!r}")
        return value

    @validate("job_retention_batch")
    def _job_retention_batch(self, proposal):
        value = proposal["value"]
        if not 1 <= value <= 1000:
            raise TraitError(f"job_retention_batch must be from 1 to 1000, not {value!r}")
        return value

    job_max_timeout = Float(30 * 86400.0, help="Longest time-out a job may ask for (seconds).").tag(
        config=True
    )

    job_git_sources = Bool(
        True,
        help="""Whether jobs may list git repositories to clone before they start (a helper
        clones them from the sync image, on the default bridge network). Off: a job with `git`
        is refused with a 400, and the API's schema says so.""",
    ).tag(config=True)

    notify_webhook_hosts = List(
        Unicode(),
        default_value=[],
        help="""Hosts a job's notify.webhook may name (docs/jobs.md#notifications): '*' any
        host, '*.example.org' its subdomains, 'hooks.example.org' or an address that one;
        with ':8443' (or ':*') another port than the scheme's default. Whatever the host, a
        webhook connects only to public addresses, each resolved address checked when it is
        sent: never to loopback, private, link-local (169.254.169.254), shared or reserved
        ones (the hub, the engine, a cloud's metadata) unless notify_webhook_networks lists
        them. Empty (default): webhooks are off, and a job asking for one is refused.""",
    ).tag(config=True)

    @validate("notify_webhook_hosts")
    def _check_webhook_hosts(self, proposal):
        try:
            check_host_patterns(proposal["value"])
        except ValueError as e:
            raise TraitError(f"c.GpulabSettings.notify_webhook_hosts: {e}") from None
        return proposal["value"]

    notify_webhook_networks = List(
        Unicode(),
        default_value=[],
        help="""Networks (CIDR) or addresses that webhooks may connect to although they are
        not public, for a receiver inside the site (a chat server at 10.1.2.3). Every process
        that listens there can then be sent a job's notice by any user whose webhook host
        notify_webhook_hosts allows: list as little as you can. Empty (default): public
        addresses only.""",
    ).tag(config=True)

    @validate("notify_webhook_networks")
    def _check_webhook_networks(self, proposal):
        try:
            check_networks(proposal["value"])
        except ValueError as e:
            raise TraitError(f"c.GpulabSettings.notify_webhook_networks: {e}") from None
        return proposal["value"]

    notify_smtp_host = Unicode(
        "",
        help="""The site's SMTP server, through which e-mail notices go (with
        notify_mail_domains). Empty (default): e-mail notices are off.""",
    ).tag(config=True)

    notify_smtp_port = Integer(
        0,
        help="Port of the SMTP server; 0: the security's usual one (587 for starttls, 465 "
        "for tls, 25 for none).",
    ).tag(config=True)

    notify_smtp_security = Enum(
        ["starttls", "tls", "none"],
        default_value="starttls",
        help="""How the connection to the SMTP server is secured: 'starttls' (plain, then
        STARTTLS; refused if the server does not offer it), 'tls' (TLS from the start) or
        'none' (a relay on this host or a trusted network only). The server's certificate is
        checked against the system's CAs.""",
    ).tag(config=True)

    notify_smtp_user = Unicode(
        "", help="User name to log in to the SMTP server with; empty: no log-in."
    ).tag(config=True)

    notify_smtp_password_env = Unicode(
        "",
        help="""The environment variable that holds the SMTP password, in the service (jobs'
        notices) and in the hub (notebooks'); the password itself is never written in the
        configuration, nor logged.""",
    ).tag(config=True)

    notify_smtp_password_file = Unicode(
        "",
        help="""A file (mode 0600) whose first line is the SMTP password, read when a mail is
        sent; used when notify_smtp_password_env is empty.""",
    ).tag(config=True)

    notify_mail_from = Unicode(
        "",
        help="The From address of e-mail notices; empty: gpulab@ and this host's name.",
    ).tag(config=True)

    notify_mail_domains = List(
        Unicode(),
        default_value=[],
        help="""Domains a job's notify.email may be in ('example.org', '*.example.org' its
        subdomains, '*' any): the site's mail server sends only to these, so that it cannot
        be made to mail strangers. Empty (default): e-mail notices are off.""",
    ).tag(config=True)

    @validate("notify_mail_domains")
    def _check_mail_domains(self, proposal):
        try:
            check_host_patterns(proposal["value"])
        except ValueError as e:
            raise TraitError(f"c.GpulabSettings.notify_mail_domains: {e}") from None
        if any(":" in d for d in proposal["value"]):
            raise TraitError("c.GpulabSettings.notify_mail_domains: a domain has no port")
        return proposal["value"]

    @property
    def notify_rules(self) -> NotifyRules:
        """Where a job's notices may go (gpulab.notices), from the notify_* settings."""
        return NotifyRules(
            webhook_hosts=tuple(self.notify_webhook_hosts),
            webhook_networks=tuple(self.notify_webhook_networks),
            mail=bool(self.notify_smtp_host),
            mail_domains=tuple(self.notify_mail_domains),
        )

    secrets_keys = List(
        Unicode(),
        default_value=[],
        help="""Fernet keys that encrypt users' secrets at rest (gpulab/secrets.py), the
        encrypting one first; the others only decrypt, so a key is rotated by putting a new one
        first and running `python -m gpulab.service rotate-secrets --config jupyterhub_config.py`
        (re-encrypts every secret with it), then dropping the old one. Make one with
        `python -c 'from cryptography.fernet import Fernet;
        print(Fernet.generate_key().decode())'`. Prefer secrets_key_file (mode 0600) to writing a
        key into the configuration file. With no key at all, secrets are disabled: the API
        answers 503 and a job referring to a secret is refused.""",
    ).tag(config=True)

    secrets_key_file = Unicode(
        "",
        help="""A file of Fernet keys, one per line (after secrets_keys; the first key of all
        encrypts). Read by the hub and the service at start-up; keep it mode 0600.""",
    ).tag(config=True)

    supervisor_interval = Float(
        0.5, help="Seconds between the job supervisor's passes (scheduling and watching)."
    ).tag(config=True)

    supervisor_lease_ttl = Float(
        15.0,
        help="Seconds the job supervisor's lease in the database lasts without renewal. One "
        "service acts on the jobs at a time; a second one started on the same database waits "
        "in standby and takes over this long after the first stopped renewing (it died).",
    ).tag(config=True)

    engine_retry_max = Float(
        30.0,
        help="Longest wait (seconds) between retries when the container engine fails while a "
        "job runs (backoff doubles from 1 s). A job is never ended while its container may "
        "still run: it is retried until the engine answers.",
    ).tag(config=True)

    notebook_stale_after = Float(
        30.0,
        help="Seconds a notebook record may stay STARTING, STOPPING or DELETING, unchanged, "
        "with no spawner of the hub working on it, before the reconciler settles it.",
    ).tag(config=True)

    notebook_reconcile_interval = Float(
        60.0,
        help="Seconds between the hub's passes that reconcile notebook records, the GPU ledger "
        "and the engine's containers (and remove orphaned sync helpers).",
    ).tag(config=True)

    object_stores = Dict(
        default_value={},
        help="""Object stores by name: {name: {kind: 's3' | 'filesystem', endpoint_url, region,
        credentials: {access_key_env, secret_key_env} or {file, profile}, ca_bundle, verify,
        root}}. Credentials are named (environment variables, or an AWS credentials or config
        file read by the hub: its profile, else [default]; a session token in it is used),
        never written here, and users never see them: only the short-lived sync helper
        container receives them, as a file. ca_bundle: a PEM file on this host of the CAs that
        sign the endpoint's certificate (a private CA); verify=False turns the check off (a lab
        only, logged at WARNING). A 'filesystem' store keeps objects under 'root' on this host
        (the embedded default). A key not listed here is refused at start-up (a misspelt one
        would otherwise be ignored), and so is one in a volume grant.""",
    ).tag(config=True)

    workspace_store = Unicode(
        "",
        help="""Store that holds workspaces: pulled at STARTING, pushed at STOPPING. Empty: a
        workspace lives only in its notebook's local volume.""",
    ).tag(config=True)

    workspace_bucket = Unicode(
        "gpulab-workspaces", help="Bucket of the workspace store that holds workspaces."
    ).tag(config=True)

    workspace_root = Unicode(
        "workspaces",
        help="Key prefix of workspaces: <root>/<user>/<server>/ (the default server is _default).",
    ).tag(config=True)

    volume_grants = List(
        Dict(),
        default_value=[],
        help="""What users may attach as volumes: a list of {store, bucket, prefix ('' = all),
        modes (default all of ro, rw, rwd), users (default everyone)}. A user's own workspace
        prefix is always theirs; another user's never is.""",
    ).tag(config=True)

    sync_image = Unicode(
        f"gpulab/sync:{__version__}",
        help="Image of the data sync helper (gpulab-sync), built by `make images`.",
    ).tag(config=True)

    sync_interval = Float(
        900.0,
        help="""Seconds between live pushes of a running notebook's workspace, home and
        writable volumes and of a running job's rw/rwd volumes (900, the default: a quarter of
        an hour, or sync_interval_floor where that is longer; 0: pushed at the stop only). A
        live push takes only files unchanged for sync_settle (10 s) and while read, and
        deletes nothing (the stop's push mirrors deletions); a killed container or a lost node
        then loses at most one interval of work. A flavor's own ``sync_interval`` and a job's
        ``sync_interval`` field override it. 0, or from sync_interval_floor to one day.""",
    ).tag(config=True)

    @default("sync_interval")
    def _default_sync_interval(self) -> float:
        # a site whose floor is longer than a quarter of an hour gets its floor, not a
        # start-up error over a value it never set
        return max(900.0, self.sync_interval_floor)

    sync_settle = Float(
        10.0,
        help="""Seconds a file must have been unchanged (its mtime) before a live push takes
        it; younger files wait for the next push (the stop's push takes every file). A program
        that pauses longer than this in the middle of writing a file should write it under
        another name and rename it when done.""",
    ).tag(config=True)

    sync_interval_floor = Float(
        60.0,
        help="""The shortest live push interval a site, a flavor or a job may ask for (seconds),
        so that no user makes the platform push their volumes every few seconds. An owner's
        "push now" is one push at a time, whatever the interval.""",
    ).tag(config=True)

    network_isolation = Enum(
        ["user", "none"],
        default_value="user",
        help="""How users' containers are kept apart on the network. 'user' (default): each
        user's notebooks and jobs join one bridge network of their own,
        <instance>-net-<user>, created on demand and removed when their last container is
        gone; Docker isolates bridges from each other, so one user's containers cannot
        connect to another user's, while a user's own notebooks and jobs can reach each other.
        Each user with a container holds one network: Docker's default address pools allow
        about 30, so with more concurrent users configure default-address-pools with small
        subnets (for example /24s) in Docker's daemon.json. 'none': every container shares
        Docker's default bridge (any container can connect to any other's ports).""",
    ).tag(config=True)

    def __init__(self, check: bool = True, **kwargs):
        """``check=False``: the values as configured, without the start-up checks (what
        jupyterhub_config.py reads of a configuration still being written)."""
        super().__init__(**kwargs)
        if check:
            self.check_idle()
            self.check_sync_interval()
            self.check_sharing()
            self.check_stores()
            self.check_home()

    def check_sync_interval(self) -> None:
        """sync_interval and the flavors' own: 0 or from sync_interval_floor to a day
        (ConfigError naming the setting)."""
        floor = self.sync_interval_floor
        if not (math.isfinite(floor) and floor > 0):
            raise ConfigError(
                f"c.GpulabSettings.sync_interval_floor must be a positive number of seconds, "
                f"not {floor}"
            )
        settle = self.sync_settle
        if not (math.isfinite(settle) and 0 <= settle <= 3600):
            raise ConfigError(
                f"c.GpulabSettings.sync_settle must be from 0 to 3600 seconds, not {settle}"
            )
        named = [("c.GpulabSettings.sync_interval", self.sync_interval)]
        for f in self.flavors:
            if isinstance(f, dict) and f.get("sync_interval") is not None:
                named.append((f"flavor {f.get('id')!r}: sync_interval", f["sync_interval"]))
        for name, value in named:
            try:
                check_interval(value, name, floor)
            except ValueError as e:
                raise ConfigError(str(e)) from None

    def sync_interval_for(self, own: float | None, flavor: str | None) -> float:
        """Seconds between live pushes of a workload of ``flavor`` that asked for ``own``
        (None: its flavor's, else the site's; 0: never)."""
        chosen = self.flavor_map.get(flavor) if flavor else None
        return interval_for(own, chosen.sync_interval if chosen else None, self.sync_interval)

    def check_stores(self) -> None:
        """What the object stores name on this host, checked at start-up: a ca_bundle that is
        a PEM CA bundle, a credentials file's profile that it has (ConfigError naming the store
        and the field); a store whose TLS certificate is not verified is logged at WARNING,
        once per process."""
        try:
            stores = self.storage.stores
        except ValueError as e:  # a store, grant or workspace the configuration gets wrong
            raise ConfigError(f"c.GpulabSettings.object_stores / volume_grants: {e}") from None
        try:
            warnings = check_stores(stores)
        except ValueError as e:
            raise ConfigError(f"c.GpulabSettings.object_stores: {e}") from None
        for warning in warnings:
            if warning not in _warned:
                _warned.add(warning)
                log.warning("%s", warning)

    def check_sharing(self) -> None:
        """gpu_sharing, its mode and the fractional flavors, checked at start-up: a flavor
        asking for a fraction no shared device gives would fail every spawn, and a mode that
        was removed ('mps') would share GPUs without the limits its configuration expects."""
        why = sharing_mode_refusal(self.gpu_sharing_mode)
        if why:
            raise ConfigError(why)
        try:
            sharing = check_sharing(self.gpu_sharing)
        except ValueError as e:
            raise ConfigError(f"c.GpulabSettings.{e}") from None
        for f in self.flavors:
            gpus = f.get("gpus", 0) if isinstance(f, dict) else 0
            if isinstance(gpus, int | float) and 0 < gpus < 1:
                why = fraction_refusal(gpus, list(sharing.values()))
                if why:
                    raise ConfigError(f"flavor {f.get('id')!r}: {why}")

    def check_idle(self) -> None:
        """The idle stop's settings, checked when the hub or the service reads them (the
        service at start-up): a clear ConfigError instead of a notebook stopped in use."""
        if self.activity_report_interval < 1:
            raise ConfigError(
                "c.GpulabSettings.activity_report_interval must be at least 1 second, not "
                f"{self.activity_report_interval}"
            )
        if not math.isfinite(self.idle_check_interval) or self.idle_check_interval <= 0:
            raise ConfigError(
                "c.GpulabSettings.idle_check_interval must be a positive number of seconds, "
                f"not {self.idle_check_interval}"
            )
        shortest = 2 * self.activity_report_interval
        named = [
            ("c.GpulabSettings.gpu_idle_timeout", self.gpu_idle_timeout),
            ("c.GpulabSettings.cpu_idle_timeout", self.cpu_idle_timeout),
        ]
        for f in self.flavors:
            if isinstance(f, dict) and "idle_timeout" in f:
                named.append((f"flavor {f.get('id')!r}: idle_timeout", f["idle_timeout"]))
        unused = [("c.GpulabSettings.gpu_unused_timeout", self.gpu_unused_timeout)]
        for f in self.flavors:
            if isinstance(f, dict) and "gpu_unused_timeout" in f:
                name = f"flavor {f.get('id')!r}: gpu_unused_timeout"
                unused.append((name, f["gpu_unused_timeout"]))
        for name, value in unused:
            try:
                seconds = check_idle_timeout(value, name)
            except ValueError as e:
                raise ConfigError(str(e)) from None
            if 0 < seconds < 2 * self.idle_check_interval:
                raise ConfigError(
                    f"{name} = {value:g} s is shorter than twice idle_check_interval "
                    f"({self.idle_check_interval:g} s), how often the GPUs are read; make it at "
                    f"least {2 * self.idle_check_interval:g} s, or 0 to turn the policy off"
                )
        for name, value in named:
            try:
                seconds = check_idle_timeout(value, name)
            except ValueError as e:
                raise ConfigError(str(e)) from None
            if 0 < seconds < shortest:
                raise ConfigError(
                    f"{name} = {value:g} s is shorter than twice activity_report_interval "
                    f"({self.activity_report_interval} s): a notebook in use reports its "
                    f"activity only every {self.activity_report_interval} s and could be "
                    f"stopped; make it at least {shortest} s, or 0 to turn the idle stop off"
                )

    def gpu_unused_timeout_for(self, flavor: str | None, resources: Resources) -> float:
        """Seconds such a notebook's GPUs may go unused before it stops (0: never)."""
        return gpu_unused_timeout_for(
            self.flavor_map.get(flavor) if flavor else None, resources, self.gpu_unused_timeout
        )

    def idle_timeout_for(self, flavor: str | None, resources: Resources) -> float:
        """Seconds without activity after which such a notebook stops (0: never)."""
        return idle_timeout_for(
            self.flavor_map.get(flavor) if flavor else None,
            resources,
            self.gpu_idle_timeout,
            self.cpu_idle_timeout,
        )

    log_format = Enum(
        ["text", "json"],
        "text",
        help="""How the gpulab service writes its log: 'text' (one readable line per record) or
        'json' (one JSON object per line; state changes of jobs and notebooks carry their
        workload, workload_id, owner, old_state, state, reason, detail and exit_code as
        fields, for a log collector). The hub's own log follows JupyterHub's settings.""",
    ).tag(config=True)

    event_loop_watch = Float(
        0.0,
        help="""Seconds: when above 0, the gpulab service (and the hub) time every callback
        their event loop runs and log at WARNING (logger gpulab.loop; the hub's
        gpulab.hub_loop) each one that held the loop longer than this, with its duration (its
        CPU time, its waits and preemptions) and what it was (a task's coroutine and the
        lines it ran between, or the callback's function: never its arguments), each garbage
        collection that took longer, and (the service) each sample of its loop's lag
        (``gpulab_event_loop_lag_seconds``, always on) over it. 0: off. For measuring
        (bench/bench_loop.py uses 0.02): it costs two clock readings and a getrusage per
        callback, and a walk of a task's coroutine chain before each of its steps; less than
        asyncio's debug mode, which is never turned on.""",
    ).tag(config=True)

    @validate("event_loop_watch")
    def _event_loop_watch_valid(self, proposal):
        value = proposal["value"]
        if not value >= 0:  # NaN too
            raise TraitError(f"event_loop_watch must be 0 (off) or more seconds, not {value}")
        return value

    @cached_property
    def catalog(self) -> Catalog:
        return Catalog.from_config(self.frameworks, self.editors, self.default_framework)

    @cached_property
    def storage(self) -> StorageConfig:
        return StorageConfig.from_config(
            self.object_stores,
            self.volume_grants,
            self.workspace_store,
            self.workspace_bucket,
            self.workspace_root,
        )

    @cached_property
    def flavor_map(self) -> dict[str, Flavor]:
        return {f["id"]: Flavor.from_config(f) for f in self.flavors}

    def quotas(self) -> Quotas:
        """The configured quotas (``job_quota``, ``user_job_quotas``, ``group_job_quotas``)."""
        return Quotas.from_config(self.job_quota, self.user_job_quotas, self.group_job_quotas)

    def quota_for(self, user: str, groups) -> Quota:
        """The user's quota (their own, else the most generous of their groups', else the
        default): GPUs of notebooks and in-quota jobs together, and active jobs."""
        return self.quotas().of(user, groups)

    def gpu_quota_for(self, user: str, groups) -> int | None:
        return self.quota_for(user, groups).gpus

    def disk_quota_for(self, user: str, groups) -> int | None:
        """Bytes the user's workloads may pull onto nodes (None: unlimited): their own quota,
        else the most generous of their groups', else disk_quota."""
        return disk_quota_for(
            user,
            groups,
            parse_size(self.disk_quota, "disk_quota"),
            {u: parse_size(v, "user_disk_quotas") for u, v in self.user_disk_quotas.items()},
            {g: parse_size(v, "group_disk_quotas") for g, v in self.group_disk_quotas.items()},
        )

    @property
    def home_max_bytes_value(self) -> int | None:
        return parse_size(self.home_max_bytes, "home_max_bytes")

    @property
    def git_max_bytes_value(self) -> int:
        return parse_size(self.git_max_bytes, "git_max_bytes") or 0

    def limits_for(self, user: str, groups) -> Limits:
        return effective_limits(
            user, groups, self.max_resources, self.user_max_resources, self.group_max_resources
        )


def load_config(path: str | None) -> Config:
    """The hub's configuration file (``jupyterhub_config.py``) as traitlets' Config: the
    gpulab service reads the hub's own file, so settings are written once."""
    if not path:
        return Config()
    p = Path(path)
    return PyFileConfigLoader(p.name, path=str(p.parent)).load_config()


def config_reference(cls: type, section: str | None = None) -> str:
    """The reference of a class's own settings (those it defines, tagged config), in the order
    it defines them, as Markdown: each one's name, kind, default and its ``help=``, the one
    text of what a setting means (docs/settings.md is generated from it)."""
    from traitlets import TraitType

    name = section or cls.__name__
    out = []
    for attr, trait in vars(cls).items():
        if not isinstance(trait, TraitType) or not trait.metadata.get("config"):
            continue
        kind = type(trait).__name__
        values = getattr(trait, "values", None)
        if values:
            kind += " of " + ", ".join(f"`{v}`" for v in values)
        text = " ".join((trait.help or "").split()) or "(no description)"
        out.append(
            f"### `c.{name}.{attr}`\n\n{kind}, default `{trait.default_value_repr()}`\n\n{text}\n"
        )
    return "\n".join(out)
