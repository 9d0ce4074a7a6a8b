"""What ``gpulab doctor`` concludes from what it gathered (pure: facts in, findings out).

Each check turns one part of the facts (:class:`Facts`, gathered by :mod:`.gather`) into
:class:`Finding` lines: ``ok``, ``warning`` or ``error``, what was found, and what to do. The
rules that gpulab applies itself are the ones asked here: which engine runtimes can hand GPUs
out (``runtime.gpu_delivery_refusal``, the hub's and the service's start-up check) and whether
a driver runs an image's CUDA (``cuda.cuda_shortfall``). Nothing here reads a secret: the
facts name where credentials are (variables, a file), never their values.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

from ..cuda import CPU, CUDA, CUDA_LABEL, FLAVOUR_LABEL, ImageBuild, cuda_gap, cuda_shortfall
from ..gpus.inventory import GpuDevice, Inventory
from ..runtime import DEFAULT_USERS, POOLS_FIX, gpu_delivery_refusal, pool_room
from ..runtime.base import EngineSurvey

OK = "ok"
WARNING = "warning"
ERROR = "error"
_RANK = {OK: 0, WARNING: 1, ERROR: 2}


@dataclass(frozen=True)
class Finding:
    check: str
    status: str
    found: str
    todo: str = ""

    def to_json(self) -> dict:
        return asdict(self)


# --- the facts ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageNeed:
    """An image the site's configuration names, and what it is for."""

    image: str
    #: "framework" (the catalog), "allowed" (allowed_images) or "sync" (the sync helper)
    role: str
    #: what uses it, in words ("PyTorch 2.13"; "the sync helper")
    purpose: str = ""


@dataclass(frozen=True)
class BucketProbe:
    """One listing of a store: a bucket the configuration names ("" for the store itself)."""

    bucket: str
    purpose: str
    #: only ever read (a grant of ro alone): a missing bucket means empty volumes
    read_only: bool = False
    #: "" it answered; else the store's error code ("InvalidAccessKeyId", "NoSuchBucket",
    #: "AccessDenied", ...) or "unreachable"
    code: str = ""
    #: what the store or the connection said (no credential in it)
    message: str = ""


@dataclass(frozen=True)
class StoreFacts:
    name: str
    kind: str
    #: where it is: an S3 endpoint ("AWS" when none) or a filesystem store's root
    where: str = ""
    #: where its credentials are read from ("$S3_KEY / $S3_SECRET", "the file /etc/...")
    credentials_from: str = ""
    #: why the credentials could not be read ("" when they were)
    credentials_error: str = ""
    probes: tuple[BucketProbe, ...] = ()
    #: a filesystem store's root: "writable", "missing" (made at first use; its parent is
    #: writable), "not writable", "not a directory"
    root_state: str = ""


@dataclass(frozen=True)
class DatabaseFacts:
    #: database_url with its password hidden
    url: str
    #: why it could not be read ("" when it was)
    error: str = ""
    #: its tables and their columns; None when it does not exist yet (a SQLite file)
    tables: dict[str, frozenset[str]] | None = None
    #: what this gpulab declares
    expected: dict[str, frozenset[str]] = field(default_factory=dict)
    #: its schema revision (alembic_version; None: none yet) and this gpulab's newest
    revision: str | None = None
    head: str = ""


@dataclass(frozen=True)
class ProxyFacts:
    #: the configured command (c.ConfigurableHTTPProxy.command), its first word
    command: str
    #: where it was found ("" when it was not)
    path: str = ""
    #: the hub starts it (c.ConfigurableHTTPProxy.should_start)
    started_by_hub: bool = True


