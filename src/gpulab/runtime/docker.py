"""The one place gpulab's own code talks to the Docker engine.

Blocking SDK calls run on a shared thread pool (never on the event loop), wide enough that one
user's slow image pull or build does not queue another user's spawn behind it (DockerSpawner
uses a single worker thread by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import docker
from docker.errors import APIError, DockerException, ImageNotFound, NotFound

from ..faults import fault_point
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

    async def volume_exists(self, name: str) -> bool:
        try:
            await self.run(self.client.inspect_volume, name)
            return True
        except NotFound:
            return False

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


class HelperResult:
    def __init__(self, exit_code: int, lines: list[str]):
        self.exit_code = exit_code
        self.lines = lines


def _run_helper_blocking(client: docker.APIClient, config: dict, on_line) -> HelperResult:
    """Create, start and follow a helper container to its end; always remove it."""
    host_config = client.create_host_config(**config["host_config"])
    kwargs = {k: v for k, v in config.items() if k != "host_config"}
    container = client.create_container(host_config=host_config, **kwargs)
    cid = container["Id"]
    lines: list[str] = []
    try:
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


async def run_helper(runtime: DockerRuntime, config: dict, on_line) -> HelperResult:
    """Run a helper container off the event loop; ``on_line`` is called on the event loop."""
    loop = asyncio.get_running_loop()

    def threadsafe(line: str) -> None:
        loop.call_soon_threadsafe(on_line, line)

    return await runtime.run(_run_helper_blocking, runtime.client, config, threadsafe)
