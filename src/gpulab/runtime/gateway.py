"""The notebook gateway: how the hub reaches notebooks that run on a Swarm's worker nodes.

On one host the hub and its proxy (processes on the host) reach a notebook at its address on
its user's bridge network. On a Swarm the notebook runs on some node, on its user's overlay
network, and no process of the hub's host can reach an overlay address: only a container
attached to that overlay can. The JupyterHub way (DockerSpawner's SwarmSpawner) is to run the
hub and its proxy in containers on the overlay; gpulab keeps them as they are (processes, one
configuration for both backends) and adds one container instead:

- the *gateway*, ``<instance>-gateway``, a configurable-http-proxy on the manager's engine,
  attached to each user's overlay when that user's first notebook starts, and published on the
  manager's 127.0.0.1 only (``GpulabSettings.swarm_gateway_port``, its API on
  ``swarm_gateway_api_port``);
- for each notebook a route ``/user/NAME/[SERVER/]`` -> ``http://OVERLAY-IP:8888``; the
  spawner tells the hub that the notebook is at ``127.0.0.1:<gateway port>``, so the hub's
  readiness check and the proxy's route both go through the gateway, path unchanged.

What it exposes: its port and its API listen on the container's bridge address only, which
the ports published on the manager's 127.0.0.1 lead to; nothing listens on the overlays it is
attached to, so no user's container can reach it (let alone through it another user's
notebook). It forwards only to notebooks, each of which checks the hub's authentication on
every request. Its API needs the gateway's token, which lives only in the container's
environment (read back through the engine's API, which is root's). No notebook port is
published.

A gateway found running is kept (routes, overlays); one that died or was reconfigured is made
again, attached again to every user overlay of the installation. Every pass of the hub's
reconciler (``SwarmRuntime.restore_routes``) checks that each running notebook has its route
and that the gateway is on its overlay, and puts back what is missing. One process holds one
:class:`Gateway` per installation (:meth:`Gateway.shared`), so that its spawners never race
each other to make it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import secrets
import threading
import time

import requests
from docker.errors import APIError, NotFound

from .. import __version__
from ..names import L_INSTANCE, L_KIND, L_VERSION, gateway_container_name
from .base import EngineError
from .network import OVERLAY_KIND
from .objects import NO_GPU, hardened_host_config

log = logging.getLogger(__name__)

L_CONFIG = "org.gpulab.gateway-config"
#: both ports listen on the container's first address only (the bridge it is created on,
#: which the published 127.0.0.1 ports lead to), never on an overlay: no user's container can
#: reach the gateway; the gateway reaches notebooks over the overlays it is attached to
ENTRY = (
    'ip=$(hostname -i); ip=${ip%% *}; exec configurable-http-proxy --ip "$ip" '
    '--port "$GATEWAY_PORT" --api-ip "$ip" --api-port "$GATEWAY_API_PORT" --log-level warn'
)
START_TIMEOUT = 30.0


class GatewayError(EngineError):
    """The gateway could not be made or did not answer; the message says what to fix. An
    :class:`~.base.EngineError` like every failure that leaves the runtime (its ``status``
    is None: the gateway, not the engine, failed)."""


def gateway_config(instance: str, image: str, port: int, api_port: int, token: str) -> dict:
    """Keyword arguments of ``APIClient.create_container`` for the gateway (pure; the host
    config's keywords under ``host_config_kw``)."""
    fingerprint = json.dumps([image, port, api_port, ENTRY, __version__])
    return {
        "name": gateway_container_name(instance),
        "image": image,
        "entrypoint": ["/bin/sh", "-c", ENTRY],
        "command": [],
        "environment": {
            "CONFIGPROXY_AUTH_TOKEN": token,
            "GATEWAY_PORT": str(port),
            "GATEWAY_API_PORT": str(api_port),
            "NVIDIA_VISIBLE_DEVICES": NO_GPU,
        },
        "user": "65534:65534",
        "labels": {
            L_INSTANCE: instance,
            L_KIND: "gateway",
            L_VERSION: __version__,
            L_CONFIG: hashlib.sha256(fingerprint.encode()).hexdigest()[:16],
        },
        # the same port numbers inside and out: 127.0.0.1:PORT means the gateway on the host
        "ports": [port, api_port],
        "host_config_kw": {
            **hardened_host_config(),
            "port_bindings": {port: ("127.0.0.1", port), api_port: ("127.0.0.1", api_port)},
            "read_only": True,
            "mem_limit": "256m",
            "pids_limit": 256,
            "restart_policy": {"Name": "no"},
        },
    }


class Gateway:
    """The gateway of one installation, on the manager's engine (blocking calls)."""

    _shared: dict[tuple, Gateway] = {}
    _shared_lock = threading.Lock()

    @classmethod
    def shared(cls, instance: str, image: str, port: int, api_port: int) -> Gateway:
        """The one Gateway of this process for these settings (every spawner's runtime)."""
        key = (instance, image, port, api_port)
        with cls._shared_lock:
            if key not in cls._shared:
                cls._shared[key] = cls(instance, image, port, api_port)
            return cls._shared[key]

    def __init__(self, instance: str, image: str, port: int, api_port: int):
        self.instance, self.image = instance, image
        self.port, self.api_port = port, api_port
        self.name = gateway_container_name(instance)
        self._token: str | None = None
        self._lock = threading.Lock()

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.api_port}/api/routes"

    def _headers(self) -> dict:
        return {"Authorization": f"token {self._token}"}

    def ensure(self, client) -> bool:
        """The gateway runs with this configuration; True when it was made anew (its routes
        must then be put back)."""
        with self._lock:
            return self._ensure(client)

    def _ensure(self, client) -> bool:
        want = gateway_config(self.instance, self.image, self.port, self.api_port, "")
        try:
            found = client.inspect_container(self.name)
        except NotFound:
            found = None
        if found is not None:
            same = (found["Config"].get("Labels") or {}).get(L_CONFIG) == want["labels"][L_CONFIG]
            if same and found["State"]["Running"]:
                env = dict(e.split("=", 1) for e in found["Config"].get("Env") or [] if "=" in e)
                self._token = env.get("CONFIGPROXY_AUTH_TOKEN", "")
                return False
            log.warning("gateway %s replaced (stopped or reconfigured)", self.name)
            client.remove_container(self.name, force=True)
        token = secrets.token_hex(32)
        cfg = gateway_config(self.instance, self.image, self.port, self.api_port, token)
        host_kw = cfg.pop("host_config_kw")
        try:
            client.create_container(**cfg, host_config=client.create_host_config(**host_kw))
        except APIError as e:
            if e.status_code == 409:  # another process made it meanwhile: use that one
                return self._ensure_again(client)
            raise self._cannot_start(e) from None
        try:
            client.start(self.name)
        except APIError as e:
            with_suppress(client.remove_container, self.name, force=True)  # ours: made above
            raise self._cannot_start(e) from None
        self._token = token
        self._wait_up()
        for n in client.networks(
            filters={"label": [f"{L_INSTANCE}={self.instance}", f"{L_KIND}={OVERLAY_KIND}"]}
        ):
            self._attach(client, n["Id"])
        log.info("gateway %s started on 127.0.0.1:%d", self.name, self.port)
        return True

    def _ensure_again(self, client) -> bool:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            found = client.inspect_container(self.name)
            if found["State"]["Running"]:
                env = dict(e.split("=", 1) for e in found["Config"].get("Env") or [] if "=" in e)
                self._token = env.get("CONFIGPROXY_AUTH_TOKEN", "")
                self._wait_up()
                return True
            time.sleep(0.2)
        raise GatewayError(f"the notebook gateway {self.name} made by another process never ran")

    def _cannot_start(self, e: APIError) -> GatewayError:
        return GatewayError(
            f"the notebook gateway {self.name} could not start ({e.explanation or e}): the "
            f"manager needs the image {self.image} (scripts/build-images.sh proxy) and "
            f"ports {self.port} and {self.api_port} free on 127.0.0.1"
        )

    def _wait_up(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            try:
                if requests.get(self.api, headers=self._headers(), timeout=2).ok:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise GatewayError(f"the notebook gateway {self.name} did not answer in {START_TIMEOUT} s")

    def _attach(self, client, network_id: str) -> None:
        try:
            client.connect_container_to_network(self.name, network_id)
        except APIError as e:
            # joined meanwhile (a spawn and the reconciler's pass at once): Engine 20.10 says
            # "... is already attached to network ...", others "... already exists ..."
            text = str(e.explanation or e)
            if "already exists" not in text and "already attached" not in text:
                raise

    def attached(self, client) -> set[str]:
        """The IDs of the networks the gateway is on."""
        found = client.inspect_container(self.name)
        return {
            n.get("NetworkID") for n in (found["NetworkSettings"].get("Networks") or {}).values()
        }

    def attach(self, client, network_id: str) -> None:
        """Join the overlay ``network_id`` (once; joining again is fine)."""
        self.ensure(client)
        if network_id not in self.attached(client):
            self._attach(client, network_id)

    def detach(self, client, network_id: str) -> None:
        """Leave the overlay (before it is removed); no gateway or not attached: fine."""
        with_suppress(client.disconnect_container_from_network, self.name, network_id, force=True)

    def add_route(self, path: str, target: str) -> None:
        try:
            r = requests.post(
                self.api + path, headers=self._headers(), json={"target": target}, timeout=10
            )
        except requests.RequestException as e:
            raise self._no_answer(e) from None
        if not r.ok:
            raise GatewayError(f"the notebook gateway refused the route {path}: {r.status_code}")

    def delete_route(self, path: str) -> None:
        if self._token is None or not path.startswith("/"):
            return
        try:
            requests.delete(self.api + path, headers=self._headers(), timeout=10)
        except requests.RequestException as e:  # a gateway that is gone has no route left
            log.info("gateway route %s not deleted: %s", path, e)

    def routes(self) -> dict[str, str]:
        try:
            r = requests.get(self.api, headers=self._headers(), timeout=10)
            r.raise_for_status()
            found = r.json()
        except (requests.RequestException, ValueError) as e:
            raise self._no_answer(e) from None
        return {path: (v or {}).get("target", "") for path, v in found.items()}

    def _no_answer(self, e: Exception) -> GatewayError:
        # the error's class only: requests' message may carry the URL's query or a header
        return GatewayError(
            f"the notebook gateway {self.name} did not answer on 127.0.0.1:{self.api_port} "
            f"({type(e).__name__})"
        )


def with_suppress(fn, *args, **kw) -> None:
    with contextlib.suppress(NotFound, APIError):
        fn(*args, **kw)


__all__ = ["Gateway", "GatewayError", "gateway_config"]