@dataclass(frozen=True)
class Facts:
    """Everything ``gpulab doctor`` gathered about the host and its site configuration."""

    config: str
    gpu_mode: str = "device_request"
    #: check_gpu_runtime: the hub and the service refuse a gpu_mode the engine cannot deliver
    check_gpu_runtime: bool = True
    network_isolation: str = "user"
    #: the runtime places workloads on several nodes (a Swarm)
    clustered: bool = False
    #: gpu_devices, as configured
    configured_gpus: tuple[GpuDevice, ...] = ()
    discover_gpus: bool = True
    #: what NVML said on this host (always asked, configured GPUs or not)
    nvml: Inventory = field(default_factory=Inventory)
    engine: EngineSurvey = field(default_factory=EngineSurvey)
    images: tuple[ImageNeed, ...] = ()
    stores: tuple[StoreFacts, ...] = ()
    #: users that may each hold a network at once, and where that number comes from
    users_needed: int = DEFAULT_USERS
    users_from: str = ""
    database: DatabaseFacts | None = None
    proxy: ProxyFacts | None = None


def handed_out(facts: Facts) -> tuple[GpuDevice, ...]:
    """The GPUs gpulab hands out on this host: the configured ones, else NVML's when it may
    discover them (``gpus.inventory.read_inventory``'s rule)."""
    if facts.configured_gpus:
        return facts.configured_gpus
    return facts.nvml.devices if facts.discover_gpus else ()


# --- the checks -----------------------------------------------------------------------------


def check_config(path: str, error: str = "", summary: str = "") -> Finding:
    if error:
        return Finding(
            "config",
            ERROR,
            f"cannot read {path or 'the site configuration'}: {error}",
            "name the hub's jupyterhub_config.py with --config or GPULAB_CONFIG_FILE, and fix "
            "what the message says",
        )
    return Finding("config", OK, f"{path}{f' ({summary})' if summary else ''}")


def check_engine(engine: EngineSurvey) -> Finding:
    if engine.error:
        at = f" at {engine.address}" if engine.address else ""
        return Finding(
            "engine",
            ERROR,
            f"the container engine does not answer{at}: {engine.error}",
            "start dockerd (systemctl start docker), let this user use it (the docker group), "
            "or set DOCKER_HOST to the engine the hub uses",
        )
    return Finding("engine", OK, f"Docker {engine.version or '?'} at {engine.address or '?'}")


def check_gpu_delivery(
    mode: str, gpus: int, engine: EngineSurvey, clustered: bool = False, enforced: bool = True
) -> Finding | None:
    """Whether the engine can hand this host's GPUs to containers in ``gpu_mode``: the
    start-up check's rule (:func:`~gpulab.runtime.gpu_delivery_refusal`). ``enforced``:
    check_gpu_runtime is on (off, the hub and the service start anyway: a warning)."""
    name = "gpu runtime"
    if clustered:
        return Finding(
            name,
            WARNING,
            "not checked on a Swarm: its manager does not list its nodes' runtimes",
            "on each GPU node, `docker info` must list the nvidia runtime (NVIDIA Container "
            "Toolkit: nvidia-ctk runtime configure --runtime=docker)",
        )
    if engine.error:
        return None  # the engine's own line says why
    listed = ", ".join(sorted(engine.runtimes)) or "none"
    try:
        refusal = gpu_delivery_refusal(mode, gpus, engine.runtimes, engine.default_runtime)
    except ValueError as e:
        return Finding(name, ERROR, str(e), "set gpu_mode to 'device_request' or 'env'")
    if refusal and not enforced:
        return Finding(
            name,
            WARNING,
            f"the engine shows no way to hand out this host's {gpus} GPU(s), and "
            "check_gpu_runtime is off: the hub and the service start anyway",
            refusal,
        )
    if refusal:
        return Finding(
            name, ERROR, f"the engine cannot hand out this host's {gpus} GPU(s)", refusal
        )
    if gpus <= 0:
        return Finding(name, OK, f"no GPU to hand out (runtimes: {listed})")
    return Finding(
        name,
        OK,
        f"gpu_mode {mode!r}: the engine hands out {gpus} GPU(s) (runtimes: {listed}; "
        f"default {engine.default_runtime or '?'})",
    )


