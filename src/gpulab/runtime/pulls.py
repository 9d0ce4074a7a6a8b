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

import threading
from collections.abc import Callable

import docker
from docker.errors import DockerException

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


def pull_blocking(
    client: docker.APIClient,
    image: str,
    auth: dict[str, str] | None,
    on_progress: Callable[[PullProgress], None],
    max_bytes: int = 0,
    given_up: threading.Event | None = None,
) -> None:
    """Pull ``image``, reporting its bytes; stop (closing the call) when its layers announce
    more than ``max_bytes`` or the caller gave up (``given_up``, checked at each message of
    the engine: a registry that sends nothing at all holds the call until it answers)."""
    added = LayerBytes()
    events = None
    try:
        events = client.pull(image, stream=True, decode=True, auth_config=sent_auth(auth))
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
        if no_answer(e):
            raise
        raise _failed(e) from None
    finally:  # a pull given up (its cap passed): the call is closed, not read to its end
        close = getattr(events, "close", None)
        if close is not None:
            close()
