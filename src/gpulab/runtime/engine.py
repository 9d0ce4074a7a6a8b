"""The Docker Engine API client that both backends hold (one engine, or a Swarm's manager),
and the one place where the Docker SDK's errors become gpulab's :class:`~.base.EngineError`.

A backend hands its :class:`EngineClient` the runtime's pools (``Runtime.run`` for engine
calls, ``Runtime.run_exec`` for execs) and makes every blocking SDK call through
:meth:`EngineClient.call` or :meth:`EngineClient.call_exec`: the call runs off the event
loop, and an SDK error comes up as gpulab's error, its status and the engine's words as
gpulab's fields, never as an SDK class. An engine that gave no answer (down, a wrong address,
a connection cut or timed out: requests', urllib3's and the socket's errors, which the SDK
lets through) comes up as :class:`~.base.EngineUnreachable`, naming the engine's address.

Which engine: the client the backend is handed (the hub's spawner's, DockerSpawner's), else
one made from the environment as ``docker.from_env`` does (``DOCKER_HOST``,
``DOCKER_TLS_VERIFY``, ``DOCKER_CERT_PATH``; without them this host's
``/var/run/docker.sock``).
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Awaitable, Callable, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import docker
import requests
import urllib3
from docker.errors import APIError, DockerException
from docker.utils import kwargs_from_env

from .base import EngineError, EngineUnreachable

#: runs a blocking call on a pool of the runtime (Runtime.run, Runtime.run_exec)
Pool = Callable[..., Awaitable[Any]]

#: where the SDK goes without DOCKER_HOST
DEFAULT_ENGINE = "unix:///var/run/docker.sock"

#: what the SDK's transport raises when the engine gave no answer (requests' errors are
#: OSErrors; urllib3's come up from a stream read past the SDK)
NO_ANSWER: tuple[type[BaseException], ...] = (OSError, urllib3.exceptions.HTTPError)

_TIMEOUTS = (requests.Timeout, urllib3.exceptions.TimeoutError, socket.timeout)


def engine_error(e: DockerException, kind: type[EngineError] = EngineError) -> EngineError:
    """The SDK's ``e`` as gpulab's ``kind`` (an :class:`~.base.EngineError`): its message,
    the engine's HTTP status and the engine's own words (the SDK's explanation) as gpulab's
    fields, so that no SDK class comes up through the Runtime."""
    status = e.status_code if isinstance(e, APIError) else None
    explanation = getattr(e, "explanation", None)
    return kind(str(e), status=status, detail=str(explanation) if explanation else "")


def _chain(e: BaseException) -> Iterator[BaseException]:
    """``e`` and what caused it, outermost first (causes, contexts, urllib3's ``reason`` and
    the exceptions requests and urllib3 wrap in their arguments)."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        inner = e.__cause__ or e.__context__ or getattr(e, "reason", None)
        if not isinstance(inner, BaseException):  # wrapped in the arguments
            inner = next((a for a in e.args if isinstance(a, BaseException)), None)
        e = inner


def no_answer(e: BaseException) -> bool:
    """Whether ``e`` (or what caused it) says that the engine gave no answer at all. An
    answer with an error status is an answer (the SDK's APIError, requests' HTTPError)."""
    for x in _chain(e):
        if isinstance(x, APIError | requests.HTTPError):
            return False
        if isinstance(x, NO_ANSWER):
            return True
    return False


def unreachable(e: BaseException, url: str) -> EngineUnreachable:
    """A call that got no answer from the engine at ``url`` (``e``: the transport's error, or
    the SDK's around it), in a few words: the socket's reason ("Connection refused", "No such
    file or directory"), not urllib3's account of its connection pool."""
    chain = list(_chain(e))
    why = next((x.strerror for x in reversed(chain) if isinstance(x, OSError) and x.strerror), "")
    if not why and any(isinstance(x, _TIMEOUTS) for x in chain):
        return EngineUnreachable(f"Docker engine at {url} did not answer in time", url=url)
    why = why or str(chain[-1]) or type(chain[-1]).__name__
    return EngineUnreachable(f"Docker engine at {url} is unreachable: {why}", url=url)


def translated(e: BaseException, url: str) -> EngineError | None:
    """gpulab's error for what an SDK call raised (None: not the engine's, let it be)."""
    if isinstance(e, EngineError):
        return None
    if no_answer(e):
        return unreachable(e, url)
    if isinstance(e, DockerException):
        return engine_error(e)
    return None


def shown_url(url: str) -> str:
    """The engine's address as a message may show it: without a password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = (f"{parts.username}@" if parts.username else "") + host
    netloc += f":{parts.port}" if parts.port else ""
    return urlunsplit(parts._replace(netloc=netloc))


def client_url(client: docker.APIClient) -> str:
    """Where ``client`` goes, as DOCKER_HOST would say it."""
    adapter = getattr(client, "_custom_adapter", None)
    for attr, scheme in (("socket_path", "unix://"), ("npipe_path", "npipe://")):
        path = getattr(adapter, attr, None)
        if path:
            return scheme + path
    host = getattr(adapter, "ssh_host", None)
    if host:
        return shown_url(host if "://" in host else "ssh://" + host)
    url = str(getattr(client, "base_url", "") or DEFAULT_ENGINE)
    scheme, _, rest = url.partition("://")
    if scheme in ("http", "https"):  # the SDK's form of tcp:// (https: with TLS)
        url = "tcp://" + rest
    return shown_url(url)


def env_url(environment=None) -> str:
    """The engine the environment names (``DOCKER_HOST``), else the SDK's default."""
    return shown_url(kwargs_from_env(environment).get("base_url") or DEFAULT_ENGINE)


@contextlib.contextmanager
def engine_errors(url: str):
    """Within the block, the SDK's and its transport's errors as gpulab's."""
    try:
        yield
    except Exception as e:
        err = translated(e, url)
        if err is None:
            raise
        raise err from e


def stream_errors(chunks: Iterator[bytes], url: str) -> Iterator[bytes]:
    """``chunks`` (a log stream's), with a read that fails raising gpulab's error."""
    with engine_errors(url):
        yield from chunks


#: what a backend is handed for its engine: a client, a function that makes one on first use
#: (the hub's: DockerSpawner's), or None (one made from the environment)
ClientSource = docker.APIClient | Callable[[], docker.APIClient] | None


def client_from_env() -> docker.APIClient:
    """A client of the engine the environment names, as ``docker.from_env`` makes it
    (``DOCKER_HOST``, ``DOCKER_TLS_VERIFY``, ``DOCKER_CERT_PATH``), with gpulab's time-out."""
    return docker.APIClient(**{"version": "auto", "timeout": 120, **kwargs_from_env()})


class EngineClient:
    """The Docker SDK's low-level client of one engine (``client``; or made on first use by
    the function given, else from the environment as ``docker.from_env`` does), and the
    calls to it on the runtime's pools."""

    def __init__(self, run: Pool, run_exec: Pool, client: ClientSource = None):
        self._run = run
        self._run_exec = run_exec
        made = isinstance(client, docker.APIClient)
        self._client: docker.APIClient | None = client if made else None
        self._make: Callable[[], docker.APIClient] = client_from_env if client is None else client
        #: the engine's address (DOCKER_HOST's form), as errors name it (until a client is
        #: made by the function given: the environment's)
        self.url = client_url(client) if made else env_url()

    @property
    def client(self) -> docker.APIClient:
        if self._client is None:
            # "auto" asks the engine its version: an engine down fails here (and the next
            # call tries again)
            with engine_errors(self.url):
                made = self._make()
            self.url = client_url(made)
            self._client = made
        return self._client

    async def call(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` on the engine pool; the SDK's errors as gpulab's."""
        with engine_errors(self.url):
            return await self._run(fn, *args, **kwargs)

    async def call_exec(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` on the exec pool; the SDK's errors as gpulab's."""
        with engine_errors(self.url):
            return await self._run_exec(fn, *args, **kwargs)