NO_DRIVER_TODO = (
    "on a GPU server, install the NVIDIA driver (nvidia-smi must list the GPUs) and the NVIDIA "
    "Container Toolkit; where the driver's libnvidia-ml.so.1 is not on the loader's path, put "
    "its directory on LD_LIBRARY_PATH for the hub. A host without GPUs needs nothing: "
    "notebooks and jobs run on CPUs"
)


def check_driver(nvml: Inventory, configured: Sequence[GpuDevice], discover: bool) -> Finding:
    """NVML and the driver: its version and the CUDA version it supports, or why not."""
    if nvml.driver:
        return Finding(
            "driver",
            OK,
            f"NVIDIA driver {nvml.driver}, CUDA {nvml.cuda or '?'} (NVML: "
            f"{len(nvml.devices)} device(s))",
        )
    why = nvml.problem or "NVML was not asked"
    if configured:
        return Finding(
            "driver",
            WARNING,
            f"NVML: {why}; gpu_devices lists {len(configured)} GPU(s) that nothing confirms",
            NO_DRIVER_TODO,
        )
    if not discover:
        return Finding(
            "driver",
            WARNING,
            f"NVML: {why}; gpu_devices is empty and discover_gpus is off: no GPU is handed out",
            NO_DRIVER_TODO,
        )
    return Finding("driver", WARNING, f"no GPU: {why}", NO_DRIVER_TODO)


def _device_text(d: GpuDevice) -> str:
    kind = "MIG device" if d.id.startswith("MIG-") or " MIG " in f" {d.model} " else "GPU"
    details = ", ".join(filter(None, (d.model, d.memory)))
    return f"{kind} {d.id}{f': {details}' if details else ''}"


def check_gpus(configured: Sequence[GpuDevice], nvml: Inventory, discover: bool) -> list[Finding]:
    """Each GPU gpulab hands out; a configured one NVML does not list is an error."""
    out = []
    seen = {d.id for d in nvml.devices}
    if configured:
        for d in configured:
            name = f"gpu {d.id}"
            if nvml.devices and d.id not in seen:
                out.append(
                    Finding(
                        name,
                        ERROR,
                        f"gpu_devices lists {d.id!r}, which NVML does not list (it lists "
                        f"{', '.join(sorted(seen))})",
                        "name devices in gpu_devices as NVML does (an index, or a MIG device's "
                        "UUID), or leave it empty to discover them",
                    )
                )
            else:
                confirmed = "" if nvml.devices else " (configured; not confirmed by NVML)"
                out.append(Finding(name, OK, _device_text(d) + confirmed))
        return out
    if discover:
        out += [Finding(f"gpu {d.id}", OK, _device_text(d)) for d in nvml.devices]
    return out


def _image_missing(need: ImageNeed, where: str) -> Finding:
    name = f"image {need.image}"
    if need.role == "sync":
        return Finding(
            name,
            ERROR,
            f"missing {where}: the sync helper pulls and pushes every workspace and volume",
            "build it: make images (scripts/build-images.sh sync), or set sync_image",
        )
    uses = f" ({need.purpose})" if need.purpose else ""
    return Finding(
        name,
        WARNING,
        f"missing {where}{uses}: the spawn form shows it unavailable and refuses it",
        "build it: make images (scripts/build-images.sh), or docker pull it",
    )


