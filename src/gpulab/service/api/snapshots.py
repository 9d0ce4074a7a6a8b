"""REST API of workspace snapshots (under /services/gpulab/api/snapshots/{user}): list, take,
read, restore into a notebook, delete (:mod:`gpulab.notebooks.snapshots`).

A user's own, or anyone's for an admin; someone else's snapshots are a 404 with the answer of
a snapshot that does not exist, so that their existence is not revealed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ...jobs import snapshots as job_snapshots
from ...notebooks import snapshots
from ..base import NB_MANAGE, NB_READ, ApiError, BaseHandler, authenticated


@contextlib.contextmanager
def _answered() -> Iterator[None]:
    try:
        yield
    except (snapshots.SnapshotRefused, job_snapshots.SnapshotRefused) as e:
        raise ApiError(e.status, e.message, field=e.field) from None


class SnapshotsBase(BaseHandler):
    def owner(self, user: str, scope: str, what: str) -> None:
        """The caller may act on ``user``'s snapshots (their own; an admin: anyone's); else
        the 404 of ``what`` missing."""
        me = self.require(scope)
        if not self.may_read(me, user):
            raise ApiError(404, what)


class SnapshotsHandler(SnapshotsBase):
    @authenticated
    async def get(self, user: str):
        """The user's snapshots and the bytes they hold together."""
        self.owner(user, NB_READ, f"no snapshots for {user}")
        with _answered():
            self.write_json(await snapshots.listing(self.settings["gpulab"], user))

    @authenticated
    async def post(self, user: str):
        """Take a snapshot: {"name": ..., "notebook": SERVER} of a notebook's workspace, or
        {"name": ..., "job": ID, "volume": MOUNT} of a job's rw volume; 201 with its summary."""
        self.owner(user, NB_MANAGE, f"no snapshots for {user}")
        body = self.body()
        with _answered():
            if "job" in body or "volume" in body:
                taken = await job_snapshots.take(self.settings["gpulab"], self.jobs, user, body)
            else:
                taken = await snapshots.take(self.settings["gpulab"], self.records, user, body)
        self.set_header("Location", f"{self.request.path.rstrip('/')}/{taken['name']}")
        self.write_json(taken, 201)


class SnapshotHandler(SnapshotsBase):
    @authenticated
    async def get(self, user: str, name: str):
        self.owner(user, NB_READ, f"no snapshot {name} for {user}")
        with _answered():
            self.write_json(await snapshots.one(self.settings["gpulab"], user, name))

    @authenticated
    async def delete(self, user: str, name: str):
        """Delete it, and the blobs no other snapshot of the user refers to."""
        self.owner(user, NB_MANAGE, f"no snapshot {name} for {user}")
        with _answered():
            self.write_json(await snapshots.remove(self.settings["gpulab"], user, name))


class SnapshotRestoreHandler(SnapshotsBase):
    @authenticated
    async def post(self, user: str, name: str):
        """Restore it into notebook {"notebook": SERVER} (new, STOPPED or DELETED)."""
        self.owner(user, NB_MANAGE, f"no snapshot {name} for {user}")
        body = self.body()
        with _answered():
            done = await snapshots.restore(
                self.settings["gpulab"], self.records, self.settings["runtime"], user, name, body
            )
        self.write_json(done)
