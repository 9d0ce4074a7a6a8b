"""The Docker Engine API client that both backends hold (one engine, or a Swarm's manager),
and the one place where the Docker SDK's errors become gpulab's :class:`~.base.EngineError`.

A backend hands its :class:`EngineClient` the runtime's pools (``Runtime.run`` for engine
calls, ``Runtime.run_exec`` for execs) and makes every blocking SDK call through
:meth:`EngineClient.call` or :meth:`EngineClient.call_exec`: the call runs off the event
loop, and an SDK error comes up as gpulab's error, its status and the engine's words as
gpulab's fields, never as an SDK class.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import docker
from docker.errors import APIError, DockerException
from docker.utils import kwargs_from_env

from .base import EngineError

#: runs a blocking call on a pool of the runtime (Runtime.run, Runtime.run_exec)
Pool = Callable[..., Awaitable[Any]]


def engine_error(e: DockerException, kind: type[EngineError] = EngineError) -> EngineError:
    """The SDK's ``e`` as gpulab's ``kind`` (an :class:`~.base.EngineError`): its message,
    the engine's HTTP status and the engine's own words (the SDK's explanation) as gpulab's
    fields, so that no SDK class comes up through the Runtime."""
    status = e.status_code if isinstance(e, APIError) else None
    explanation = getattr(e, "explanation", None)
    return kind(str(e), status=status, detail=str(explanation) if explanation else "")


class EngineClient:
    """The Docker SDK's low-level client of one engine (``client``, or made on first use from
    the environment), and the calls to it on the runtime's pools."""

    def __init__(self, run: Pool, run_exec: Pool, client: docker.APIClient | None = None):
        self._run = run
        self._run_exec = run_exec
        self._client = client

    @property
    def client(self) -> docker.APIClient:
        if self._client is None:
            # the engine DOCKER_HOST names (with DOCKER_TLS_VERIFY, DOCKER_CERT_PATH), as the
            # hub's DockerSpawner and the docker CLI find it; else the default socket
            try:  # "auto" asks the engine its version: an engine down fails here
                self._client = docker.APIClient(version="auto", timeout=120, **kwargs_from_env())
            except DockerException as e:
                raise engine_error(e) from e
        return self._client

    async def call(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` on the engine pool; the SDK's errors as gpulab's."""
        try:
            return await self._run(fn, *args, **kwargs)
        except DockerException as e:
            raise engine_error(e) from e

    async def call_exec(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` on the exec pool; the SDK's errors as gpulab's."""
        try:
            return await self._run_exec(fn, *args, **kwargs)
        except DockerException as e:
            raise engine_error(e) from e