def check_image(
    need: ImageNeed, labels: dict[str, str] | None, driver_cuda: str, gpus: int
) -> Finding:
    """One image: present, its flavour (``org.gpulab.flavour``) and, for a CUDA build, the CUDA
    version it needs (``org.gpulab.cuda``) against what the driver supports."""
    name = f"image {need.image}"
    if labels is None:
        return _image_missing(need, "on this host")
    build = ImageBuild.from_labels(labels)  # the labels read as the catalog reads them
    flavour = build.flavour
    uses = f"{need.purpose}: " if need.purpose else ""
    if flavour == CUDA or (not flavour and build.cuda):
        needed = build.cuda
        build = f"CUDA build (needs CUDA {needed or '?'})"
        if not driver_cuda:
            return Finding(
                name,
                WARNING,
                f"{uses}{build} on a host without a working NVIDIA driver: it runs on CPUs only",
                "install the NVIDIA driver, or build CPU images (make images GPU=cpu)",
            )
        shortfall = cuda_shortfall(need.image, needed, driver_cuda)
        if shortfall:
            status = ERROR if cuda_gap(needed, driver_cuda) == "major" else WARNING
            return Finding(name, status, f"{uses}{build}, driver CUDA {driver_cuda}", shortfall)
        return Finding(name, OK, f"{uses}{build}; the driver supports CUDA {driver_cuda}")
    if flavour == CPU:
        if gpus and need.role == "framework":
            return Finding(
                name,
                WARNING,
                f"{uses}CPU build on a host with {gpus} GPU(s): workloads on it get GPUs they "
                "cannot use",
                "build the CUDA flavour: make images GPU=cuda",
            )
        return Finding(name, OK, f"{uses}CPU build")
    if flavour:
        return Finding(
            name,
            WARNING,
            f"{uses}unknown flavour {flavour!r} ({FLAVOUR_LABEL} is cuda or cpu)",
            "rebuild it with make images",
        )
    if gpus and need.role == "framework":
        return Finding(
            name,
            WARNING,
            f"{uses}present, flavour unknown (no {FLAVOUR_LABEL} label): whether it uses the "
            "GPUs cannot be told",
            "rebuild it with make images (which labels every image), or label your own image "
            f"{FLAVOUR_LABEL}=cuda and {CUDA_LABEL}=VERSION",
        )
    return Finding(name, OK, f"{uses}present")


def check_images(facts: Facts) -> list[Finding]:
    if facts.clustered:
        return [
            Finding(
                "images",
                WARNING,
                f"{len(facts.images)} image(s) not checked: a Swarm's nodes pull them from "
                "image_registry",
                "push them with make images PUSH=REGISTRY (scripts/build-images.sh --push)",
            )
        ]
    if facts.engine.error:
        return []  # the engine's own line says why
    driver_cuda = facts.nvml.cuda
    gpus = len(handed_out(facts))
    return [
        check_image(need, facts.engine.images.get(need.image), driver_cuda, gpus)
        for need in facts.images
    ]


# --- stores ---------------------------------------------------------------------------------

_NOT_FOUND = {"NoSuchBucket", "404", "NotFound"}
_DENIED = {"AccessDenied", "403", "AllAccessDisabled", "Forbidden"}


def _probe_finding(store: StoreFacts, probe: BucketProbe) -> Finding:
    name = f"store {store.name}"
    what = f"bucket {probe.bucket}" if probe.bucket else "the store"
    keys = store.credentials_from or "its credentials"
    said = f" ({probe.message})" if probe.message else ""
    code = probe.code
    if not code:
        return Finding(name, OK, f"{what}: answers")
    if code in _NOT_FOUND:
        if probe.read_only:
            return Finding(
                name,
                WARNING,
                f"{what} ({probe.purpose}) does not exist: volumes of it are empty",
                f"create {probe.bucket} and put the data users read there",
            )
        return Finding(
            name, OK, f"{what} ({probe.purpose}) does not exist yet: made at the first pull"
        )
    if code == "InvalidAccessKeyId":
        return Finding(
            name,
            ERROR,
            f"{what}: the store does not know the access key from {keys}{said}",
            f"set the access key the store gave you in {keys}",
        )
    if code == "SignatureDoesNotMatch":
        return Finding(
            name,
            ERROR,
            f"{what}: the secret key from {keys} does not match its access key{said}",
            f"set the secret key that belongs to the access key in {keys}",
        )
    if code in _DENIED:
        return Finding(
            name,
            ERROR,
            f"{what}: the store refuses the keys from {keys}{said}",
            f"check the keys in {keys}, and grant them s3:ListBucket, s3:GetObject, "
            f"s3:PutObject and s3:DeleteObject on {probe.bucket or 'the buckets gpulab uses'}",
        )
    if code == "unreachable":
        return Finding(
            name,
            ERROR,
            f"cannot reach {store.where or 'the store'}{said}",
            "check endpoint_url, and that this host reaches it (DNS, firewall, proxy)",
        )
    return Finding(
        name,
        ERROR,
        f"{what}: {code}{said}",
        f"check the store's endpoint_url, region and the keys in {keys}",
    )


