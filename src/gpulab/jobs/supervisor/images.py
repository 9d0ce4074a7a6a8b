"""A job's image, made ready at INITIALIZING: a catalog image (or one of the admin's allowed
images) must be on the engine already; an image from a registry the admin allows
(``image_registries``) is asked of the registry with the owner's credentials and pulled as
its policy says (:meth:`~gpulab.runtime.base.Runtime.fetch_image`), its bytes shown in the
job's message and its start and end as events of the job's history."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from ... import imagerefs
from ...lifecycle import JobState
from ...runtime.base import EngineUnreachable, ImagePullFailed, PullProgress
from ..gang import Rank, nodes_of
from ..spec import JobSpec
from .context import JobContext

#: seconds between two writes of a job's pull progress
EVERY = 1.0


@dataclass
class ImageNotReady(Exception):
    """The job cannot start from its image: ``reason`` (the history's) and a sentence."""

    reason: str
    message: str


async def ready_image(ctx: JobContext, job_id: str, owner: str, spec: JobSpec, gang: list[Rank]):
    """The reference the job's containers run: the image as the engine names it, or, for an
    image from a registry, pinned to the digest the registry gave this owner. Raises
    :class:`ImageNotReady`, and the secrets' errors (a pull secret deleted since the
    submission) for the caller to report as it reports the others'."""
    s = ctx.settings
    if spec.image_pull_policy is None:  # the catalog's, or one of the admin's allowed images
        ref = ctx.runtime.image_ref(spec.image)
        if not await ctx.runtime.image_exists(ref):
            raise ImageNotReady("IMAGE_MISSING", f"image {ref} is missing {ctx.runtime.images_at}")
        return ref
    try:
        allowed = imagerefs.allowed(imagerefs.parse(spec.image), s.image_registries)
    except imagerefs.ImageRefError:
        allowed = False
    if not allowed:  # the admin took the registry off the list since the submission
        msg = f"image {spec.image} is from a registry this site no longer allows"
        raise ImageNotReady("IMAGE_NOT_ALLOWED", msg)
    auth = None
    if spec.image_pull_secret:
        value = await ctx.db(ctx.secrets.reveal, owner, spec.image_pull_secret)
        try:
            auth = imagerefs.registry_auth(value, imagerefs.parse(spec.image).registry)
        except imagerefs.ImageRefError as e:
            msg = f"secret {spec.image_pull_secret}: {e}"
            raise ImageNotReady("IMAGE_PULL_FAILED", msg) from None
    policy = spec.image_pull_policy
    notes = _PullNotes(ctx, job_id, spec.image)
    await ctx.db(ctx.records.note, job_id, "progress", "IMAGE", f"preparing image {spec.image}")
    pinned = ""
    try:
        # each node that runs a worker needs its own copy; image_pull_timeout is the job's
        # (its nodes' pulls together), not each node's
        async with asyncio.timeout(s.image_pull_timeout):
            for node in nodes_of(gang):
                pinned = await ctx.runtime.fetch_image(
                    spec.image, policy, auth, notes.on_progress, node, s.image_max_size
                )
    except EngineUnreachable:
        raise  # the engine did not answer: the supervisor's guard tries again
    except ImagePullFailed as e:
        await notes.settle()
        raise ImageNotReady("IMAGE_PULL_FAILED", f"image {spec.image}: {e}") from None
    except TimeoutError:
        await notes.settle()
        msg = f"image {spec.image} was not pulled within {s.image_pull_timeout:g} s"
        raise ImageNotReady("IMAGE_PULL_FAILED", msg) from None
    await notes.settle()
    await ctx.db(ctx.records.note, job_id, "progress", "IMAGE", notes.ready(pinned))
    return pinned


class _PullNotes:
    """The job's message follows the pull's bytes (at most one write a second)."""

    def __init__(self, ctx: JobContext, job_id: str, image: str):
        self.ctx, self.job_id, self.image = ctx, job_id, image
        self.last = PullProgress()
        self.pulled = 0  # progress messages seen: 0 when nothing was pulled
        self._at = 0.0
        self._writing: asyncio.Task | None = None

    def ready(self, pinned: str) -> str:
        """The event that ends the preparation: what was pulled, if anything."""
        p = self.last
        if self.pulled == 0:
            return f"image {pinned} ready (on the node already)"
        size = f"{p.done / 1e6:.1f} MB in " if p.done else ""
        return f"image {pinned} ready (pulled {size}{p.layers} layer{'s' if p.layers != 1 else ''})"

    def on_progress(self, p: PullProgress) -> None:
        self.last = p
        self.pulled += 1
        now = time.monotonic()
        if now - self._at < EVERY or (self._writing and not self._writing.done()):
            return
        self._at = now
        line = p.line(self.image)
        self._writing = asyncio.get_running_loop().create_task(
            self.ctx.db(self.ctx.records.set_progress, self.job_id, JobState.INITIALIZING, line)
        )

    async def settle(self) -> None:
        if self._writing is not None:
            await asyncio.gather(self._writing, return_exceptions=True)
