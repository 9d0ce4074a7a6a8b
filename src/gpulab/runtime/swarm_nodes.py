"""The engines of a Swarm's nodes, for what a manager cannot do: exec into a task's container,
say which runtimes a node has (:class:`GpuDeliveryChecks`: may its GPUs be handed out), pull
an image from a registry with a user's credentials onto the node that runs it and say whether
the node has it, and find, list and remove a node's volumes (:meth:`NodeEngines.of_node`).

A manager's API has no exec. gpulab finds the running task of the workload's service, the
node it runs on and its container, and talks to that node's own Docker engine, at an address
made from ``GpulabSettings.swarm_node_engine`` (a template such as ``tcp://{address}:2376``,
filled with the node's address, hostname and ID), with the TLS client certificate the
settings name. A node's engine port gives root on that node to whoever reaches it: in
production it must take TLS with client certificates only (dockerd ``--tlsverify``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import docker
from docker.errors import NotFound
from docker.tls import TLSConfig

from ..resources import MODEL_RE, POOL_RE
from .base import EngineError, EngineUnreachable, WorkloadGone
from .engine import engine_errors, shown_url
from .objects import gpu_delivery_refusal
from .swarm_specs import engine_time

log = logging.getLogger(__name__)

#: the fields a node engine template may use
TEMPLATE_FIELDS = ("address", "hostname", "node_id")
#: seconds a node's engine is given to say which runtimes it has
CHECK_TIMEOUT = 5
#: seconds before a node whose GPUs were kept out (refused, or its engine did not answer) is
#: asked again, and before one that could hand them out is (its engine may have changed)
RECHECK_KEPT_OUT = 30.0
RECHECK_CLEARED = 300.0
#: seconds a node's engine is given to accept a connection (its answer may take up to the
#: client's time-out: a pull's progress, a removal)
CONNECT_TIMEOUT = 5.0
#: seconds a node's engine that gave no answer is not asked again (each call fails at once:
#: a node that looks up but does not answer would otherwise hold every caller its time-out)
SILENT_FOR = 30.0
#: seconds after which a node the manager reports down counts as gone (as one no longer in
#: the cluster: what it held is left there, logged), so that removals stop waiting for it
DOWN_GRACE = 600.0
#: the node labels that name its GPUs' model and its node pools (beside swarm_gpu_label's
#: ``org.gpulab.gpus``), set with ``docker node update --label-add``
MODEL_LABEL = "org.gpulab.gpu-model"
POOLS_LABEL = "org.gpulab.pools"


#: the bad label values already warned about (read at every pass: one warning each)
_WARNED: set[tuple[str, str]] = set()


def _warn_once(label: str, value: str, what: str) -> None:
    key = (label, value[:80])
    if key in _WARNED:
        return
    if len(_WARNED) < 256:  # bounded: labels are few
        _WARNED.add(key)
    log.warning("node label %s: %r is no %s name; left out", label, value[:80], what)


def labelled_pools(labels: Mapping[str, str]) -> tuple[str, ...]:
    """A node's pools from its labels: :data:`POOLS_LABEL`, names separated by commas, each
    once; a name that is not one (:data:`~gpulab.gpus.placement.POOL_PATTERN`) is left out,
    logged once."""
    out: list[str] = []
    for name in (p.strip() for p in (labels.get(POOLS_LABEL) or "").split(",")):
        if not name or name in out:
            continue
        if POOL_RE.fullmatch(name):
            out.append(name)
        else:
            _warn_once(POOLS_LABEL, name, "pool")
    return tuple(out)


def labelled_model(labels: Mapping[str, str]) -> str:
    """A node's GPU model from its label :data:`MODEL_LABEL` ("" without one, or when it is
    no model name: logged once)."""
    name = (labels.get(MODEL_LABEL) or "").strip()
    if name and not MODEL_RE.fullmatch(name):
        _warn_once(MODEL_LABEL, name, "model")
        return ""
    return name


def node_tls(ca: str, cert: str, key: str) -> TLSConfig | None:
    """The TLS client configuration of the nodes' engines; None without any (plain TCP).

    The server's certificate is always verified (against ``ca``, else the system's CAs);
    ``cert`` and ``key`` are the client's certificate and key, given together."""
    if not (ca or cert or key):
        return None
    if bool(cert) != bool(key):
        raise ValueError("swarm_node_tls_cert and swarm_node_tls_key must be given together")
    return TLSConfig(client_cert=(cert, key) if cert else None, ca_cert=ca or None, verify=True)