def check_store(store: StoreFacts) -> list[Finding]:
    name = f"store {store.name}"
    if store.kind == "filesystem":
        state = store.root_state
        if state == "writable":
            return [Finding(name, OK, f"filesystem store at {store.where}")]
        if state == "missing":
            return [Finding(name, OK, f"filesystem store at {store.where}: made at first use")]
        return [
            Finding(
                name,
                ERROR,
                f"filesystem store at {store.where}: {state or 'unusable'}",
                "make it a directory that the hub's user can write (mkdir -p; chown)",
            )
        ]
    if store.credentials_error:
        return [
            Finding(
                name,
                ERROR,
                store.credentials_error,
                "set the variables in the hub's environment (and name them in "
                "GPULAB_SERVICE_ENV, so that the service gets them too), or point "
                "credentials.file at a file the hub's user can read",
            )
        ]
    found = [_probe_finding(store, p) for p in store.probes]
    bad = [f for f in found if f.status != OK]
    if bad:
        return bad
    seen = ", ".join(
        f"{p.bucket} (not there yet: made at the first pull)" if p.code else p.bucket
        for p in store.probes
        if p.bucket
    )
    return [
        Finding(
            name,
            OK,
            f"S3 at {store.where or 'AWS'}: {seen or 'the store'} answer(s) with the keys from "
            f"{store.credentials_from}",
        )
    ]


# --- address pools ----------------------------------------------------------------------------


def check_address_pools(facts: Facts) -> Finding | None:
    """Room in the engine's address pools for one network per user (network_isolation
    'user'): fewer than the users counted on is a warning (``runtime.pools``' rule, which the
    service's start-up warning asks too)."""
    name = "address pools"
    if facts.network_isolation != "user":
        return Finding(
            name, OK, f"network_isolation {facts.network_isolation!r}: no network per user"
        )
    if facts.clustered:
        return Finding(
            name,
            WARNING,
            "not checked on a Swarm: users' overlays come from the swarm's own pool",
            "see docker swarm init --default-addr-pool (docs/scale-out.md)",
        )
    engine = facts.engine
    if engine.error:
        return None
    room = pool_room(engine)
    counted = facts.users_from or "active_server_limit unset; --users N says how many"
    users = f"{facts.users_needed} users ({counted})"
    if room.short_of(facts.users_needed):
        return Finding(name, WARNING, f"{room.found()}; {users} may each need one", POOLS_FIX)
    return Finding(name, OK, f"{room.found()}; enough for {users}")


# --- database and proxy -------------------------------------------------------------------------


