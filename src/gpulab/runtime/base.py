"""The runtime interface: everything gpulab asks of a container engine, in its own words.

The spawner, the job supervisor, the sync and the pages talk to an engine only through a
:class:`Runtime`. Two backends implement it: :class:`~gpulab.runtime.docker.DockerRuntime`
(one Docker engine, the default) and :class:`~gpulab.runtime.swarm.SwarmRuntime` (a Docker
Swarm cluster, through its manager). A Kubernetes backend would be a third (see
ARCHITECTURE.md): it implements the same methods with Pods/batch Jobs.

The vocabulary is the engine-neutral one of a workload: a named unit that runs one command
on one node, with its volumes on that node. gpulab decides the node and the devices (its
ledger); the engine runs what it is told where it is told.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import imagerefs
from ..cuda import ImageBuild
from .images import ImageCache

if TYPE_CHECKING:
    from ..gpus.inventory import GpuDevice, Inventory
    from ..gpus.usage import DeviceUsage

#: the path of gpulab's job runner inside a job's container (see job_runner.sh)
RUNNER_PATH = "/opt/gpulab/run.sh"


@dataclass(frozen=True)
class Mount:
    """A named volume on the workload's node, mounted at ``target``. ``no_copy``: an empty
    volume is never filled from the image at ``target`` (a dataset cache's copy: one that
    went missing must not come back holding the image's files)."""

    volume: str
    target: str
    read_only: bool = False
    no_copy: bool = False


@dataclass
class WorkloadSpec:
    """What to run, for any backend. Built by the supervisor (jobs) from a JobSpec."""

    name: str
    image: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    user: str = "1000:100"
    cpus: float = 1.0
    memory: int = 1024**3
    pids_limit: int = 4096
    shm_size: int = 64 * 1024**2
    gpu_ids: Sequence[str] = ()
    #: named volumes only: a workload is never given a path of its node's file system (on
    #: one engine a job's runner script, read-only, is the one file it gets from the host)
    mounts: Sequence[Mount] = ()
    #: the owner whose private network it joins (None: the engine's default network)
    network_owner: str | None = None
    #: the distributed job whose own network it joins instead (its workers only)
    network_job: str | None = None
    #: names the other workloads on that network resolve it by (a worker's rank name)
    aliases: Sequence[str] = ()
    #: the container's host name (None: the engine's)
    hostname: str | None = None
    #: the node chosen by gpulab's placement ("" on a single engine)
    node: str = ""
    log_max_size: str = "10m"
    log_max_files: int = 3
    #: run the command under gpulab's job runner (PID 1: restart in place, signals)
    runner: bool = True
    #: seconds between SIGTERM and SIGKILL when the engine stops it
    stop_grace: float = 10.0
    #: the command's working directory (None: the image's)
    working_dir: str | None = None
    #: the image's file system read-only; /tmp is then a tmpfs of ``tmp_size`` bytes
    read_only: bool = False
    tmp_size: int = 256 * 1024**2
    #: ports it serves (a notebook's server): published on the host's loopback when it joins
    #: no network of its own, so that the hub reaches it there (see Runtime.reach)
    ports: Sequence[int] = ()


@dataclass(frozen=True)
class WorkloadState:
    """What the engine says of a workload now."""

    running: bool
    exit_code: int | None = None
    oom: bool = False
    #: when its current run started (epoch seconds by the engine's clock; None: never)
    started_at: float | None = None
    node: str = ""
    #: the engine's word when it could not run it (a Swarm task rejected, a node lost)
    error: str = ""
    #: ended without an exit code because its node went down or was drained
    lost: bool = False


@dataclass(frozen=True)
class Labelled:
    """A workload or helper found by its labels (after a restart, for recovery)."""

    id: str
    name: str
    labels: dict[str, str]
    running: bool
    node: str = ""


@dataclass(frozen=True)
class Node:
    """One engine of the cluster that may run workloads."""

    id: str
    hostname: str
    ready: bool
    #: takes new workloads (Swarm: availability active)
    active: bool
    #: the GPU device IDs the node offers (configured or advertised)
    gpus: tuple[str, ...] = ()
    address: str = ""
    #: why its GPUs must not be handed out now ("" when they may): its engine cannot deliver
    #: them, or did not say (a Swarm node's runtimes, ``check_gpu_runtime``)
    gpus_refused: str = ""
    #: the model of its GPUs and the node pools it is in (a Swarm node's labels
    #: ``gpulab.gpu-model`` and ``gpulab.pools``; none on one host: the settings say)
    gpu_model: str = ""
    pools: tuple[str, ...] = ()


@dataclass(frozen=True)
class EngineNetwork:
    """A network the engine has, with the subnets it took from the address pools."""

    name: str
    subnets: tuple[str, ...] = ()
    #: made by this gpulab instance (a user's or a job's network: labelled with its instance)
    ours: bool = False


@dataclass(frozen=True)
class EngineSurvey:
    """What an engine says about itself, for ``gpulab doctor`` (:meth:`Runtime.survey`): where
    it was asked, its version, its runtimes, its address pools and networks, and the labels of
    the images asked about. ``error`` says why it did not answer ("" when it did)."""

    address: str = ""
    version: str = ""
    error: str = ""
    #: ``docker info``'s Runtimes ({name: {"path": ...}}) and DefaultRuntime
    runtimes: dict[str, Any] = field(default_factory=dict)
    default_runtime: str = ""
    #: the configured default address pools as (base, size); None: the engine's built-in ones
    address_pools: tuple[tuple[str, int], ...] | None = None
    #: where the pools were read ("docker info", a daemon.json path; "" for the built-in ones)
    pools_from: str = ""
    networks: tuple[EngineNetwork, ...] = ()
    #: each image asked about -> its labels, or None when the engine does not have it; an
    #: image left out was not asked (a cluster's images are in its registry)
    images: dict[str, dict[str, str] | None] = field(default_factory=dict)


@dataclass
class HelperSpec:
    """A short-lived helper (a sync, a git clone) to run to its end, for any backend: what it
    runs, its labels and environment, the named volumes it mounts (``mounts``) and the host
    directories it binds (``host_dirs``: host path -> (path inside, read-only); one engine
    only), the network it joins ("host", "bridge" or a network's ID) and its limits.
    Every helper runs unprivileged, without capabilities, as ``user``.

    ``files``: secret files (store credentials, a CA bundle), name -> content, that the helper
    reads at ``HELPER_FILES_DIR/<name>``, readable by ``user`` only. Backends deliver them
    into the helper itself (a copy into the created container; a Swarm's secrets), never
    through its environment or command line nor as a bind of a host path, so that an
    inspection of the helper shows no secret."""

    image: str
    command: list[str]
    labels: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    user: str = "1000:100"
    mounts: Sequence[Mount] = ()
    host_dirs: dict[str, tuple[str, bool]] = field(default_factory=dict)
    network: str = "host"
    memory: int | None = None
    pids_limit: int | None = None
    files: dict[str, bytes] = field(default_factory=dict)


#: where a helper finds its :attr:`HelperSpec.files`
HELPER_FILES_DIR = "/run/secrets"


class EngineError(Exception):
    """The engine failed a call (refused it, or lost what it was asked about). Backends raise
    it (or a subclass) for their engine's errors: nothing above ``runtime/`` catches an engine
    SDK's exceptions, and none comes up. ``str(e)`` is the whole message; what a caller may
    need of it are fields of its own."""

    def __init__(self, message: str = "", *, status: int | None = None, detail: str = ""):
        super().__init__(message)
        #: the engine's answer's HTTP status (None: no answer, or none of that kind)
        self.status = status
        #: the engine's own words, without the call around them (a user's reason)
        self.detail = detail or message

    @property
    def not_found(self) -> bool:
        """The engine has no such object (workload, image, volume, network)."""
        return self.status == 404


class WorkloadRefused(EngineError):
    """The engine answered and refused to create or start a workload (a bad device, a missing
    runtime): a definite answer, not a fault to retry."""


class NetworkUnavailable(EngineError):
    """The user's network cannot be had; the message says why and who can fix it."""


class EngineUnreachable(EngineError):
    """The engine gave no answer: it is down, its address (``url``, as ``DOCKER_HOST``
    names it) is wrong, or the connection broke or timed out. Not the engine's refusal
    (``status`` is None): worth trying again once it is back; the message names it."""

    def __init__(self, message: str = "", *, url: str = "", detail: str = ""):
        super().__init__(message, detail=detail)
        self.url = url


class ImagePullFailed(EngineError):
    """A registry refused or failed an image (its digest or its pull), through the engine:
    the message is the registry's own words (never a credential)."""


@dataclass
class PullProgress:
    """How far a pull is: bytes downloaded of the bytes announced so far (it grows as the
    engine announces layers), the layers seen, and the engine's last status line."""

    done: int = 0
    total: int = 0
    layers: int = 0
    status: str = ""

    def line(self, image: str) -> str:
        """One line for the spawn progress and a job's events."""
        if not self.total:
            return f"Pulling image {image}: {self.status or 'starting'}"
        s = "s" if self.layers != 1 else ""
        return (
            f"Pulling image {image}: {self.done / 1e6:.1f} MB of {self.total / 1e6:.1f} MB "
            f"({self.layers} layer{s})"
        )


class StillRunning(EngineError):
    """The engine did not confirm in time that a workload stopped (a Swarm's task kept
    running, a container that outlived SIGKILL: the job supervisor's
    ``engine.ensure_stopped``): the caller keeps what the workload holds (its GPUs) and tries
    again, or kills it."""


class HelperResult:
    def __init__(self, exit_code: int, lines: list[str]):
        self.exit_code = exit_code
        self.lines = lines


class LogStream:
    """A blocking iterator over a workload's log chunks, with ``close()`` to end it from
    another thread (read on a worker thread, never on the event loop)."""

    def __init__(self, chunks: Iterator[bytes], close: Callable[[], None]):
        self._chunks = chunks
        self._close = close

    def __iter__(self) -> Iterator[bytes]:
        return self._chunks

    def close(self) -> None:
        self._close()


class WorkloadGone(LookupError):
    """The engine has no workload of that name."""


class ExecSession:
    """An interactive terminal in a running workload: a TTY exec, as a blocking byte stream.

    Used from worker threads, never from the event loop: one thread loops on :meth:`read`
    (which also sends what :meth:`write` queued); any other thread may call :meth:`write`,
    :meth:`resize` and :meth:`close`. Input is bounded: :meth:`write` waits while the
    terminal has not taken what was queued before (back-pressure), and :meth:`close` wakes it."""

    def read(self) -> bytes:
        """The terminal's next output; b"" once the session has ended (the shell exited, or
        :meth:`close` was called)."""
        raise NotImplementedError

    def write(self, data: bytes) -> None:
        """Queue keystrokes for the terminal. Blocks while the session's bounded input queue
        is full, until :meth:`read`'s thread has sent enough of it or the session ends (then
        the rest goes nowhere, as typing into a closed terminal does): never drops input of
        an open session, never grows without bound."""
        raise NotImplementedError

    def resize(self, cols: int, rows: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """End the session from any thread: :meth:`read` returns b"" soon after."""
        raise NotImplementedError

    def exit_code(self) -> int | None:
        """The shell's exit code once :meth:`read` returned b"" (None: unknown)."""
        raise NotImplementedError


class Runtime:
    """The interface. Blocking engine calls run on a shared thread pool, wide enough that
    one user's slow image pull does not queue another user's spawn behind it."""

    #: whether it places workloads on several nodes (its GPUs come from :meth:`nodes`)
    clustered = False
    #: one engine's GPUs, known when it is made (configured or NVML; :meth:`nodes` reports
    #: them too); a clustered runtime has none here: its nodes report theirs as they change
    devices: tuple[GpuDevice, ...] = ()
    #: how one engine's GPUs were found (configured, NVML with its driver and CUDA version)
    #: or why there is none; None for a clustered runtime (each node's label says its own)
    inventory: Inventory | None = None
    #: where a missing image is missing, in a user's words ("on this host", "in the registry")
    images_at = "on this host"
    _executor: ThreadPoolExecutor | None = None
    #: what this runtime knows of its engine's images (made on first use: :meth:`_images`)
    _image_cache: ImageCache | None = None

    def __init__(self, workers: int = 32, registry: str = ""):
        self._workers = workers
        self.registry = registry

    def log_gpus(self, logger: logging.Logger) -> None:
        """Say at start-up which GPUs this runtime hands out: one engine's inventory (at
        WARNING when NVML was asked and found none, with why), or where a cluster's come from."""
        if self.inventory is not None:
            self.inventory.log(logger)

    def image_ref(self, image: str) -> str:
        """The name nodes pull ``image`` by: prefixed with the registry when it names none (a
        first part with a dot or a colon, or ``localhost``, is a registry)."""
        first, _, rest = image.partition("/")
        has_registry = rest and ("." in first or ":" in first or first == "localhost")
        if not self.registry or has_registry:
            return image
        return self.registry.rstrip("/") + "/" + image

    @classmethod
    def shared_executor(cls, workers: int = 32) -> ThreadPoolExecutor:
        if Runtime._executor is None:
            Runtime._executor = ThreadPoolExecutor(workers, thread_name_prefix="gpulab-engine")
        return Runtime._executor

    #: threads of the pool that runs users' execs (see :meth:`run_exec`)
    EXEC_THREADS = 64
    _exec_executor: ThreadPoolExecutor | None = None

    async def run_exec(self, fn, *args, **kwargs) -> Any:
        """Run a blocking exec call on a pool of its own: an exec may run for minutes, and
        must never hold the threads that spawns and jobs' engine calls wait for."""
        if Runtime._exec_executor is None:
            Runtime._exec_executor = ThreadPoolExecutor(
                self.EXEC_THREADS, thread_name_prefix="gpulab-exec"
            )
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            Runtime._exec_executor, functools.partial(fn, *args, **kwargs)
        )

    async def run(self, fn, *args, **kwargs) -> Any:
        """Run a blocking engine call off the event loop, on the runtime's engine pool (for
        engine calls only: the database, a store's listing and the like have pools of their
        own, so that they never queue behind a slow pull, nor engine calls behind them)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self.shared_executor(self._workers), functools.partial(fn, *args, **kwargs)
        )

    # --- the cluster --------------------------------------------------------------------------

    async def nodes(self) -> list[Node]:
        raise NotImplementedError

    async def gpu_delivery_refusal(self) -> str | None:
        """Why the engine cannot hand this runtime's GPUs to the containers that book them,
        with what to configure; None when it can, or has no GPU to hand out. Asked at
        start-up (the hub and the service). A cluster is never refused as a whole: each
        node's engine is asked instead, and a node that cannot deliver has its GPUs kept out
        of placement (``Node.gpus_refused``)."""
        return None

    async def gpu_usage(self) -> dict[str, list[DeviceUsage]]:
        """What the GPUs do now: node ("" on one engine) -> its devices' readings (utilization,
        memory), each device named as its node's engine names it. A node whose GPUs cannot be
        read now (no NVML there, no reading or only a stale one from a cluster's agent) is
        left out: unknown, never idle. Never raises for a node it cannot read."""
        return {}

    async def watch_gpus(self, instance: str) -> None:
        """Set up what reads the GPUs for :meth:`gpu_usage` (the service, at start-up; done
        again, it changes nothing that is right already): nothing on one engine (the service
        reads its host's NVML); a cluster's agent on each node (ARCHITECTURE.md)."""
        return None

    async def survey(self, images: Sequence[str], instance: str) -> EngineSurvey:
        """What the engine says about itself (``gpulab doctor``): its version, runtimes,
        address pools and networks (``instance``'s marked as ours), and the labels of each of
        ``images`` it has; never raises: an engine that does not answer is an ``error``."""
        raise NotImplementedError

    async def image_exists(self, image: str, node: str = "") -> bool:
        """Whether ``image`` is there to run: asked of ``node``'s own engine when a node is
        named (a cluster's node, which runs what it holds), else where this runtime keeps its
        images (one engine's; a Swarm's registry, through its manager). An engine that does
        not answer raises; so does a cluster's node that is gone (an EngineError, not the
        image's: the workload placed there is placed again)."""
        raise NotImplementedError

    async def image_command(self, image: str) -> list[str] | None:
        """The command ``image`` runs by default (None: the engine cannot tell here)."""
        return None

    async def image_labels(self, image: str) -> dict[str, str] | None:
        """``image``'s labels (its flavour and the CUDA it needs, among others); None when the
        engine does not have it or cannot tell here (a Swarm's registry is not asked)."""
        return None

    async def registry_digest(self, image: str, auth: dict[str, str] | None) -> str:
        """The digest (``sha256:...``) the registry gives for ``image``, asked with ``auth``
        (None: anonymously): the registry's consent to this caller for this image.
        :class:`ImagePullFailed` with the registry's words when it refuses."""
        raise ImagePullFailed("this engine cannot pull images from registries")

    async def pull_image(
        self,
        image: str,
        auth: dict[str, str] | None,
        on_progress: Callable[[PullProgress], None],
        node: str = "",
        max_bytes: int = 0,
    ) -> None:
        """Pull ``image`` (a pinned ``NAME@sha256:...``) onto ``node`` (its own engine, on a
        cluster) with ``auth``, sent with this one call and stored nowhere; ``on_progress`` is
        called on the event loop as bytes arrive. A pull whose layers announce more than
        ``max_bytes`` (0: no cap) is given up (the engine stops pulling when its caller hangs
        up). :class:`ImagePullFailed` with the registry's words when it fails."""
        raise ImagePullFailed("this engine cannot pull images from registries")

    async def fetch_image(
        self,
        image: str,
        policy: str,
        auth: dict[str, str] | None,
        on_progress: Callable[[PullProgress], None],
        node: str = "",
        max_bytes: int = 0,
    ) -> str:
        """Make an image from a registry ready to run on ``node`` and return the reference
        that runs it, pinned to a digest (``NAME@sha256:...``). The registry is asked for the
        digest with the caller's ``auth`` at every start, whatever ``policy``: an image that
        another user pulled is never run without the registry's consent to this caller. The
        layers are pulled when ``policy`` is "always", or "if-not-present" and the node lacks
        that digest (asked of the node itself: :meth:`image_exists` with ``node``); with
        "never" the node must hold it. :class:`ImagePullFailed` says what failed, in the
        registry's words."""
        ref = imagerefs.parse(image)
        digest = await self.registry_digest(str(ref), auth)
        if ref.digest and digest != ref.digest:
            # the registry's consent is for what it named: never a pinned digest it did not
            raise ImagePullFailed(
                f"the registry names {digest} for {ref}, not the pinned {ref.digest}"
            )
        pinned = ref.pinned(digest)
        present = await self.image_exists(pinned, node)
        if policy == "never":
            if not present:
                where = f"node {node}" if node else "this host"
                raise ImagePullFailed(f"{pinned} is not on {where} and image_pull_policy is never")
            return pinned
        if policy == "always" or not present:
            await self.pull_image(pinned, auth, on_progress, node, max_bytes)
        return pinned

    @property
    def driver_cuda(self) -> str:
        """The CUDA version this host's NVIDIA driver supports, from :attr:`inventory` (""
        unknown: configured GPUs, no NVML, a cluster whose nodes' drivers are not read)."""
        return self.inventory.cuda if self.inventory is not None else ""

    async def image_builds(self, images: Iterable[str]) -> dict[str, ImageBuild]:
        """{image: its build (flavour, CUDA needed), from its labels} of ``images``, by the
        names the engine runs them by (:meth:`image_ref`); each asked at most every
        ``IMAGE_CHECK_TTL`` seconds (this runtime's :class:`~.images.ImageCache`). An image the
        engine lacks or cannot tell of has an empty :class:`~gpulab.cuda.ImageBuild`."""
        return await self._images().builds(self, images, self.image_ref)

    async def missing_images(self, images: Iterable[str]) -> list[str]:
        """The ``images`` the engine does not have (on a Swarm: the registry), an image found
        there trusted for ``IMAGE_CHECK_TTL`` seconds (this runtime's cache); an engine that
        does not answer hides nothing."""
        return await self._images().missing(self, images, self.image_ref)

    def _images(self) -> ImageCache:
        if self._image_cache is None:
            self._image_cache = ImageCache()
        return self._image_cache

    # --- workloads ----------------------------------------------------------------------------

    async def create_and_start(self, spec: WorkloadSpec) -> None:
        """Create ``spec.name`` on ``spec.node`` (replacing a stopped one of that name) and
        start it. Raises the engine's error when it refuses. A spec labelled with a network
        (``org.gpulab.network``) has that label set to the owner's network it really joined."""
        raise NotImplementedError

    #: whether :meth:`wait_exit` hears of exits as they happen (else it only waits)
    announces_exits = False

    async def wait_exit(self, names: Sequence[str], timeout: float, since: float) -> bool:
        """Wait up to ``timeout`` seconds; True as soon as the engine announces that one of
        ``names`` ended (exited, or was removed) after ``since`` (``time.monotonic()``),
        False after the time-out. A hint only: the caller then reads the workload's
        :meth:`state`. A runtime that hears nothing (:attr:`announces_exits` False) just
        waits, and its callers look at every pass."""
        await asyncio.sleep(timeout)
        return False

    async def state(self, name: str) -> WorkloadState | None:
        """None: no such workload."""
        raise NotImplementedError

    async def start_again(self, name: str) -> None:
        """Run an ended workload's command again, on the same node with the same volumes."""
        raise NotImplementedError

    async def stop(self, name: str, grace: float) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds; returns when it ended."""
        raise NotImplementedError

    async def terminate(self, name: str, grace: float) -> None:
        """Ask the workload to stop (SIGTERM) and return at once, without waiting; the caller
        confirms with :meth:`state` and kills what outlives ``grace``."""
        raise NotImplementedError

    async def kill(self, name: str) -> None:
        raise NotImplementedError

    async def remove(self, name: str) -> bool:
        """Remove it, running or not (False: there was none). Its volumes stay."""
        raise NotImplementedError

    async def restart_in_place(self, name: str) -> None:
        """Restart the command of a running job (a hang): the runner runs it again."""
        raise NotImplementedError

    async def logs(
        self,
        name: str,
        since: float | None = None,
        until: float | None = None,
        tail: int | None = None,
    ) -> bytes:
        """Its output between ``since`` and ``until`` (epoch seconds; an engine that cannot
        bound the end returns up to now), or its last ``tail`` lines; b"" when it is gone."""
        raise NotImplementedError

    def log_stream(
        self, name: str, follow: bool, tail: int | None = None, timestamps: bool = False
    ) -> LogStream:
        """Blocking: call it on a worker thread. Raises WorkloadGone. ``timestamps``: each
        line starts with the engine's RFC 3339 time and a space."""
        raise NotImplementedError

    async def exec_run(
        self, name: str, command: list[str], timeout: float, max_output: int
    ) -> tuple[int | None, bytes, bool]:
        """Run ``command`` in the running workload, as its user (1000:100) in its working
        directory, to its end or to ``timeout`` seconds (then it is killed, with what it
        started). Returns (exit code, None on time-out; stdout and stderr combined, at most
        ``max_output`` bytes; whether output was cut). Raises WorkloadGone when it is not
        running."""
        raise NotImplementedError

    async def exec_session(self, name: str, cols: int = 80, rows: int = 24) -> ExecSession:
        """Open an interactive shell (a TTY) in the running workload, as its user. Raises
        WorkloadGone when it is not running."""
        raise NotImplementedError

    async def cpu_time(self, name: str) -> int | None:
        """CPU nanoseconds used by the workload; None where the engine cannot tell."""
        return None

    async def labelled(self, instance: str, kind: str) -> list[Labelled]:
        """Every workload (running or not) of this instance and kind, with its labels."""
        raise NotImplementedError

    async def address(self, name: str, network_id: str) -> str:
        """The IP address of the running workload on the network ``network_id`` (what the
        hub's proxy connects to). Raises WorkloadGone when it has none there."""
        raise NotImplementedError

    # --- volumes and helpers --------------------------------------------------------------------

    async def volume_exists(self, name: str, node: str = "") -> bool:
        """Whether ``node`` (its own engine, on a cluster; "" on one engine) has the named
        volume. A cluster's node that is not in it (any more) has none; one that is down, or
        an engine that does not answer, raises (:class:`EngineUnreachable`): unknown, not
        absent."""
        raise NotImplementedError

    async def remove_volume(self, name: str, node: str = "") -> bool:
        """Remove the named volume from ``node`` (as :meth:`volume_exists` finds it): True
        when it is gone now (one engine says so of a volume that was not there too), False
        when the engine said there was none (or a cluster has no node of that name). A
        volume a container still uses (a running workload's, an ended one's not removed
        yet) is not removed: the engine's refusal comes up as an :class:`EngineError`
        (status 409), as does a node that is down (:class:`EngineUnreachable`): the caller
        tries again later."""
        raise NotImplementedError

    async def volumes_named(self, prefix: str, node: str | None = None) -> list[tuple[str, str]]:
        """(volume, node) of the volumes whose name starts with ``prefix``: one engine's
        (node ""), or every workload node's of a cluster that answers (a node that is down
        or does not answer is left out, logged: its volumes are found at a later call).
        With ``node``, that node's only (on a cluster, only its engine is asked; a node
        not in the cluster has none)."""
        raise NotImplementedError

    async def run_helper(self, spec: HelperSpec, on_line, node: str = "") -> HelperResult:
        """Run a short-lived helper (the sync, a clone) to its end on ``node``, next to the
        volume it mounts; ``on_line`` is called on the event loop with each line it prints."""
        raise NotImplementedError

    async def remove_helper_leftovers(self, instance: str) -> list[str]:
        """Remove what ``instance``'s helpers left in the engine apart from themselves when
        the process that ran them died (their :attr:`HelperSpec.files`, where the engine keeps
        them outside the helper: a Swarm's secrets), once no helper uses it and it is old
        enough that no helper being started now is about to; the names of what went. Called
        by the sweeps of orphaned helpers, after they removed those (a helper's
        :meth:`remove` takes its own files with it). One engine: nothing to do (a helper's
        files are in its container, removed with it)."""
        return []

    # --- networks -------------------------------------------------------------------------------

    async def ensure_user_network(self, instance: str, user: str) -> str:
        raise NotImplementedError

    async def ensure_job_network(self, instance: str, owner: str, job_id: str) -> str:
        """The ID of a distributed job's own network (made if missing)."""
        raise NotImplementedError

    async def remove_job_network(self, instance: str, job_id: str) -> None:
        """Remove a distributed job's network once its workloads ended (best effort: kept
        while the engine still counts a workload on it)."""
        raise NotImplementedError

    async def remove_user_network_if_unused(self, instance: str, user: str) -> bool:
        raise NotImplementedError

    async def prune_user_networks(self, instance: str) -> list[str]:
        raise NotImplementedError

    async def reach(self, name: str, network_id: str, path: str, port: int) -> tuple[str, int]:
        """(host, port) at which the hub and its proxy reach the workload's ``port`` for URLs
        under ``path``. One engine: its address on the user's bridge (the host reaches every
        bridge), or with no ``network_id`` the host port that ``port`` is published on. A
        Swarm: its notebook gateway (runtime/gateway.py)."""
        return await self.address(name, network_id), port

    async def unreach(self, path: str) -> None:
        """Forget what reach() set up for ``path`` (nothing on one engine)."""
        return None

    async def restore_routes(self, instance: str) -> list[str]:
        """Put back what reach() set up, after the engine lost it (nothing on one engine)."""
        return []


def read_tail(
    runtime: Runtime, name: str, keep: int, lines: int, timestamps: bool = False
) -> bytes:
    """The last ``keep`` bytes of a workload's output, from whole lines (blocking). The engine
    is asked for its last ``lines`` lines only, read as a stream into a buffer that never
    holds more than 2 x ``keep`` plus one chunk: however much it printed, reading it costs
    bounded memory. Raises WorkloadGone."""
    kept = bytearray()
    stream = runtime.log_stream(name, follow=False, tail=lines, timestamps=timestamps)
    try:
        for chunk in stream:
            kept += chunk
            if len(kept) > 2 * keep:
                del kept[:-keep]
    finally:
        with contextlib.suppress(Exception):
            stream.close()
    if len(kept) > keep:
        del kept[:-keep]
        cut = kept.find(b"\n")
        if 0 <= cut < len(kept) - 1:
            del kept[: cut + 1]  # not half a line
    return bytes(kept)