def check_template(template: str) -> None:
    """Refuse a template with an unknown field or no scheme, at start-up rather than at the
    first exec."""
    try:
        url = template.format(**dict.fromkeys(TEMPLATE_FIELDS, "node"))
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(
            f"swarm_node_engine {template!r}: fields are {{address}}, {{hostname}} and "
            f"{{node_id}} ({e})"
        ) from None
    if urlsplit(url).scheme not in ("tcp", "https", "http", "unix", "ssh"):
        raise ValueError(f"swarm_node_engine {template!r} must be a URL such as tcp://...")


class NodeClient(docker.APIClient):
    """A client of one node's engine that verifies it against the configured CA only.

    requests (under the Docker SDK) lets ``REQUESTS_CA_BUNDLE`` or ``CURL_CA_BUNDLE`` in the
    environment replace a session's CA for every request (``Session.merge_environment_settings``):
    on a host that sets one (many do; this development machine does), the node's certificate
    would be checked against the system's CAs and refused. Nothing from the environment
    applies here (no proxy either: the nodes' network)."""

    def _retrieve_server_version(self):  # the first request, made by __init__
        self.trust_env = False
        return super()._retrieve_server_version()


def check_transport(template: str, tls: TLSConfig | None, plain: bool) -> None:
    """Refuse nodes' engines over TCP without TLS client certificates, unless the operator
    said so (``swarm_node_engine_plain``): whoever reaches such a port is root on the node,
    and every container on the node can reach its addresses."""
    scheme = urlsplit(template.format(**dict.fromkeys(TEMPLATE_FIELDS, "node"))).scheme
    if scheme not in ("tcp", "http", "https"):
        return  # unix:// (one machine) or ssh:// (ssh's own authentication)
    if tls is not None and tls.cert:
        return
    if plain:
        log.warning(
            "swarm_node_engine %s without TLS client certificates (swarm_node_engine_plain "
            "= True): anyone who reaches a node's engine port, any container on that node "
            "included, is root on it; use this only in a lab",
            template,
        )
        return
    raise ValueError(
        f"swarm_node_engine {template!r} without a TLS client certificate: a node's engine "
        "port is root on that node for whoever reaches it, any container on the node "
        "included. Run the nodes' dockerd with --tlsverify and set swarm_node_tls_ca, "
        "swarm_node_tls_cert and swarm_node_tls_key, or, in a lab only, "
        "swarm_node_engine_plain = True"
    )


