"""Images from registries through the Docker Engine API: the registry's digest for an image
(``GET /distribution/NAME/json``, the registry asked with the caller's credentials) and a
pull that reports its bytes. Blocking calls, run on the runtime's pool.

The credentials travel in the ``X-Registry-Auth`` header of these two calls only: they are
never stored in the engine (no ``docker login``), so another user's pull cannot use them. A
user without credentials is sent as anonymous (:func:`sent_auth`), never with whatever the
service's own account keeps in ``~/.docker/config.json`` (which docker-py reads for a call
given no credentials).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable

import docker
from docker.errors import DockerException
from docker.types import CancellableStream

from .base import ImagePullFailed, PullProgress
from .engine import engine_error, no_answer

#: longest registry message kept (a registry's HTML error page is cut)
MAX_REASON_CHARS = 500
#: statuses after which a layer's bytes are all there
_LAYER_DONE = ("Download complete", "Pull complete", "Already exists", "Verifying Checksum")


def _reason(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 1] + "…"


def _failed(e: DockerException) -> ImagePullFailed:
    err = engine_error(e, ImagePullFailed)
    # the engine's own words (the registry's), without the SDK's URL of the engine call
    return ImagePullFailed(_reason(err.detail or str(e)), status=err.status, detail=err.detail)


def sent_auth(auth: dict[str, str] | None) -> dict[str, str]:
    """What a registry call sends: the user's credentials, or an empty header (anonymous):
    docker-py given None would send the credentials it finds in this process's Docker
    configuration (an operator's ``docker login`` as the service's account)."""
    return dict(auth) if auth else {}


def registry_digest_blocking(
    client: docker.APIClient, image: str, auth: dict[str, str] | None
) -> str:
    try:
        info = client.inspect_distribution(image, auth_config=sent_auth(auth))
    except DockerException as e:
        if no_answer(e):
            raise
        raise _failed(e) from None
    digest = ((info or {}).get("Descriptor") or {}).get("digest") or ""
    if not digest.startswith("sha256:"):
        raise ImagePullFailed(f"the registry gave no digest for {image}")
    return digest


class LayerBytes:
    """Adds up a pull's progress messages (one per layer event) into :class:`PullProgress`."""

    def __init__(self) -> None:
        self.layers: dict[str, tuple[int, int]] = {}
        self.status = ""

    def add(self, event: dict) -> PullProgress:
        layer, status = event.get("id") or "", str(event.get("status") or "")
        detail = event.get("progressDetail") or {}
        if layer and status == "Downloading" and detail.get("total"):
            self.layers[layer] = (int(detail.get("current") or 0), int(detail["total"]))
        elif layer and status in _LAYER_DONE and layer in self.layers:
            total = self.layers[layer][1]
            self.layers[layer] = (total, total)
        elif layer and status.startswith("Pulling fs layer"):
            self.layers.setdefault(layer, (0, 0))
        self.status = _reason(status)
        return PullProgress(
            done=sum(c for c, _ in self.layers.values()),
            total=sum(t for _, t in self.layers.values()),
            layers=len(self.layers),
            status=self.status,
        )


class GiveUp:
    """A caller giving up on a pull (its time-out), set from the event loop: the pull's
    thread stops at the engine's next message, and a call still waiting on an engine that
    sends nothing (a registry that stalled) is hung up at once (its socket shut down, as
    docker-py's own ``CancellableStream`` does for events), so that no engine thread stays
    held by it. The engine stops pulling when its caller hangs up."""

    def __init__(self) -> None:
        self._given_up = threading.Event()
        self._lock = threading.Lock()
        self._call: CancellableStream | None = None

    def is_set(self) -> bool:
        return self._given_up.is_set()

    def set(self) -> None:
        self._given_up.set()
        self._hang_up()

    def hold(self, call: CancellableStream) -> None:
        """The pull's call, to hang up when given up (at once if it already was)."""
        with self._lock:
            self._call = call
        if self._given_up.is_set():
            self._hang_up()

    def _hang_up(self) -> None:
        with self._lock:
            call, self._call = self._call, None
        if call is not None:
            with contextlib.suppress(Exception):  # already closed, or never connected
                call.close()


def _pull_call(client: docker.APIClient, image: str, auth: dict[str, str] | None):
    """``client.pull`` (streamed) and its HTTP response, kept by a response hook of this
    thread's call: docker-py hands out the messages, not the response to hang up."""
    me = threading.get_ident()
    seen: list = []

    def keep(response, *args, **kwargs):
        if threading.get_ident() == me and "/images/create" in (response.url or ""):
            seen.append(response)

    hooks = client.hooks.setdefault("response", [])
    hooks.append(keep)
    try:
        events = client.pull(image, stream=True, decode=True, auth_config=sent_auth(auth))
    finally:
        with contextlib.suppress(ValueError):
            hooks.remove(keep)
    return events, (seen[-1] if seen else None)


def pull_blocking(
    client: docker.APIClient,
    image: str,
    auth: dict[str, str] | None,
    on_progress: Callable[[PullProgress], None],
    max_bytes: int = 0,
    given_up: GiveUp | None = None,
) -> None:
    """Pull ``image``, reporting its bytes; stop (closing the call) when its layers announce
    more than ``max_bytes`` or the caller gave up (``given_up``: at the engine's next
    message, or at once for an engine that sends nothing, see :class:`GiveUp`)."""
    added = LayerBytes()
    events = None
    try:
        events, response = _pull_call(client, image, auth)
        if given_up is not None and response is not None:
            given_up.hold(CancellableStream(events, response))
        for event in events:
            if not isinstance(event, dict):
                continue
            if event.get("error"):
                raise ImagePullFailed(_reason(event["error"]))
            if given_up is not None and given_up.is_set():
                raise ImagePullFailed("the pull was given up (image_pull_timeout)")
            progress = added.add(event)
            on_progress(progress)
            if max_bytes and progress.total > max_bytes:
                raise ImagePullFailed(
                    f"the image's layers weigh more than the site's cap of "
                    f"{max_bytes / 1e9:.1f} GB (image_max_bytes)"
                )
    except DockerException as e:
        if given_up is not None and given_up.is_set():
            raise ImagePullFailed("the pull was given up (image_pull_timeout)") from None
        if no_answer(e):
            raise
        raise _failed(e) from None
    except Exception:  # noqa: BLE001 - the call hung up under its reader (urllib3's words)
        if given_up is not None and given_up.is_set():
            raise ImagePullFailed("the pull was given up (image_pull_timeout)") from None
        raise
    finally:  # a pull given up (its cap passed): the call is closed, not read to its end
        close = getattr(events, "close", None)
        if close is not None:
            close()


async def pull_on_pool(call, pull: Callable, target, image: str, auth, on_progress, max_bytes: int):
    """``pull(target, image, auth, progress, max_bytes, given_up)`` (:func:`pull_blocking`, or
    a runtime's own that ends in it) on the engine's pool through ``call``: its progress
    handed to ``on_progress`` on the event loop, and a caller that gives up (cancelled: its
    time-out) hangs the pull up (:class:`GiveUp`)."""
    loop = asyncio.get_running_loop()

    def threadsafe(progress: PullProgress) -> None:
        loop.call_soon_threadsafe(on_progress, progress)

    given_up = GiveUp()
    try:
        await call(pull, target, image, auth, threadsafe, max_bytes, given_up)
    except asyncio.CancelledError:
        given_up.set()
        raise
