"""The single-engine backend: one Docker engine, today's and ``make run``'s default.

Blocking SDK calls run on the runtime's shared thread pool (never on the event loop), wide
enough that one user's slow image pull or build does not queue another user's spawn behind it
(DockerSpawner uses a single worker thread by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

import docker
from docker.errors import APIError, NotFound

from ..faults import fault_point
from ..gpus.inventory import Inventory
from ..gpus.usage import DeviceUsage, NvmlUsage
from ..names import L_INSTANCE, L_KIND, L_NETWORK, L_USER
from . import network as net
from .base import (
    EngineError,
    EngineSurvey,
    ExecSession,
    HelperResult,
    HelperSpec,
    Labelled,
    LogStream,
    Node,
    PullProgress,
    Runtime,
    WorkloadGone,
    WorkloadRefused,
    WorkloadSpec,
    WorkloadState,
)
from .engine import ClientSource, EngineClient, engine_errors, stream_errors
from .execution import EngineExecSession, run_command
from .exits import ExitEvents
from .objects import (
    docker_epoch,
    gpu_delivery_refusal,
    helper_container_config,
    helper_files_archive,
    workload_container_config,
)
from .pulls import pull_blocking, pull_on_pool, registry_digest_blocking
from .survey import refs, survey_engine

log = logging.getLogger(__name__)

__all__ = ["DockerRuntime", "HelperResult"]


class DockerRuntime(Runtime):
    """One Docker engine: its calls go through the :class:`~.engine.EngineClient` it holds."""

    def __init__(
        self,
        client: ClientSource = None,
        workers: int = 32,
        gpu_mode: str = "device_request",
        runner_path: str = "",
        inventory: Inventory | None = None,
        registry: str = "",
    ):
        super().__init__(workers, registry)
        #: this engine's API, its calls on this runtime's pools
        self.engine = EngineClient(self.run, self.run_exec, client)
        self.gpu_mode = gpu_mode
        #: the job runner on this host, bind-mounted read-only into jobs' containers
        self.runner_path = runner_path
        #: how this host's GPUs were found (configured or NVML: make_runtime reads them once),
        #: or why there is none; None: no GPU, nothing read
        self.inventory = inventory
        #: this host's GPUs, the inventory's
        self.devices = tuple(inventory.devices) if inventory is not None else ()
        #: reads their usage with NVML (made at the first read: only the service reads)
        self._usage: NvmlUsage | None = None

    @property
    def client(self) -> docker.APIClient:
        return self.engine.client

    # --- exits, as the engine announces them (runtime/exits.py) -------------------------------

    _exits: ExitEvents | None = None

    @property
    def announces_exits(self) -> bool:
        return self._exits is not None and self._exits.following

    async def wait_exit(self, names: Sequence[str], timeout: float, since: float) -> bool:
        if self._exits is None:
            self._exits = ExitEvents(self.client)
        self._exits.start(asyncio.get_running_loop())
        return await self._exits.wait(names, timeout, since)

    # --- the cluster: one node, this host ---------------------------------------------------

    async def nodes(self) -> list[Node]:
        gpus = tuple(d.id for d in self.devices)
        return [Node(id="", hostname="", ready=True, active=True, gpus=gpus)]

    async def gpu_usage(self) -> dict[str, list[DeviceUsage]]:
        """This host's devices, read with NVML in this process (the service runs beside the
        engine); nothing when it has no GPU, or NVML cannot be read (said once, at WARNING)."""
        if not self.devices:
            return {}
        if self._usage is None:
            self._usage = NvmlUsage()
        found = await asyncio.to_thread(self._usage.read)
        return {"": found} if found else {}

    async def gpu_delivery_refusal(self) -> str | None:
        if not self.devices:
            return None
        info = await self.engine.call(self.client.info)
        return gpu_delivery_refusal(
            self.gpu_mode,
            len(self.devices),
            info.get("Runtimes") or {},
            info.get("DefaultRuntime") or "",
        )

    async def survey(self, images: Sequence[str], instance: str) -> EngineSurvey:
        return await survey_engine(self.engine, refs(self.image_ref, images), instance)

    async def image_exists(self, image: str, node: str = "") -> bool:
        try:
            await self.engine.call(self.client.inspect_image, image)
            return True
        except EngineError as e:
            if e.not_found:
                return False
            raise

    async def registry_digest(self, image: str, auth: dict[str, str] | None) -> str:
        return await self.engine.call(registry_digest_blocking, self.client, image, auth)

    async def pull_image(
        self,
        image: str,
        auth: dict[str, str] | None,
        on_progress: Callable[[PullProgress], None],
        node: str = "",
        max_bytes: int = 0,
    ) -> None:
        await pull_on_pool(
            self.engine.call, pull_blocking, self.client, image, auth, on_progress, max_bytes
        )

    async def image_command(self, image: str) -> list[str] | None:
        try:
            info = await self.engine.call(self.client.inspect_image, image)
        except EngineError as e:
            if e.not_found:
                return None
            raise
        return list((info.get("Config") or {}).get("Cmd") or []) or None

    async def image_labels(self, image: str) -> dict[str, str] | None:
        try:
            info = await self.engine.call(self.client.inspect_image, image)
        except EngineError as e:
            if e.not_found:
                return None
            raise
        return dict((info.get("Config") or {}).get("Labels") or {})

    # --- workloads --------------------------------------------------------------------------

    async def inspect_container(self, name: str) -> dict | None:
        try:
            return await self.engine.call(self.client.inspect_container, name)
        except EngineError as e:
            if e.not_found:
                return None
            raise

    async def create_and_start(self, spec: WorkloadSpec) -> None:
        config = workload_container_config(spec, self.gpu_mode, self.runner_path)
        host = config.pop("host_config")
        client = self.client
        instance = spec.labels.get(L_INSTANCE, "")

        def create():
            cleared = False  # a container left by an earlier attempt under this name removed
            looked = False  # the network looked for again after the engine said it was gone
            for attempt in (1, 2, 3):
                extra = {}
                if spec.network_job:  # a distributed job's own network, with its rank's name
                    owner = spec.labels.get(L_USER, "")
                    network = net.ensure_job_network(client, instance, owner, spec.network_job)
                    host["network_mode"] = network
                    endpoint = client.create_endpoint_config(aliases=list(spec.aliases))
                    extra["networking_config"] = client.create_networking_config(
                        {network: endpoint}
                    )
                elif spec.network_owner:  # joined by ID: unambiguous while a duplicate exists
                    host["network_mode"] = net.ensure_user_network(
                        client, instance, spec.network_owner, reuse=not looked
                    )
                    if L_NETWORK in spec.labels:
                        # the network it really joins (made again if a concurrent stop removed
                        # the one the caller saw): where the caller reaches it (Runtime.reach)
                        spec.labels = {**spec.labels, L_NETWORK: host["network_mode"]}
                        config["labels"] = spec.labels
                try:
                    client.create_container(
                        host_config=client.create_host_config(**host), **config, **extra
                    )
                    fault_point("engine:create")
                    client.start(spec.name)
                    return
                except APIError as e:
                    if attempt == 3:
                        raise
                    if e.status_code == 409 and "already in use" in str(e.explanation or e):
                        # an earlier attempt's container (a start cut short, a service that
                        # stopped between create and start): removed, then made anew, once
                        if cleared:
                            raise
                        with contextlib.suppress(NotFound):
                            client.remove_container(spec.name, force=True)
                        cleared = True
                        continue
                    # pruned between our look-up and our start (or the ID this process
                    # knew of it was stale): look again and make it again, once
                    joined = spec.network_owner or spec.network_job
                    if looked or not (joined and net.is_missing_network(e)):
                        raise
                    looked = True
                    if spec.network_owner:
                        net.forget_user_network(client, instance, spec.network_owner)
                    with contextlib.suppress(NotFound):  # created, its start refused
                        client.remove_container(spec.name, force=True)
                    cleared = True

        try:
            await self.engine.call(create)
        except EngineError as e:
            if e.status is None:
                raise
            # the engine answered and refused: definite
            raise WorkloadRefused(str(e), status=e.status, detail=e.detail) from e

    async def state(self, name: str) -> WorkloadState | None:
        info = await self.inspect_container(name)
        if info is None:
            return None
        st = info.get("State") or {}
        running = bool(st.get("Running"))
        code = st.get("ExitCode")
        return WorkloadState(
            running=running,
            exit_code=None if running or code is None else int(code),
            oom=bool(st.get("OOMKilled")),
            started_at=docker_epoch(st.get("StartedAt") or ""),
            error=st.get("Error") or "",
        )

    async def start_again(self, name: str) -> None:
        await self.engine.call(self.client.start, name)

    async def stop(self, name: str, grace: float) -> None:
        try:
            await self.engine.call(self.client.stop, name, timeout=int(grace))
        except EngineError as e:
            if not e.not_found:
                raise

    async def kill(self, name: str) -> None:
        try:
            await self.engine.call(self.client.kill, name)
        except EngineError as e:
            if not e.not_found:
                raise

    async def terminate(self, name: str, grace: float) -> None:
        try:
            await self.engine.call(self.client.kill, name, signal="SIGTERM")
        except EngineError as e:  # gone, or not running (409): nothing to ask
            if e.status not in (404, 409):
                raise

    async def remove(self, name: str) -> bool:
        try:
            await self.engine.call(self.client.remove_container, name, force=True, v=False)
            return True
        except EngineError as e:
            if e.not_found:
                return False
            raise

    async def restart_in_place(self, name: str) -> None:
        client = self.client

        def restart():
            ex = client.exec_create(
                name,
                ["sh", "-c", "touch /tmp/.gpulab-restart && kill -KILL $(cat /tmp/.gpulab-child)"],
                user="1000:100",
            )
            client.exec_start(ex["Id"])

        await self.engine.call(restart)

    async def logs(
        self,
        name: str,
        since: float | None = None,
        until: float | None = None,
        tail: int | None = None,
    ) -> bytes:
        kw: dict = {"stdout": True, "stderr": True}
        if since is not None:
            kw["since"] = since
        if until is not None:
            kw["until"] = until
        if tail is not None:
            kw["tail"] = tail
        try:
            return await self.engine.call(self.client.logs, name, **kw)
        except EngineError as e:
            if e.not_found:
                return b""
            raise

    def log_stream(
        self, name: str, follow: bool, tail: int | None = None, timestamps: bool = False
    ) -> LogStream:
        kw: dict = {"stdout": True, "stderr": True, "stream": True, "follow": follow}
        if timestamps:
            kw["timestamps"] = True
        if tail is not None:
            kw["tail"] = tail
        try:
            with engine_errors(self.engine.url):
                stream = self.client.logs(name, **kw)
        except EngineError as e:
            if e.not_found:
                raise WorkloadGone(name) from None
            raise
        return LogStream(stream_errors(iter(stream), self.engine.url), stream.close)

    async def exec_run(
        self, name: str, command: list[str], timeout: float, max_output: int
    ) -> tuple[int | None, bytes, bool]:
        return await self.engine.call_exec(
            run_command, self.client, name, command, timeout, max_output
        )

    async def exec_session(self, name: str, cols: int = 80, rows: int = 24) -> ExecSession:
        return await self.engine.call_exec(EngineExecSession, self.client, name, cols, rows)

    async def cpu_time(self, name: str) -> int | None:
        stats = await self.engine.call(self.client.stats, name, stream=False, one_shot=True)
        return int(stats.get("cpu_stats", {}).get("cpu_usage", {}).get("total_usage", 0))

    async def labelled(self, instance: str, kind: str) -> list[Labelled]:
        found = await self.labelled_containers(instance, kind)
        return [
            Labelled(
                id=c["Id"],
                name=(c.get("Names") or ["/"])[0].lstrip("/"),
                labels=c.get("Labels") or {},
                running=c.get("State") == "running",
            )
            for c in found
        ]

    async def labelled_containers(self, instance: str, kind: str) -> list[dict]:
        """Every container (running or not) of this instance and kind, with its labels."""
        return await self.engine.call(
            self.client.containers,
            all=True,
            filters={"label": [f"{L_INSTANCE}={instance}", f"{L_KIND}={kind}"]},
        )

    async def reach(self, name: str, network_id: str, path: str, port: int) -> tuple[str, int]:
        if network_id:
            return await self.address(name, network_id), port
        try:  # on the default bridge: the host port it is published on
            found = await self.engine.call(self.client.port, name, port)
        except EngineError as e:
            if e.not_found:
                raise WorkloadGone(name) from None
            raise
        if not found:
            raise WorkloadGone(f"{name} publishes no port {port}")
        ip = found[0]["HostIp"]
        return ("127.0.0.1" if ip in ("0.0.0.0", "") else ip), int(found[0]["HostPort"])

    async def address(self, name: str, network_id: str) -> str:
        found = await self.inspect_container(name)
        if found is None:
            raise WorkloadGone(name)
        for n in (found["NetworkSettings"].get("Networks") or {}).values():
            if n.get("NetworkID") == network_id and n.get("IPAddress"):
                return n["IPAddress"]
        raise WorkloadGone(f"{name} has no address on network {network_id[:12]}")

    # --- volumes and helpers ------------------------------------------------------------------

    async def volume_exists(self, name: str, node: str = "") -> bool:
        try:
            await self.engine.call(self.client.inspect_volume, name)
            return True
        except EngineError as e:
            if e.not_found:
                return False
            raise

    async def remove_volume(self, name: str, node: str = "") -> bool:
        try:
            await self.engine.call(self.client.remove_volume, name, force=True)
            return True
        except EngineError as e:
            if e.not_found:
                return False
            raise

    async def volumes_named(self, prefix: str, node: str | None = None) -> list[tuple[str, str]]:
        # (one engine: every node is this one)
        vols = await self.engine.call(self.client.volumes, filters={"name": prefix})
        return [
            (v["Name"], "")
            for v in (vols or {}).get("Volumes") or []
            if v["Name"].startswith(prefix)
        ]

    async def run_helper(self, spec: HelperSpec, on_line, node: str = "") -> HelperResult:
        config = helper_container_config(spec)
        loop = asyncio.get_running_loop()

        def threadsafe(line: str) -> None:
            loop.call_soon_threadsafe(on_line, line)

        files = helper_files_archive(spec) if spec.files else None
        return await self.engine.call(_run_helper_blocking, self.client, config, threadsafe, files)

    # --- networks -----------------------------------------------------------------------------

    async def ensure_user_network(self, instance: str, user: str) -> str:
        return await self.engine.call(net.ensure_user_network, self.client, instance, user)

    async def ensure_job_network(self, instance: str, owner: str, job_id: str) -> str:
        return await self.engine.call(net.ensure_job_network, self.client, instance, owner, job_id)

    async def remove_job_network(self, instance: str, job_id: str) -> None:
        await self.engine.call(net.remove_job_network, self.client, instance, job_id)

    async def remove_user_network_if_unused(self, instance: str, user: str) -> bool:
        return await self.engine.call(
            net.remove_user_network_if_unused, self.client, instance, user
        )

    async def prune_user_networks(self, instance: str) -> list[str]:
        users = await self.engine.call(net.prune_user_networks, self.client, instance)
        jobs = await self.engine.call(net.prune_job_networks, self.client, instance)
        return users + [f"job {j}" for j in jobs]


def _run_helper_blocking(
    client: docker.APIClient, config: dict, on_line, files: bytes | None = None
) -> HelperResult:
    """Create, start and follow a helper container to its end; always remove it. ``files``
    (its secret files, an archive) are copied into the created container before it starts:
    they never appear in its configuration."""
    host_config = client.create_host_config(**config["host_config"])
    kwargs = {k: v for k, v in config.items() if k != "host_config"}
    container = client.create_container(host_config=host_config, **kwargs)
    cid = container["Id"]
    lines: list[str] = []
    try:
        if files is not None:
            client.put_archive(cid, "/", files)
        client.start(cid)
        fault_point("helper:started")
        buf = b""
        for chunk in client.logs(cid, stdout=True, stderr=True, stream=True, follow=True):
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                text = line.decode(errors="replace")
                lines.append(text)
                on_line(text)
        if buf:
            lines.append(buf.decode(errors="replace"))
            on_line(lines[-1])
        code = client.wait(cid, timeout=600)["StatusCode"]
        return HelperResult(int(code), lines)
    finally:
        with contextlib.suppress(NotFound):
            client.remove_container(cid, force=True)
