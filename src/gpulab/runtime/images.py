"""Which images the engine has: the spawn form, the notebook options and the pages ask for
every catalog image, and a busy hub must not ask the engine (or a Swarm's registry) for each of
them on every request. An image found there is trusted for ``ttl`` seconds (removed meanwhile,
the start's own check finds it missing); one found missing is asked again next time, so that
an image the admin has just built is offered at once. What an image's labels say of its build
(its flavour, the CUDA it needs) is kept as long.

Each :class:`~.base.Runtime` holds one such cache (:meth:`~.base.Runtime.image_builds`,
:meth:`~.base.Runtime.missing_images`): the hub's spawners share their runtime's, the
service's pages theirs."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from ..cuda import ImageBuild

log = logging.getLogger(__name__)

#: seconds an answer of the engine about an image (there or not, its labels) is trusted
IMAGE_CHECK_TTL = 30.0


class ImageEngine(Protocol):
    """What the cache asks of an engine (a :class:`~.base.Runtime`, which holds the cache)."""

    async def image_exists(self, image: str, node: str = "") -> bool: ...

    async def image_labels(self, image: str) -> dict[str, str] | None: ...


class ImageCache:
    def __init__(self, ttl: float = IMAGE_CHECK_TTL):
        self.ttl = ttl
        self._seen: dict[str, float] = {}  # engine name -> when it was found there
        self._builds: dict[str, tuple[float, ImageBuild]] = {}  # engine name -> (when, build)

    async def missing(
        self, runtime: ImageEngine, images: Iterable[str], ref: Callable[[str], str]
    ) -> list[str]:
        """The ``images`` the engine does not have (``ref``: the name the engine runs an
        image by). An engine that does not answer hides nothing: unknown is not missing (the
        start's own check then says what is wrong)."""
        now = time.monotonic()
        out = []
        for image in sorted(set(images)):
            name = ref(image)
            seen = self._seen.get(name)
            if seen is not None and now - seen < self.ttl:
                continue
            try:
                there = await runtime.image_exists(name)
            except Exception:
                log.warning("cannot ask the engine for image %s", name, exc_info=True)
                continue
            if there:
                self._seen[name] = now
            else:
                self._seen.pop(name, None)
                out.append(image)
        return out

    async def builds(
        self, runtime: ImageEngine, images: Iterable[str], ref: Callable[[str], str]
    ) -> dict[str, ImageBuild]:
        """{image: its build, from its labels} for ``images`` (``ref``: the name the engine
        runs an image by); an image the engine lacks, or cannot tell of (a Swarm, an engine
        that does not answer), has an empty :class:`ImageBuild`."""
        now = time.monotonic()
        out = {}
        for image in sorted(set(images)):
            name = ref(image)
            kept = self._builds.get(name)
            if kept is not None and now - kept[0] < self.ttl:
                out[image] = kept[1]
                continue
            try:
                labels = await runtime.image_labels(name)
            except Exception:
                log.warning("cannot ask the engine for the labels of image %s", name, exc_info=True)
                out[image] = ImageBuild()
                continue
            out[image] = ImageBuild.from_labels(labels)
            if labels is not None:
                self._builds[name] = (now, out[image])
            else:
                self._builds.pop(name, None)
        return out
