"""The engines of a Swarm's nodes, for what a manager cannot do: exec into a task's container.

A manager's API has no exec. gpulab finds the running task of the workload's service, the
node it runs on and its container, and talks to that node's own Docker engine, at an address
made from ``GpulabSettings.swarm_node_engine`` (a template such as ``tcp://{address}:2376``,
filled with the node's address, hostname and ID), with the TLS client certificate the
settings name. A node's engine port gives root on that node to whoever reaches it: in
production it must take TLS with client certificates only (dockerd ``--tlsverify``).
"""

from __future__ import annotations

import logging
import threading
from urllib.parse import urlsplit

import docker
from docker.errors import NotFound
from docker.tls import TLSConfig

from .base import WorkloadGone
from .engine import engine_errors, shown_url

log = logging.getLogger(__name__)

#: the fields a node engine template may use
TEMPLATE_FIELDS = ("address", "hostname", "node_id")


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
        self, template: str, tls: TLSConfig | None = None, timeout: int = 60, plain: bool = False
    ):
        check_template(template)
        check_transport(template, tls, plain)
        self.template = template
        self.tls = tls
        self.timeout = timeout
        self._clients: dict[str, docker.APIClient] = {}
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
        with self._lock:
            found = self._clients.get(url)
        if found is None:  # made outside the lock: version="auto" asks the engine
            found = NodeClient(
                base_url=url, version="auto", timeout=self.timeout, tls=self.tls or False
            )
            with self._lock:
                found = self._clients.setdefault(url, found)
        return found

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
