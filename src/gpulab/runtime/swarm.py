"""The Docker Swarm backend: one gpulab over a cluster of Docker engines, through a manager.

A workload is a Swarm service of one task, pinned by a placement constraint to the node that
gpulab's ledger chose (``node.hostname==...``), with restart condition ``none``: Swarm runs it
where it is told and never moves or restarts it on its own; gpulab decides. Its volumes are
named local volumes of that node (created by the task's mounts); the sync helper is a service
of one task pinned to the same node, mounting the same volume. Nothing comes from the hub's
host: the job runner is a Swarm config, images come from a registry (the site's, which the
nodes pull from by name; a user's own image, pulled onto the node with the user's credentials
before the service is made, and run by its digest).

What the manager's API cannot do, and what gpulab does instead (ARCHITECTURE.md):
- exec into a task: users' execs and shells go to the engine of the task's node
  (runtime/swarm_nodes.py, ``swarm_node_engine``);
- exec into a task for a hang restart, and ``docker start`` of an ended container: the service is
  force-updated, which runs a new task on the same node with the same volumes;
- read a task's CPU time: hang detection on Swarm judges by output alone;
- pull an image onto one node with a user's credentials, say whether a node has an image, and
  find, list or remove a node's volumes: asked of that node's own engine
  (``NodeEngines.of_node``), as an exec is.

A user's image is run by the digest the registry gave them (``NAME@sha256:...``) and the
service is made without their credentials (no ``X-Registry-Auth``: Swarm would keep them in
the service's spec, in its raft store, and hand them to every task). None is needed: the task
is pinned to the node that holds that digest, and a node's engine does not pull an image
named by a digest it has; a task made again (a hang restart, a retry) runs on the same node.
A job that moves (its node lost) goes through its image's preparation again, on its new node.
Not covered: a node's copy removed (``docker image prune``) before a hang restart or a start
of a stopped job; the new task's pull then goes without credentials and fails with the task's
error (docs/images.md says so).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import time
from collections.abc import Callable, Sequence

import docker
import requests
import urllib3
from docker.errors import APIError, NotFound
from docker.tls import TLSConfig
from docker.types.daemon import CancellableStream

from .. import __version__
from ..faults import fault_point
from ..gpus.agent import TAIL as AGENT_TAIL
from ..gpus.agent import latest_readings, max_age
from ..gpus.usage import DeviceUsage
from ..names import L_INSTANCE, L_KIND, L_NETWORK, L_USER, gpu_agent_service_name
from . import network as net
from .base import (
    EngineError,
    EngineSurvey,
    EngineUnreachable,
    ExecSession,
    HelperResult,
    HelperSpec,
    ImagePullFailed,
    Labelled,
    LogStream,
    Node,
    PullProgress,
    Runtime,
    StillRunning,
    WorkloadGone,
    WorkloadRefused,
    WorkloadSpec,
    WorkloadState,
)
from .engine import (
    ClientSource,
    EngineClient,
    client_url,
    engine_errors,
    shown_url,
    stream_errors,
)
from .execution import EngineExecSession, run_command
from .gateway import Gateway
from .objects import helper_container_config
from .pulls import pull_blocking, pull_on_pool, registry_digest_blocking
from .survey import survey_engine
from .swarm_network import SwarmNetwork, service_named
from .swarm_nodes import (
    GpuDeliveryChecks,
    NodeEngines,
    NodeMissing,
    labelled_model,
    labelled_pools,
)
from .swarm_specs import (
    HELPER_SECRET_GRACE,
    HELPER_TIMEOUT,
    L_NODE,
    L_SPEC,
    L_STOPPED,
    LIVE,
    NOWHERE,
    START_TIMEOUT,
    engine_time,
    gpu_agent_spec,
    helper_secret_labels,
    helper_secret_of,
    helper_service_spec,
    leftover_helper_secrets,
    made_for,
    referenced_secrets,
    service_spec,
    task_state,
)

log = logging.getLogger(__name__)

#: how long a removal waits for the manager to forget the service (then: an EngineError)
REMOVE_TIMEOUT = 30.0
#: seconds the manager may keep the GPU agents' output coming (a node that does not answer)
AGENT_LOGS_TIMEOUT = 5.0
#: the most bytes of it read (three lines per node)
AGENT_LOGS_CAP = 4 * 1024**2


class SwarmRuntime(Runtime):
    """A Swarm, through its manager: the manager's API through the
    :class:`~.engine.EngineClient` it holds, users' reach and networks through its
    :class:`~.swarm_network.SwarmNetwork`."""

    clustered = True
    images_at = "in the registry"
    #: seconds a helper's secret that no service references is left alone (it may be a
    #: helper's being started: :meth:`remove_helper_leftovers`)
    helper_secret_grace = HELPER_SECRET_GRACE

    def __init__(
        self,
        client: ClientSource = None,
        workers: int = 32,
        registry: str = "",
        gpu_label: str = "org.gpulab.gpus",
        runner_script: str = "",
        gateway: Gateway | None = None,
        node_engine: str = "tcp://{address}:2376",
        node_tls: TLSConfig | None = None,
        node_engine_plain: bool = False,
        encrypted: bool = True,
        check_gpus: bool = False,
        gpu_agent_image: str = "",
        gpu_agent_interval: float = 10.0,
    ):
        super().__init__(workers, registry)
        #: the manager's API, its calls on this runtime's pools
        self.engine = EngineClient(self.run, self.run_exec, client)
        #: the nodes' own engines, for execs, users' image pulls and the nodes' volumes
        #: (runtime/swarm_nodes.py)
        self.node_engines = NodeEngines(node_engine, node_tls, plain=node_engine_plain)
        #: whether each GPU node's engine can hand its GPUs out (check_gpu_runtime; None: off)
        self.gpu_checks = GpuDeliveryChecks(self.node_engines.info) if check_gpus else None
        #: users' and distributed jobs' overlays carry their traffic between nodes in IPsec
        self.encrypted = encrypted
        #: how the hub reaches notebooks on the overlays (None: jobs only, no notebooks)
        self.gateway = gateway
        #: workloads' addresses, the gateway's routes, the users' and jobs' overlays
        self.network = SwarmNetwork(self.engine, gateway, encrypted)
        self.gpu_label = gpu_label
        self.runner_script = runner_script
        self._runner_ref: dict | None = None
        self._own_node: str | None = None
        #: the nodes' GPU agent (gpus/agent.py): its image ("" none), interval, service name
        #: (known once watch_gpus was asked), and its last readings, kept a few seconds
        self.gpu_agent_image = gpu_agent_image
        self.gpu_agent_interval = gpu_agent_interval
        self._agent_name = self._agent_instance = ""
        self._agent_checked = 0.0
        self._usage_lock: asyncio.Lock | None = None
        self._usage: tuple[float, dict[str, list[DeviceUsage]]] = (-1e9, {})

    @property
    def client(self) -> docker.APIClient:
        return self.engine.client

    # --- the cluster ------------------------------------------------------------------------

    def log_gpus(self, logger) -> None:
        logger.info("GPUs: each node's, as its node label %s lists them", self.gpu_label)

    def _nodes(self) -> list[dict]:
        return self.client.nodes()

    def _own_node_id(self) -> str:
        """The node of the engine the hub talks to (the manager the hub runs beside)."""
        if self._own_node is None:
            self._own_node = (self.client.info().get("Swarm") or {}).get("NodeID") or ""
        return self._own_node

    async def nodes(self) -> list[Node]:
        """Every node; the hub's own node never takes workloads (``active`` False): it runs the
        hub, its proxy and the notebook gateway, and stays ``active`` in Swarm's eyes only
        because a drained node cannot attach the gateway to overlays (moby#35889). With
        ``check_gpus``, each ready and active node with GPUs is asked through its own engine
        whether it can hand them out (:class:`~.swarm_nodes.GpuDeliveryChecks`, when due):
        ``gpus_refused`` says why not."""
        own = await self.engine.call(self._own_node_id)
        out, urls = [], {}
        listed = await self.engine.call(self._nodes)
        shared = hostnames_shared(listed)
        for n in listed:
            spec, status = n.get("Spec") or {}, n.get("Status") or {}
            labels = spec.get("Labels") or {}
            gpus = tuple(g.strip() for g in labels.get(self.gpu_label, "").split(",") if g.strip())
            hostname = (n.get("Description") or {}).get("Hostname", "")
            out.append(
                Node(
                    id=n["ID"],
                    hostname=hostname,
                    ready=status.get("State") == "ready",
                    active=spec.get("Availability") == "active"
                    and n["ID"] != own
                    and hostname not in shared,
                    gpus=gpus,
                    address=status.get("Addr", ""),
                    gpu_model=labelled_model(labels),
                    pools=labelled_pools(labels),
                )
            )
            if self.gpu_checks is not None:
                urls[n["ID"]] = self.node_engines.url(n)
        checks = self.gpu_checks
        if checks is None:
            return out
        due = [n for n in out if n.ready and n.active and checks.due(n.id, len(n.gpus))]
        # (on the engine pool; a check never raises: a node that does not answer is kept out)
        await asyncio.gather(
            *(
                self.engine.call(checks.check, n.id, n.hostname, urls[n.id], len(n.gpus))
                for n in due
            )
        )
        return [dataclasses.replace(n, gpus_refused=checks.refusal(n.id, len(n.gpus))) for n in out]

    async def gpu_delivery_refusal(self) -> str | None:
        """None: a Swarm is never refused as a whole. Each GPU node's engine is asked instead
        (:meth:`nodes`, here at start-up so that its log says it at once): a node that cannot
        hand its GPUs out keeps them out of placement, named in an ERROR line with what to
        configure, while the others work."""
        await self.nodes()
        return None

    # --- the nodes' GPUs: the GPU agent ------------------------------------------------------

    async def watch_gpus(self, instance: str) -> None:
        """Make the GPU agent (``gpu_agent_spec``) as asked, or bring it up to date, or remove
        it when it is turned off. The manager's failure to answer is logged, not raised: GPU
        usage is then unknown, and :meth:`gpu_usage` tries again."""
        self._agent_name = gpu_agent_service_name(instance)
        self._agent_instance = instance
        self._agent_checked = time.monotonic()
        try:
            await self.engine.call(self._watch_gpus_blocking, instance)
        except EngineError as e:
            log.warning("the GPU agent %s was not set up: %s", self._agent_name, e)

    def _watch_gpus_blocking(self, instance: str) -> None:
        name = self._agent_name
        found = self._service(name)
        if not self.gpu_agent_image:
            if found is not None:
                with_suppress_notfound(self.client.remove_service, found["ID"])
                log.info("GPU agent %s removed (swarm_gpu_agent is off)", name)
            return
        body = gpu_agent_spec(
            name,
            self.image_ref(self.gpu_agent_image),
            self.gpu_agent_interval,
            instance,
            self._own_node_id(),
            __version__,
        )
        if found is None:
            try:
                self._post_service(body)
            except APIError as e:
                if e.status_code != 409:  # 409: another service process made it meanwhile
                    raise
            log.info("GPU agent %s started: a task on every node but this one", name)
            return
        if (found["Spec"].get("Labels") or {}).get(L_SPEC) == body["Labels"][L_SPEC]:
            return
        self._write_spec(found, body)
        log.info("GPU agent %s updated", name)

    async def gpu_usage(self) -> dict[str, list[DeviceUsage]]:
        """Each node's newest reading from its agent that is fresh enough (``max_age`` of the
        interval), from the agent service's last lines per task; read at most every few
        seconds (callers in between share it). A node without a fresh reading is left out
        (unknown). An agent found missing is made again, at most once a minute."""
        if not self.gpu_agent_image or not self._agent_name:
            return {}
        if self._usage_lock is None:
            self._usage_lock = asyncio.Lock()
        async with self._usage_lock:
            at, readings = self._usage
            if time.monotonic() - at < min(5.0, self.gpu_agent_interval / 2):
                return readings
            try:
                lines = await self.engine.call(self._agent_lines, self._agent_name)
            except EngineError as e:
                log.warning("GPU usage not read from the agents: %s", e)
                lines = []
            if lines is None:  # no agent service (removed behind gpulab's back?)
                lines = []
                if time.monotonic() - self._agent_checked > 60:
                    await self.watch_gpus(self._agent_instance)
            readings = latest_readings(lines, time.time(), max_age(self.gpu_agent_interval))
            self._usage = (time.monotonic(), readings)
            return readings

    def _agent_lines(self, name: str) -> list[bytes] | None:
        """The agent tasks' last lines (None: no such service). A node that does not answer
        within ``AGENT_LOGS_TIMEOUT`` leaves the lines that came."""
        client = self.client
        res = client._get(
            client._url("/services/{0}/logs", name),
            params=self._logs_params(False, None, AGENT_TAIL),
            stream=True,
            timeout=AGENT_LOGS_TIMEOUT,
        )
        if res.status_code == 404:
            res.close()
            return None
        client._raise_for_status(res)
        out = bytearray()
        try:
            for chunk in client._multiplexed_response_stream_helper(res):
                out += chunk
                if len(out) > AGENT_LOGS_CAP:
                    break
        except (OSError, requests.RequestException, urllib3.exceptions.HTTPError) as e:
            log.info("GPU agents' output cut short (%s): the rest counts as unknown", e)
        finally:
            res.close()
        return bytes(out).splitlines()

    async def survey(self, images: Sequence[str], instance: str) -> EngineSurvey:
        """The manager's engine; no image is asked about (they are in the registry, whose
        labels a manager does not show), and its daemon.json is read only where it runs."""
        return await survey_engine(self.engine, {}, instance, local=False)

    async def image_exists(self, image: str, node: str = "") -> bool:
        """Without ``node``: asked of the registry (through the manager), what every node
        will pull. With one: asked of that node's own engine; a node that left the cluster
        (or counts as gone) is an EngineError: the workload placed there is placed again."""
        if node:
            return await self.engine.call(self._node_has_image, node, image)
        try:
            await self.engine.call(self.client.inspect_distribution, image)
            return True
        except EngineError as e:  # the registry answered: it has none
            if e.status is None:
                raise
            return False

    def _node_has_image(self, node: str, image: str) -> bool:
        try:
            client, url = self.node_engines.of_node(self.client, node)
        except NodeMissing as e:  # the job's image is not the cause: it is placed again
            raise _node_lost(e) from None
        with self.node_engines.calling(url):
            try:
                client.inspect_image(image)
                return True
            except NotFound:
                return False

    async def registry_digest(self, image: str, auth: dict[str, str] | None) -> str:
        """Asked through the manager's engine, with the caller's credentials for this one
        call: the registry's consent, whichever node pulls."""
        return await self.engine.call(registry_digest_blocking, self.client, image, auth)

    async def pull_image(
        self,
        image: str,
        auth: dict[str, str] | None,
        on_progress: Callable[[PullProgress], None],
        node: str = "",
        max_bytes: int = 0,
    ) -> None:
        """Pulled by ``node``'s own engine (the one that runs it), the credentials in the
        pull's ``X-Registry-Auth`` header only (``docker pull`` stores them nowhere)."""
        if not node:
            raise ImagePullFailed("an image is pulled onto the node that runs it: none was named")
        await pull_on_pool(
            self.engine.call, self._pull_on_node, node, image, auth, on_progress, max_bytes
        )

    def _pull_on_node(self, node: str, image: str, auth, on_progress, max_bytes, given_up):
        try:
            client, url = self.node_engines.of_node(self.client, node)
        except NodeMissing as e:
            raise _node_lost(e) from None
        with self.node_engines.calling(url):
            pull_blocking(client, image, auth, on_progress, max_bytes, given_up)

    # --- workloads --------------------------------------------------------------------------

    def _runner(self) -> dict:
        """The job runner as a Swarm config (created once per content; configs are immutable)."""
        if self._runner_ref is None:
            digest = hashlib.sha256(self.runner_script.encode()).hexdigest()[:12]
            name = f"gpulab-runner-{digest}"
            found = [c for c in self.client.configs(filters={"name": name}) if _named(c, name)]
            if not found:
                try:
                    self.client.create_config(
                        name, self.runner_script.encode(), labels={L_KIND: "runner"}
                    )
                except APIError as e:
                    if e.status_code != 409:
                        raise
                found = [c for c in self.client.configs(filters={"name": name}) if _named(c, name)]
            self._runner_ref = {"ConfigID": found[0]["ID"], "ConfigName": name}
        return self._runner_ref

    def _create_blocking(self, spec: WorkloadSpec) -> None:
        client = self.client
        with_suppress_notfound(client.remove_service, spec.name)
        if not self._wait_gone(spec.name, REMOVE_TIMEOUT):
            raise EngineError(f"service {spec.name} is still there: it cannot be made anew")
        network_id = None
        instance = spec.labels.get(L_INSTANCE, "")
        if spec.network_job:  # a distributed job's own overlay (its rank's alias on it)
            owner = spec.labels.get(L_USER, "")
            network_id = net.ensure_job_network(
                client, instance, owner, spec.network_job, "overlay", self.encrypted
            )
        elif spec.network_owner:
            network_id = net.ensure_user_network(
                client, instance, spec.network_owner, "overlay", self.encrypted
            )
        if network_id and L_NETWORK in spec.labels:
            # the overlay it really joins (made again if a concurrent stop removed the one the
            # caller saw): the gateway is attached to this one
            spec.labels = {**spec.labels, L_NETWORK: network_id}
        body = service_spec(spec, self._runner() if spec.runner else None, network_id)
        self._post_service(body)
        fault_point("engine:create")
        # started means its command runs, as on one engine: wait while the node pulls the image
        # and starts the container (an ended or rejected task is the watcher's to read)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            svc = self._service(spec.name)
            tasks = self.client.tasks(filters={"service": svc["ID"]}) if svc else []
            states = {(t.get("Status") or {}).get("State") for t in tasks}
            if not states or states & {
                "new",
                "pending",
                "assigned",
                "accepted",
                "preparing",
                "ready",
                "starting",
            }:
                time.sleep(0.2)
                continue
            return

    def _post_service(self, body: dict) -> str:
        client = self.client
        res = client._post_json(client._url("/services/create"), data=body)
        return client._result(res, json=True)["ID"]

    async def create_and_start(self, spec: WorkloadSpec) -> None:
        try:
            await self.engine.call(self._create_blocking, spec)
        except EngineError as e:
            if e.status is None:
                raise
            # the manager answered and refused: definite
            raise WorkloadRefused(str(e), status=e.status, detail=e.detail) from e

    def _service(self, name: str) -> dict | None:
        return service_named(self.client, name)

    def _state_blocking(self, name: str) -> WorkloadState | None:
        svc = self._service(name)
        if svc is None:
            return None
        try:
            tasks = self.client.tasks(filters={"service": svc["ID"]})
        except NotFound:  # removed between the two reads (its stop or its clean-up): gone
            return None
        hostname = (svc["Spec"].get("Labels") or {}).get(L_NODE, "")
        nodes = self._nodes()
        if hostname:
            node = next((n for n in nodes if n["Description"].get("Hostname") == hostname), None)
        else:  # not pinned (a helper that may run on any node): where its task went
            newest = max(tasks, key=lambda t: t.get("CreatedAt") or "", default=None)
            if newest is None or not newest.get("NodeID"):
                return WorkloadState(running=True)  # being scheduled
            node = next((n for n in nodes if n["ID"] == newest["NodeID"]), None)
        return task_state(tasks, node, L_STOPPED in (svc["Spec"].get("Labels") or {}))

    async def state(self, name: str) -> WorkloadState | None:
        return await self.engine.call(self._state_blocking, name)

    def _update(self, name: str, change) -> None:
        """Read the service's spec, change it, write it back at the version read."""
        svc = self.client.inspect_service(name)
        spec = svc["Spec"]
        change(spec)
        self._write_spec(svc, spec)

    def _write_spec(self, svc: dict, spec: dict) -> None:
        """Write ``spec`` as the service's, at the version ``svc`` was read at (the raw call:
        the SDK's update_service rebuilds a spec and drops what it does not model)."""
        client = self.client
        res = client._post_json(
            client._url("/services/{0}/update", svc["ID"]),
            data=spec,
            params={"version": svc["Version"]["Index"]},
        )
        client._raise_for_status(res)

    def _start_again_blocking(self, name: str) -> None:
        def change(spec: dict) -> None:
            spec["Mode"] = {"Replicated": {"Replicas": 1}}
            (spec.get("Labels") or {}).pop(L_STOPPED, None)
            task = spec["TaskTemplate"]
            placement = task.setdefault("Placement", {})
            placement["Constraints"] = [
                c for c in placement.get("Constraints") or [] if c != NOWHERE
            ]
            task["ForceUpdate"] = int(task.get("ForceUpdate") or 0) + 1

        self._update(name, change)

    async def start_again(self, name: str) -> None:
        await self.engine.call(self._start_again_blocking, name)

    def _stop_blocking(self, name: str, grace: float) -> None:
        try:
            self._update(name, _stopping(grace))
        except NotFound:
            return
        deadline = time.monotonic() + grace + 20
        while time.monotonic() < deadline:
            found = self._state_blocking(name)
            if found is None or not found.running:
                return
            time.sleep(0.5)
        # not confirmed: the caller keeps its GPUs (and tries again, or kills)
        raise StillRunning(f"{name} still runs {grace + 20:g} s after it was told to stop")

    async def stop(self, name: str, grace: float) -> None:
        await self.engine.call(self._stop_blocking, name, grace)

    async def kill(self, name: str) -> None:
        await self.stop(name, 0)

    async def terminate(self, name: str, grace: float) -> None:
        def ask() -> None:
            with contextlib.suppress(NotFound):
                self._update(name, _stopping(grace))

        await self.engine.call(ask)

    def _wait_gone(self, name: str, timeout: float) -> bool:
        """Whether the manager has forgotten the service within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self._service(name) is not None:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)
        return True

    async def remove(self, name: str) -> bool:
        """Remove the service, then, once the manager has forgotten it and its node's engine
        has removed its container (:meth:`_wait_container_gone`: its volumes can then be
        removed at once, as on one engine), the secrets gpulab made for it (a helper's files:
        a helper whose process died, removed by the sweep of orphaned helpers, leaves them
        otherwise)."""
        return await self.engine.call(self._remove_blocking, name)

    def _remove_blocking(self, name: str) -> bool:
        svc = self._service(name)
        if svc is None:
            return False
        try:
            self.client.remove_service(svc["ID"])
        except NotFound:
            return False
        # confirmed gone, or an error: what it held (GPUs) is released only after this
        if not self._wait_gone(svc["ID"], REMOVE_TIMEOUT):
            raise EngineError(
                f"service {name} is still there {REMOVE_TIMEOUT:g} s after its removal"
            )
        hostname = (svc["Spec"].get("Labels") or {}).get(L_NODE, "")
        self._wait_container_gone(svc["ID"], svc["Spec"].get("Name"), hostname, REMOVE_TIMEOUT)
        self._remove_secrets_of(svc)
        return True

    def _wait_container_gone(self, sid: str, name: str, hostname: str, timeout: float) -> None:
        """Wait until the engine of node ``hostname`` has removed the containers of service
        ``sid`` (named ``name``), removed from the manager: its agent does so a moment after
        the manager forgot the service (0.3 s for an ended task in the lab; a running one's
        after its stop grace), and until then the node refuses to remove the volumes they
        mount. A node that is down or gone, or whose engine does not answer, is not waited
        for; nor is one past ``timeout`` (its volumes' removal then says what holds them)."""
        if not hostname:
            return
        label = f"com.docker.swarm.service.id={sid}"
        deadline = time.monotonic() + timeout
        try:
            client, url = self.node_engines.of_node(self.client, hostname)
            while True:
                with self.node_engines.calling(url):
                    left = client.containers(all=True, filters={"label": label})
                if not left:
                    return
                if time.monotonic() > deadline:
                    log.warning(
                        "service %s: its container is still on node %s %g s after its removal",
                        name,
                        hostname,
                        timeout,
                    )
                    return
                time.sleep(0.1)
        except (NodeMissing, EngineError) as e:
            log.info("service %s: its container on %s not waited for: %s", name, hostname, e)

    def _remove_secrets_of(self, svc: dict) -> None:
        """The secrets that gpulab made for the removed service ``svc`` (labelled with its
        instance and its name: :func:`~.swarm_specs.made_for`); never another's. One not
        removed now stays for :meth:`remove_helper_leftovers`."""
        for secret_id in referenced_secrets(svc):
            try:
                secret = self.client.inspect_secret(secret_id)
            except NotFound:
                continue
            except APIError as e:
                log.warning("helper secret %s not read: %s", secret_id, e.explanation or e)
                continue
            if made_for(secret, svc):
                _remove_secret(self.client, secret_id)

    async def remove_helper_leftovers(self, instance: str) -> list[str]:
        """The secrets of ``instance``'s helpers that no service references, made at least
        ``HELPER_SECRET_GRACE`` seconds ago by the manager's clock: a helper's process died
        between making them and making its service, or its service was removed without them
        (:func:`~.swarm_specs.leftover_helper_secrets`)."""
        return await self.engine.call(self._remove_leftovers_blocking, instance)

    def _remove_leftovers_blocking(self, instance: str) -> list[str]:
        client = self.client
        found = [
            s
            for s in client.secrets(filters={"label": f"{L_INSTANCE}={instance}"})
            if helper_secret_of(s, instance)
        ]
        if not found:  # the usual case: no service listed
            return []
        now = engine_time(client.info().get("SystemTime") or "") or time.time()
        removed = []
        services = client.services()
        for s in leftover_helper_secrets(found, services, instance, now, self.helper_secret_grace):
            name = (s.get("Spec") or {}).get("Name") or s["ID"]
            try:
                client.remove_secret(s["ID"])
            except NotFound:  # its helper's own clean-up took it meanwhile
                continue
            except APIError as e:  # in use (a service made since): it is not a leftover
                log.warning("helper secret %s not removed: %s", name, e.explanation or e)
                continue
            removed.append(name)
        return removed

    async def restart_in_place(self, name: str) -> None:
        # no exec through a manager: a new task on the same node, with the same volumes
        await self.start_again(name)

    def _exec_blocking(self, name: str, command: list[str], timeout: float, cap: int):
        node, container = self.node_engines.locate(self.client, name)
        with self.node_engines.calling(client_url(node)):  # the node's engine, not the manager
            return run_command(node, container, command, timeout, cap)

    async def exec_run(
        self, name: str, command: list[str], timeout: float, max_output: int
    ) -> tuple[int | None, bytes, bool]:
        """On the engine of the node that runs the task (the manager has no exec)."""
        return await self.engine.call_exec(self._exec_blocking, name, command, timeout, max_output)

    def _session_blocking(self, name: str, cols: int, rows: int) -> ExecSession:
        node, container = self.node_engines.locate(self.client, name)
        with self.node_engines.calling(client_url(node)):  # the node's engine, not the manager
            return EngineExecSession(node, container, cols, rows)

    async def exec_session(self, name: str, cols: int = 80, rows: int = 24) -> ExecSession:
        return await self.engine.call_exec(self._session_blocking, name, cols, rows)

    def _logs_params(self, follow: bool, since: float | None, tail: int | None) -> dict:
        return {
            "follow": follow,
            "stdout": True,
            "stderr": True,
            "since": int(since or 0),
            "tail": str(tail) if tail is not None else "all",
            "timestamps": False,
            "details": False,
        }

    def _open_logs(self, name: str, follow: bool, since=None, tail=None, timestamps=False):
        client = self.client
        params = self._logs_params(follow, since, tail)
        if timestamps:
            params["timestamps"] = True
        res = client._get(
            client._url("/services/{0}/logs", name),
            params=params,
            stream=True,
        )
        if res.status_code == 404:
            res.close()
            raise WorkloadGone(name)
        client._raise_for_status(res)
        return res, client._multiplexed_response_stream_helper(res)

    async def logs(self, name, since=None, until=None, tail=None) -> bytes:
        def read() -> bytes:
            try:
                res, chunks = self._open_logs(name, False, since, tail)
            except WorkloadGone:
                return b""
            try:
                return b"".join(chunks)
            finally:
                res.close()

        return await self.engine.call(read)

    def log_stream(
        self, name: str, follow: bool, tail: int | None = None, timestamps: bool = False
    ) -> LogStream:
        with engine_errors(self.engine.url):
            res, chunks = self._open_logs(name, follow, None, tail, timestamps)
        stream = CancellableStream(chunks, res)
        return LogStream(stream_errors(iter(stream), self.engine.url), stream.close)

    async def labelled(self, instance: str, kind: str) -> list[Labelled]:
        def read() -> list[Labelled]:
            services = self.client.services(
                filters={"label": [f"{L_INSTANCE}={instance}", f"{L_KIND}={kind}"]}
            )
            live = {
                t["ServiceID"]
                for t in self.client.tasks(filters={"desired-state": "running"})
                if (t.get("Status") or {}).get("State") in LIVE
            }
            return [
                Labelled(
                    id=s["ID"],
                    name=s["Spec"]["Name"],
                    labels=s["Spec"].get("Labels") or {},
                    # a stopped service's unplaceable task "wants" to run: it does not
                    running=s["ID"] in live and L_STOPPED not in (s["Spec"].get("Labels") or {}),
                    node=(s["Spec"].get("Labels") or {}).get(L_NODE, ""),
                )
                for s in services
            ]

        return await self.engine.call(read)

    # --- reach and networks: the SwarmNetwork's -----------------------------------------------

    async def address(self, name: str, network_id: str) -> str:
        return await self.network.address(name, network_id)

    async def reach(self, name: str, network_id: str, path: str, port: int) -> tuple[str, int]:
        return await self.network.reach(name, network_id, path, port)

    async def unreach(self, path: str) -> None:
        await self.network.unreach(path)

    async def restore_routes(self, instance: str) -> list[str]:
        return await self.network.restore_routes(instance)

    async def ensure_user_network(self, instance: str, user: str) -> str:
        return await self.network.ensure_user_network(instance, user)

    async def ensure_job_network(self, instance: str, owner: str, job_id: str) -> str:
        return await self.network.ensure_job_network(instance, owner, job_id)

    async def remove_job_network(self, instance: str, job_id: str) -> None:
        await self.network.remove_job_network(instance, job_id)

    async def remove_user_network_if_unused(self, instance: str, user: str) -> bool:
        return await self.network.remove_user_network_if_unused(instance, user)

    async def prune_user_networks(self, instance: str) -> list[str]:
        return await self.network.prune_user_networks(instance)

    # --- volumes and helpers ----------------------------------------------------------------

    async def volume_exists(self, name: str, node: str = "") -> bool:
        """Asked of ``node``'s own engine; "" (no node: nothing was placed) or a node that
        left the cluster has none."""
        return await self.engine.call(self._on_node_volume, node, name, False)

    async def remove_volume(self, name: str, node: str = "") -> bool:
        """Removed by ``node``'s own engine, which refuses (409) a volume a container uses."""
        return await self.engine.call(self._on_node_volume, node, name, True)

    def _on_node_volume(self, node: str, name: str, remove: bool) -> bool:
        if not node:
            return False
        try:
            client, url = self.node_engines.of_node(self.client, node)
        except NodeMissing as e:  # left the cluster, or down past its grace: gone with it
            if remove:
                log.warning("volume %s is left on node %s: %s", name, node, e)
            return False
        with self.node_engines.calling(url):
            try:
                if remove:  # (no force: a volume that is not there is the engine's 404)
                    client.remove_volume(name)
                else:
                    client.inspect_volume(name)
                return True
            except NotFound:
                return False

    async def volumes_named(self, prefix: str, node: str | None = None) -> list[tuple[str, str]]:
        """Every workload node's, each asked at once through its own engine; a node that
        does not answer is left out (logged). With ``node``, only that node's engine is
        asked."""
        if node is not None:
            nodes = await self.engine.call(self._node_url, node)
        else:
            own = await self.engine.call(self._own_node_id)
            nodes = await self.engine.call(self.node_engines.workload_nodes, self.client, own)
        found = await asyncio.gather(
            *(self.engine.call(self._volumes_on, url, prefix) for _, url in nodes),
            return_exceptions=True,
        )
        out = []
        for (hostname, _), names in zip(nodes, found, strict=True):
            if isinstance(names, BaseException):
                if not isinstance(names, EngineError):
                    raise names
                log.warning("volumes on node %s not listed: %s", hostname, names)
                continue
            out.extend((name, hostname) for name in names)
        return sorted(out)

    def _node_url(self, hostname: str) -> list[tuple[str, str]]:
        """[(hostname, its engine's URL)]; [] when the cluster has no such node. A node that
        is down raises (EngineUnreachable)."""
        try:
            return [(hostname, self.node_engines.url_of(self.client, hostname))]
        except NodeMissing:
            return []
        except EngineUnreachable as e:  # down, or silent a moment ago: as when all are asked
            log.info("volumes on node %s not listed: %s", hostname, e)
            return []

    def _volumes_on(self, url: str, prefix: str) -> list[str]:
        with self.node_engines.calling(shown_url(url)):
            vols = self.node_engines.client(url).volumes(filters={"name": prefix})
        names = [v["Name"] for v in (vols or {}).get("Volumes") or []]
        return [n for n in names if n.startswith(prefix)]

    def _helper_blocking(
        self, config: dict, node: str, on_line, files: dict[str, bytes] | None = None
    ) -> HelperResult:
        client = self.client
        name = config.get("name") or f"gpulab-helper-{time.time_ns():x}"
        # the helper's secret files travel as the Swarm's secrets, one per file, made for
        # this run only (labelled like the helper, and with its name) and removed with it; if
        # this process dies first, remove() of the orphaned helper takes them, or, made
        # before its service, remove_helper_leftovers
        secrets: list[tuple[str, str, str]] = []
        sid = None
        try:
            for fname, content in sorted((files or {}).items()):
                secret = f"{name}-{fname}"
                labels = helper_secret_labels(config.get("labels") or {}, name)
                made = client.create_secret(secret, content, labels=labels)
                secrets.append((made["ID"], secret, fname))
            fault_point("helper:secrets")  # made, and no service holds them yet
            body = helper_service_spec({**config, "name": name}, node, secrets)
            if not node:  # any node but the hub's own (a purge needs no volume)
                constraint = f"node.id!={self._own_node_id()}"
                body["TaskTemplate"]["Placement"]["Constraints"] = [constraint]
            sid = self._post_service(body)
            return self._follow_helper(sid, name, on_line)
        finally:
            if sid is not None:
                with_suppress_notfound(client.remove_service, sid)
                # its container, on the node, holds the volume a moment more: a caller that
                # removes the volume next (a failed pull's) would be refused (409)
                if node and self._wait_gone(sid, REMOVE_TIMEOUT):
                    self._wait_container_gone(sid, name, node, REMOVE_TIMEOUT)
            for secret_id, _, _ in secrets:
                _remove_secret(client, secret_id)

    def _follow_helper(self, sid: str, name: str, on_line) -> HelperResult:
        lines: list[str] = []
        fault_point("helper:started")
        deadline = time.monotonic() + HELPER_TIMEOUT
        while True:
            found = self._state_blocking(sid)
            if found is not None and not found.running:
                break
            if time.monotonic() > deadline:
                raise EngineError(f"helper {name} ran over {HELPER_TIMEOUT:g} s")
            time.sleep(0.3)
        res, chunks = self._open_logs(sid, False)
        try:
            buf = b"".join(chunks)
        finally:
            res.close()
        for line in buf.decode(errors="replace").splitlines():
            lines.append(line)
            on_line(line)
        if found.exit_code is None:
            raise EngineError(f"the helper did not run: {found.error}")
        return HelperResult(found.exit_code, lines)

    async def run_helper(self, spec: HelperSpec, on_line, node: str = "") -> HelperResult:
        config = helper_container_config(spec)
        loop = asyncio.get_running_loop()

        def threadsafe(line: str) -> None:
            loop.call_soon_threadsafe(on_line, line)

        config = {**config, "image": self.image_ref(config["image"])}
        return await self.engine.call(
            self._helper_blocking, config, node, threadsafe, dict(spec.files)
        )


def _stopping(grace: float):
    """The service update that stops a workload and keeps its ended task (see stop())."""

    def change(spec: dict) -> None:
        spec.setdefault("Labels", {})[L_STOPPED] = "1"
        task = spec["TaskTemplate"]
        task["ContainerSpec"]["StopGracePeriod"] = int(grace * 1e9)
        placement = task.setdefault("Placement", {})
        constraints = placement.get("Constraints") or []
        if NOWHERE not in constraints:
            placement["Constraints"] = [*constraints, NOWHERE]
        task["ForceUpdate"] = int(task.get("ForceUpdate") or 0) + 1

    return change


#: the hostnames already warned about as shared (read at every pass: one warning each)
_SHARED_WARNED: set[str] = set()


def hostnames_shared(nodes: Sequence[dict]) -> set[str]:
    """The hostnames that two nodes not down have (from the manager's node list): gpulab
    places by hostname (``node.hostname==``), which would match either, and reaches a node's
    engine by it; such nodes take no workload (logged at ERROR once per hostname) until one
    is removed (``docker node rm``) or renamed. A node down beside one that is not (it left
    and joined again) is no clash."""
    seen: dict[str, list[str]] = {}
    for n in nodes:
        if (n.get("Status") or {}).get("State") == "down":
            continue
        hostname = (n.get("Description") or {}).get("Hostname", "")
        seen.setdefault(hostname, []).append(n["ID"])
    shared = {h for h, ids in seen.items() if len(ids) > 1 and h}
    for h in sorted(shared - _SHARED_WARNED):
        if len(_SHARED_WARNED) < 256:
            _SHARED_WARNED.add(h)
        log.error(
            "nodes %s share the hostname %s: gpulab places workloads by hostname, so neither "
            "takes any until one is removed (docker node rm) or renamed",
            ", ".join(seen[h][:4]),
            h[:80],
        )
    return shared


def _node_lost(e: NodeMissing) -> EngineError:
    """The engine's error (not the user's image's: a job is placed again, as one whose node
    was lost before its command ran) for a node gone after it was chosen."""
    return EngineError(f"{e}: it was lost after the workload was placed there")


def _named(obj: dict, name: str) -> bool:
    return (obj.get("Spec") or {}).get("Name") == name


def _remove_secret(client, secret_id: str) -> None:
    """Remove a helper's secret; its service's task may hold it a moment after the service
    is removed."""
    for _ in range(20):
        try:
            client.remove_secret(secret_id)
            return
        except NotFound:
            return
        except APIError:
            time.sleep(0.25)
    log.warning("could not remove the helper's secret %s", secret_id)


def with_suppress_notfound(fn, *args) -> None:
    with contextlib.suppress(NotFound):
        fn(*args)


__all__ = ["L_NODE", "L_USER", "SwarmRuntime", "helper_service_spec", "service_spec", "task_state"]