def check_database(db: DatabaseFacts) -> Finding:
    name = "database"
    if db.error:
        return Finding(
            name,
            ERROR,
            f"cannot read {db.url}: {db.error}",
            "check database_url, that the database server runs and accepts these credentials, "
            "or that the SQLite file's directory exists and is writable",
        )
    if db.tables is None:
        return Finding(name, OK, f"{db.url} does not exist yet: the hub makes it at its start")
    missing_tables = sorted(t for t in db.expected if t not in db.tables)
    missing_columns = sorted(
        f"{t}.{c}" for t, cols in db.expected.items() if t in db.tables for c in cols - db.tables[t]
    )
    if missing_tables or missing_columns:
        parts = []
        if missing_tables:
            parts.append(f"tables {', '.join(missing_tables)}")
        if missing_columns:
            parts.append(f"columns {', '.join(missing_columns)}")
        return Finding(
            name,
            WARNING,
            f"{db.url}: older than this gpulab, it lacks {'; '.join(parts)}",
            "back it up (gpulab admin backup DEST), then run `gpulab admin upgrade-db`: the hub "
            "and the service refuse an older schema (docs/upgrading.md)",
        )
    if db.head and db.revision is not None and db.revision != db.head:
        return Finding(
            name,
            WARNING,
            f"{db.url}: at schema revision {db.revision}, this gpulab's is {db.head}",
            "back it up (gpulab admin backup DEST), then run `gpulab admin upgrade-db`: the hub "
            "and the service refuse another schema (docs/upgrading.md)",
        )
    at = f", revision {db.revision}" if db.revision else ""
    return Finding(name, OK, f"{db.url}: schema current ({len(db.expected)} tables{at})")


def check_proxy(proxy: ProxyFacts) -> Finding:
    name = "proxy"
    if not proxy.started_by_hub:
        return Finding(name, OK, "configurable-http-proxy is started outside the hub")
    if proxy.path:
        return Finding(name, OK, f"configurable-http-proxy at {proxy.path}")
    return Finding(
        name,
        ERROR,
        f"{proxy.command!r} not found: the hub cannot start its proxy",
        "install it (npm install -g configurable-http-proxy; make run builds it into "
        ".build/node), or name it in c.ConfigurableHTTPProxy.command",
    )


# --- all of them ----------------------------------------------------------------------------


def check_all(facts: Facts, config_summary: str = "") -> list[Finding]:
    """Every check, in the order a newcomer fixes them."""
    gpus = handed_out(facts)
    out = [check_config(facts.config, summary=config_summary), check_engine(facts.engine)]
    out.append(check_driver(facts.nvml, facts.configured_gpus, facts.discover_gpus))
    out += check_gpus(facts.configured_gpus, facts.nvml, facts.discover_gpus)
    out.append(
        check_gpu_delivery(
            facts.gpu_mode, len(gpus), facts.engine, facts.clustered, facts.check_gpu_runtime
        )
    )
    out += check_images(facts)
    for store in facts.stores:
        out += check_store(store)
    out.append(check_address_pools(facts))
    if facts.database is not None:
        out.append(check_database(facts.database))
    if facts.proxy is not None:
        out.append(check_proxy(facts.proxy))
    return [f for f in out if f is not None]


def worst(findings: Iterable[Finding]) -> str:
    return max((f.status for f in findings), key=_RANK.__getitem__, default=OK)


def exit_code(findings: Iterable[Finding]) -> int:
    """0 without an error (warnings included), 1 with one."""
    return 1 if worst(findings) == ERROR else 0


def render(findings: Sequence[Finding]) -> str:
    """One line per check (status, check, what was found), and under a warning or an error
    what to do; then the count of each."""
    width = max((len(f.check) for f in findings), default=0)
    lines = []
    for f in findings:
        lines.append(f"{f.status:<7}  {f.check:<{width}}  {f.found}")
        if f.todo and f.status != OK:
            lines.append(f"{'':<7}  {'':<{width}}  -> {f.todo}")
    counts = {s: sum(1 for f in findings if f.status == s) for s in (OK, WARNING, ERROR)}
    lines.append(f"{counts[OK]} ok, {counts[WARNING]} warning(s), {counts[ERROR]} error(s)")
    return "\n".join(lines) + "\n"


def to_json(findings: Sequence[Finding]) -> dict:
    return {
        "status": worst(findings),
        "checks": [f.to_json() for f in findings],
    }
