"""How the Swarm backend reaches workloads and keeps their networks: a task's address on a
network, the gateway's routes to users' ports, and the users' and distributed jobs' overlays
(created on demand, removed once no service uses them): the :class:`SwarmNetwork` that a
:class:`~gpulab.runtime.swarm.SwarmRuntime` holds, handed the manager's engine client, the
notebook gateway and whether overlays are encrypted."""

from __future__ import annotations

import contextlib
import logging

from docker.errors import APIError, NotFound

from ..names import L_INSTANCE, L_KIND, L_NETWORK, L_PORT, L_ROUTE, L_USER
from . import network as net
from .base import WorkloadGone
from .engine import EngineClient
from .gateway import Gateway, GatewayError
from .swarm_specs import L_STOPPED

log = logging.getLogger("gpulab.runtime.swarm")


def _has_services(client, labels: list[str]) -> bool:
    return bool(client.services(filters={"label": labels}))


def service_named(client, name: str) -> dict | None:
    """The manager's service ``name`` (or ID); None: there is none."""
    try:
        return client.inspect_service(name)
    except NotFound:
        return None


class SwarmNetwork:
    """A Swarm's addresses, routes and networks, through the manager's ``engine``; the
    ``gateway`` reaches notebooks (None: jobs only); ``encrypted``: overlays carry their
    traffic between nodes in IPsec."""

    def __init__(self, engine: EngineClient, gateway: Gateway | None, encrypted: bool):
        self.engine = engine
        self.gateway = gateway
        self.encrypted = encrypted

    @property
    def client(self):
        return self.engine.client

    # --- reaching a workload: its address, the gateway's routes --------------------------------

    def _address_blocking(self, name: str, network_id: str) -> str:
        svc = service_named(self.client, name)
        if svc is None:
            raise WorkloadGone(name)
        tasks = self.client.tasks(filters={"service": svc["ID"], "desired-state": "running"})
        for t in sorted(tasks, key=lambda t: t.get("CreatedAt") or "", reverse=True):
            if (t.get("Status") or {}).get("State") != "running":
                continue
            for att in t.get("NetworksAttachments") or []:
                if (att.get("Network") or {}).get("ID") == network_id and att.get("Addresses"):
                    return att["Addresses"][0].split("/")[0]
        raise WorkloadGone(f"{name} has no running task on network {network_id[:12]}")

    async def address(self, name: str, network_id: str) -> str:
        return await self.engine.call(self._address_blocking, name, network_id)

    def _reach_blocking(self, name: str, network_id: str, path: str, port: int) -> tuple[str, int]:
        if self.gateway is None:
            raise GatewayError("this runtime has no notebook gateway")
        svc = service_named(self.client, name)
        if svc is None:
            raise WorkloadGone(name)
        joined = [n.get("Target") for n in svc["Spec"]["TaskTemplate"].get("Networks") or []]
        network_id = joined[0] if joined else network_id  # the one it runs on
        self.gateway.attach(self.client, network_id)
        ip = self._address_blocking(name, network_id)
        self.gateway.add_route(path, f"http://{ip}:{port}")
        return "127.0.0.1", self.gateway.port

    async def reach(self, name: str, network_id: str, path: str, port: int) -> tuple[str, int]:
        """Through the notebook gateway (runtime/gateway.py): its route ``path`` leads to the
        workload's overlay address; the hub and its proxy use 127.0.0.1:<gateway port>."""
        return await self.engine.call(self._reach_blocking, name, network_id, path, port)

    def _unreach_blocking(self, path: str) -> None:
        if self.gateway is not None and path.startswith("/"):
            with contextlib.suppress(GatewayError, APIError):  # no gateway: no route
                self.gateway.ensure(self.client)
                self.gateway.delete_route(path)

    async def unreach(self, path: str) -> None:
        await self.engine.call(self._unreach_blocking, path)

    def _restore_routes_blocking(self, instance: str) -> list[str]:
        """Every running notebook has its route on the gateway, and the gateway is on its
        overlay; what is missing (a gateway made anew, an overlay it left while a spawn joined
        it) is put back. Each service carries its route, overlay and port in its labels."""
        if self.gateway is None:
            return []
        services = self.client.services(
            filters={"label": [f"{L_INSTANCE}={instance}", f"{L_KIND}=notebook"]}
        )
        wanted = [
            s
            for s in services
            if L_ROUTE in (s["Spec"].get("Labels") or {})
            and L_STOPPED not in (s["Spec"].get("Labels") or {})
        ]
        if not wanted:
            return []
        self.gateway.ensure(self.client)
        routes, attached = self.gateway.routes(), self.gateway.attached(self.client)
        put = []
        for svc in wanted:
            labels = svc["Spec"]["Labels"]
            path, network_id = labels[L_ROUTE], labels.get(L_NETWORK, "")
            if path in routes and network_id in attached:
                continue
            try:
                self._reach_blocking(svc["Spec"]["Name"], network_id, path, int(labels[L_PORT]))
                put.append(path)
            except WorkloadGone:
                continue  # not running (starting, ended): nothing to route
            except (GatewayError, APIError, KeyError, ValueError) as e:
                log.warning("route %s not restored: %s", path, e)
        return put

    async def restore_routes(self, instance: str) -> list[str]:
        return await self.engine.call(self._restore_routes_blocking, instance)

    # --- networks: overlays, in use while a service of the user exists ------------------------

    async def ensure_user_network(self, instance: str, user: str) -> str:
        return await self.engine.call(
            net.ensure_user_network, self.client, instance, user, "overlay", self.encrypted
        )

    async def ensure_job_network(self, instance: str, owner: str, job_id: str) -> str:
        return await self.engine.call(
            net.ensure_job_network, self.client, instance, owner, job_id, "overlay", self.encrypted
        )

    async def remove_job_network(self, instance: str, job_id: str) -> None:
        # an overlay stays while a service of the job (stopped ones too) names it: the
        # prune after the job's services are removed takes it (the cluster's pool is large)
        await self.engine.call(
            net.prune_job_networks, self.client, instance, self._job_in_use, "overlay", job_id
        )

    def _unused_and_gateway_detached(self, client, labels: list[str]) -> bool:
        """A user overlay is in use while a service of the user exists; once none does, the
        notebook gateway (the one container attached to it) leaves it so that it can go."""
        if _has_services(client, labels):
            return True
        found = dict(x.partition("=")[::2] for x in labels)
        name = net.user_network_name(found[L_INSTANCE], found[L_USER], "overlay")
        for n in client.networks(names=[name]):
            if n.get("Name") == name and self.gateway is not None:
                self.gateway.detach(client, n["Id"])
        return False

    async def remove_user_network_if_unused(self, instance: str, user: str) -> bool:
        return await self.engine.call(
            net.remove_user_network_if_unused,
            self.client,
            instance,
            user,
            self._unused_and_gateway_detached,
            "overlay",
        )

    async def prune_user_networks(self, instance: str) -> list[str]:
        users = await self.engine.call(
            net.prune_user_networks,
            self.client,
            instance,
            self._unused_and_gateway_detached,
            "overlay",
        )
        jobs = await self.engine.call(
            net.prune_job_networks, self.client, instance, self._job_in_use, "overlay"
        )
        return users + [f"job {j}" for j in jobs]

    def _job_in_use(self, client, labels: list[str], network_id: str) -> bool:
        """A distributed job's overlay is in use while a service of the job exists; once
        none does, the gateway (attached for the job's ports) leaves it."""
        if _has_services(client, labels):
            return True
        if self.gateway is not None:
            self.gateway.detach(client, network_id)
        return False
