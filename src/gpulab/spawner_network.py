"""The notebook spawner's side of per-user networks (see :mod:`gpulab.runtime.network`).

A mixin over DockerSpawner: before the container is created it joins its user's network
(made on demand) instead of DockerSpawner's configured one, the proxy reaches it at its IP
there (no port published on the host), and the network goes with the user's last container.
"""

from __future__ import annotations

from dockerspawner import DockerSpawner

from .runtime.docker import APIError, EngineError
from .runtime.network import (
    is_missing_network,
    network_for,
)


class UserNetworkMixin(DockerSpawner):
    """Needs ``settings`` (GpulabSettings) and ``runtime`` (DockerRuntime) from the spawner."""

    def _isolated(self) -> bool:
        s = self.settings
        return network_for(s.network_isolation, s.instance, self.user.name) is not None

    async def _join_user_network(self) -> None:
        """Put the next container on its user's network, not the shared bridge.

        Raises NetworkUnavailable (or EngineError) with a message for the user.
        """
        if not self._isolated():
            return  # 'none': DockerSpawner's own network settings, as configured
        # joined by ID (unambiguous while a racing duplicate exists); see get_network_ip
        self.network_name = await self._ensure_user_network()
        # the proxy on the host reaches the container's IP on that network: no published port
        self.use_internal_ip = True

    async def _ensure_user_network(self) -> str:
        s = self.settings
        return await self.runtime.ensure_user_network(s.instance, self.user.name)

    async def _ensure_network_again(self, error: Exception) -> bool:
        """The user's network was pruned between our look-up and our use: make it again."""
        if not (self._isolated() and is_missing_network(error)):
            return False
        self.network_name = await self._ensure_user_network()
        return True

    async def create_object(self):
        try:
            return await super().create_object()
        except APIError as e:
            if not await self._ensure_network_again(e):
                raise
            return await super().create_object()

    async def start_object(self):
        try:
            await super().start_object()
        except APIError as e:
            if not await self._ensure_network_again(e):
                raise
            # the container names the network that was removed: make it anew on the new one
            await self.remove_object()
            self.object_id = (await self.create_object())[self.object_id_key]
            await super().start_object()

    def get_network_ip(self, network_settings):
        # the engine keys a container's networks by name; ours was joined by ID
        for net in network_settings["Networks"].values():
            if net.get("NetworkID") == self.network_name:
                return net["IPAddress"]
        return super().get_network_ip(network_settings)

    async def _release_user_network(self) -> None:
        """Best effort: the user's network goes with their last container (address pools)."""
        if not self._isolated():
            return
        s = self.settings
        try:
            await self.runtime.remove_user_network_if_unused(s.instance, self.user.name)
        except EngineError as e:
            self.log.warning("%s: network not removed: %s", self._log_name, e)
