"""The one place gpulab's own code talks to the Docker engine.

Blocking SDK calls run on a shared thread pool (never on the event loop), wide enough that one
user's slow image pull or build does not queue another user's spawn behind it (DockerSpawner
uses a single worker thread by default).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import docker
from docker.errors import APIError, DockerException, ImageNotFound, NotFound

from .objects import L_INSTANCE, L_KIND

log = logging.getLogger(__name__)

EngineError = DockerException
__all__ = ["APIError", "DockerRuntime", "EngineError", "ImageNotFound", "NotFound"]


class DockerRuntime:
    _executor: ThreadPoolExecutor | None = None

    def __init__(self, client: docker.APIClient | None = None, workers: int = 32):
        self._client = client
        self._workers = workers

    @property
    def client(self) -> docker.APIClient:
        if self._client is None:
            self._client = docker.APIClient(version="auto", timeout=120)
        return self._client

    @classmethod
    def shared_executor(cls, workers: int = 32) -> ThreadPoolExecutor:
        if cls._executor is None:
            cls._executor = ThreadPoolExecutor(workers, thread_name_prefix="gpulab-engine")
        return cls._executor

    async def run(self, fn, *args, **kwargs) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self.shared_executor(self._workers), functools.partial(fn, *args, **kwargs)
        )

    # --- queries -------------------------------------------------------------------------

    async def image_exists(self, image: str) -> bool:
        try:
            await self.run(self.client.inspect_image, image)
            return True
        except ImageNotFound:
            return False
        except NotFound:
            return False

    async def inspect_container(self, name: str) -> dict | None:
        try:
            return await self.run(self.client.inspect_container, name)
        except NotFound:
            return None

    async def labelled_containers(self, instance: str, kind: str) -> list[dict]:
        """Every container (running or not) of this instance and kind, with its labels."""
        return await self.run(
            self.client.containers,
            all=True,
            filters={"label": [f"{L_INSTANCE}={instance}", f"{L_KIND}={kind}"]},
        )

    # --- changes -------------------------------------------------------------------------

    async def remove_volume(self, name: str) -> bool:
        try:
            await self.run(self.client.remove_volume, name, force=True)
            return True
        except NotFound:
            return False

    async def remove_container(self, name: str) -> bool:
        try:
            await self.run(self.client.remove_container, name, force=True, v=False)
            return True
        except NotFound:
            return False