class NodeEngines:
    """Clients of the nodes' engines (one per address, kept), and where a service's task
    runs."""

    def __init__(
        self,
        template: str,
        tls: TLSConfig | None = None,
        timeout: int = 60,
        plain: bool = False,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ):
        check_template(template)
        check_transport(template, tls, plain)
        self.template = template
        self.tls = tls
        self.timeout = timeout
        #: seconds a node down counts as down (then: gone); the clocks, for tests
        self.down_grace = DOWN_GRACE
        self.clock, self.wall = clock, wall
        self._clients: dict[str, docker.APIClient] = {}
        #: engine URL (as shown) -> when it last gave no answer (:data:`SILENT_FOR`)
        self._silent: dict[str, float] = {}
        #: node ID -> when it was first seen down (the manager's time of its change unread)
        self._down_seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def url(self, node: dict) -> str:
        """The engine URL of a node (as the manager's API describes it)."""
        status = node.get("Status") or {}
        address = status.get("Addr") or ""
        if address in ("", "0.0.0.0"):  # a manager may report this: its manager address
            address = ((node.get("ManagerStatus") or {}).get("Addr") or "").rpartition(":")[0]
        hostname = (node.get("Description") or {}).get("Hostname", "")
        return self.template.format(address=address, hostname=hostname, node_id=node["ID"])

    def client(self, url: str) -> docker.APIClient:
        """The kept client of the engine at ``url``; EngineUnreachable at once when that
        engine gave no answer a moment ago (:meth:`_check_silent`)."""
        self._check_silent(shown_url(url))
        with self._lock:
            found = self._clients.get(url)
        if found is None:  # made outside the lock: version="auto" asks the engine
            found = NodeClient(
                base_url=url,
                version="auto",
                timeout=(CONNECT_TIMEOUT, self.timeout),  # (connect, read), as requests takes
                tls=self.tls or False,
            )
            with self._lock:
                found = self._clients.setdefault(url, found)
        return found

    def _check_silent(self, url: str) -> None:
        """EngineUnreachable, at once, when the engine at ``url`` gave no answer less than
        :data:`SILENT_FOR` seconds ago."""
        with self._lock:
            at = self._silent.get(url)
        if at is not None and self.clock() - at < SILENT_FOR:
            raise EngineUnreachable(
                f"Docker engine at {url} gave no answer {self.clock() - at:.0f} s ago: not "
                f"asked again for {SILENT_FOR:g} s",
                url=url,
            )

    @contextlib.contextmanager
    def calling(self, url: str):
        """Within the block, the node engine's errors as gpulab's (``engine_errors``); one
        that says it gave no answer is remembered (:meth:`_check_silent`), one that answered
        forgets it."""
        try:
            with engine_errors(url):
                yield
        except EngineUnreachable:
            with self._lock:
                if len(self._silent) > 1024:  # bounded: nodes are few
                    self._silent.clear()
                self._silent[url] = self.clock()
            raise
        except EngineError as e:
            if e.status is not None:
                with self._lock:
                    self._silent.pop(url, None)
            raise
        with self._lock:
            self._silent.pop(url, None)

    def _down_for(self, node: dict) -> float:
        """Seconds node ``node`` (down) has been down: since the manager's last change of it
        (``UpdatedAt``: its going down, or a later label change), or since this process first
        saw it down, whichever is longer known."""
        with self._lock:
            if len(self._down_seen) > 1024:  # bounded: nodes are few
                self._down_seen.clear()
            first = self._down_seen.setdefault(node["ID"], self.clock())
        seen = self.clock() - first
        since = engine_time(node.get("UpdatedAt") or "")
        return max(seen, self.wall() - since) if since is not None else seen

    def _named(self, manager: docker.APIClient, hostname: str) -> tuple[dict, str]:
        """(the node named ``hostname``, its engine URL), as :meth:`of_node` says."""
        named = [
            n
            for n in manager.nodes()
            if (n.get("Description") or {}).get("Hostname") == hostname and hostname
        ]
        if not named:
            raise NodeMissing(f"node {hostname or '(none)'} is not in the cluster")
        node = min(named, key=lambda n: (n.get("Status") or {}).get("State") == "down")
        url = shown_url(self.url(node))
        if (node.get("Status") or {}).get("State") == "down":
            down = self._down_for(node)
            if down >= self.down_grace:
                raise NodeMissing(
                    f"node {hostname} has been down for {down / 60:.0f} min (over "
                    f"{self.down_grace / 60:g}): it counts as gone"
                )
            raise EngineUnreachable(
                f"node {hostname} is down: its engine at {url} is not asked", url=url
            )
        with self._lock:
            self._down_seen.pop(node["ID"], None)
        self._check_silent(url)
        return node, url

    def url_of(self, manager: docker.APIClient, hostname: str) -> str:
        """Blocking: the engine URL of the node named ``hostname`` (as :meth:`of_node`)."""
        return self.url(self._named(manager, hostname)[0])

    def of_node(self, manager: docker.APIClient, hostname: str) -> tuple[docker.APIClient, str]:
        """Blocking: (a client of the engine of the node named ``hostname``, as gpulab's
        placement names nodes, and its address as messages show it). :class:`NodeMissing`
        when the cluster has no such node (it left, with what it held), or when the manager
        has reported it down for :attr:`down_grace` seconds (it counts as gone);
        EngineUnreachable, without asking its engine, when the manager reports it down
        (a connection to a dead machine would wait out its time-out), or when its engine
        gave no answer less than :data:`SILENT_FOR` seconds ago. Of two nodes of that name
        (one left, then joined again), the one that is not down."""
        node, url = self._named(manager, hostname)
        with self.calling(url):
            return self.client(self.url(node)), url

    def workload_nodes(self, manager: docker.APIClient, own: str) -> list[tuple[str, str]]:
        """Blocking: (hostname, engine URL) of every node that may hold workloads' volumes:
        all but the manager ``own`` (the hub's node, which takes none) and those the
        manager reports down."""
        out = []
        for n in manager.nodes():
            if n["ID"] == own or (n.get("Status") or {}).get("State") == "down":
                continue
            out.append(((n.get("Description") or {}).get("Hostname", ""), self.url(n)))
        return out

    def info(self, url: str) -> dict:
        """Blocking: the ``docker info`` of the engine at ``url`` (its runtimes), within
        :data:`CHECK_TIMEOUT` seconds, on a client of its own; EngineError when it gives none."""
        with engine_errors(shown_url(url)):
            client = NodeClient(
                base_url=url, version="auto", timeout=CHECK_TIMEOUT, tls=self.tls or False
            )
            try:
                return client.info()
            finally:
                client.close()

    def locate(self, manager: docker.APIClient, name: str) -> tuple[docker.APIClient, str]:
        """Blocking: (a client of the node's engine, the container ID) of the running task
        of service ``name``. Raises WorkloadGone when it has none running."""
        try:
            service = manager.inspect_service(name)
        except NotFound:
            raise WorkloadGone(name) from None
        tasks = manager.tasks(filters={"service": service["ID"], "desired-state": "running"})
        running = [
            t
            for t in tasks
            if (t.get("Status") or {}).get("State") == "running"
            and ((t["Status"].get("ContainerStatus") or {}).get("ContainerID"))
            and t.get("NodeID")
        ]
        if not running:
            raise WorkloadGone(f"{name} has no running task")
        task = max(running, key=lambda t: t.get("CreatedAt") or "")
        try:
            node = manager.inspect_node(task["NodeID"])
        except NotFound:
            raise WorkloadGone(f"{name}'s node is gone") from None
        url = self.url(node)
        with engine_errors(shown_url(url)):  # the node's engine, not the manager, failed
            client = self.client(url)
        return client, task["Status"]["ContainerStatus"]["ContainerID"]


class NodeMissing(LookupError):
    """The cluster has no node of that name (any more)."""


def node_gpu_refusal(
    hostname: str, gpus: int, info: Mapping | None, url: str = "", error: str = ""
) -> str:
    """Why node ``hostname``'s ``gpus`` GPUs are kept out of placement ("" when they may be
    handed out), from what its engine's ``docker info`` said (``info``), or, when it gave no
    answer (``info`` None), the ``error`` of asking it at ``url``. The one rule of
    :func:`~.objects.gpu_delivery_refusal`, in mode 'env' (all a Swarm task gets), named for
    the node (pure)."""
    if gpus <= 0:
        return ""
    if info is None:
        return (
            f"node {hostname}: its engine at {shown_url(url)} did not say which runtimes it "
            f"has ({error}); its GPUs are kept out of placement until it answers "
            "(swarm_node_engine and its TLS settings say how gpulab reaches a node's engine)"
        )
    refusal = gpu_delivery_refusal(
        "env",
        gpus,
        info.get("Runtimes") or {},
        info.get("DefaultRuntime") or "",
        swarm=True,
    )
    return f"node {hostname} cannot hand out its GPUs: {refusal}" if refusal else ""


@dataclass(frozen=True)
class _Verdict:
    refusal: str  # "" when the node may hand its GPUs out
    answered: bool  # its engine answered (a refusal of its runtimes, not of its silence)
    at: float
    gpus: int


class GpuDeliveryChecks:
    """Whether each GPU node of a Swarm can hand its GPUs out, asked of the node's own engine
    (its runtimes, ``docker info``), as one engine is asked at start-up: kept per node, asked
    again after :data:`RECHECK_CLEARED` seconds for a node that could, after
    :data:`RECHECK_KEPT_OUT` for one whose GPUs were kept out, and at once when its GPUs
    change. Each change of a node's verdict is logged: a refusal at ERROR (what to
    configure), an engine that does not answer at WARNING, a node cleared again at INFO.

    ``ask(url)``: blocking, that engine's ``docker info``, raising EngineError when it gives
    none."""

    def __init__(self, ask: Callable[[str], Mapping], clock: Callable[[], float] = time.monotonic):
        self.ask = ask
        self.clock = clock
        self._verdicts: dict[str, _Verdict] = {}
        self._lock = threading.Lock()

    def due(self, node_id: str, gpus: int) -> bool:
        """Whether the node must be asked (again) before its verdict is read."""
        with self._lock:
            v = self._verdicts.get(node_id)
        if v is None or v.gpus != gpus:
            return gpus > 0
        wait = RECHECK_KEPT_OUT if v.refusal else RECHECK_CLEARED
        return self.clock() - v.at >= wait

    def check(self, node_id: str, hostname: str, url: str, gpus: int) -> str:
        """Blocking: ask the node's engine now; its verdict (:func:`node_gpu_refusal`)."""
        try:
            info, error = self.ask(url), ""
        except EngineError as e:
            info, error = None, str(e)
        except Exception as e:  # a check never fails the caller's reading of the nodes
            info, error = None, str(e) or type(e).__name__
        refusal = node_gpu_refusal(hostname, gpus, info, url, error)
        verdict = _Verdict(refusal, info is not None, self.clock(), gpus)
        with self._lock:
            before = self._verdicts.get(node_id)
            self._verdicts[node_id] = verdict
        if before is None or (before.refusal, before.answered) != (refusal, verdict.answered):
            if refusal and verdict.answered:
                log.error("GPUs kept out of placement: %s", refusal)
            elif refusal:
                log.warning("GPUs kept out of placement: %s", refusal)
            elif before is not None and before.refusal:
                log.info("node %s can hand out its GPUs now", hostname)
        return refusal

    def refusal(self, node_id: str, gpus: int) -> str:
        """The node's last verdict ("" when it was never asked, or has no GPU)."""
        with self._lock:
            v = self._verdicts.get(node_id)
        return v.refusal if v is not None and gpus > 0 else ""
