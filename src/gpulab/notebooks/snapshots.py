"""A user's workspace snapshots (``/api/snapshots/{user}``, ``gpulab snapshot``): take one of
a notebook's workspace, list them, restore one into a new or stopped notebook, delete one.

The rules and the layout are :mod:`gpulab.snapshots`'s, the store's calls
:mod:`gpulab.data.snapshots`'s; this module says which workspace and when:

- a snapshot is of the workspace **as stored** (its last push: the stop's, or an on-demand
  push of a running notebook), which the notebook's owner has (its record must exist);
- a restore goes into a notebook that does not hold its workspace now: none by that name
  yet, DELETED, or STOPPED. Its stored workspace is made the snapshot's, and a STOPPED one's
  local copy (its workspace volume) is removed, so that its next start pulls the restored
  workspace whole. A notebook that runs, starts, stops or whose last push failed
  (SYNC_FAILED: its local copy holds what the store lacks) is refused (409).
"""

from __future__ import annotations

import asyncio
import functools
import re

from ..data import snapshots as store
from ..disk_quota import parse_size
from ..lifecycle import NotebookState
from ..names import notebook_volume_name
from ..runtime.base import EngineError, Runtime
from ..snapshots import snapshot_name, unavailable
from .records import NotebookRecords

S = NotebookState
#: where a restore may go: the notebook holds no workspace of its own now
RESTORABLE = frozenset({S.STOPPED, S.DELETED})

SnapshotRefused = store.SnapshotRefused


def _objects(settings) -> store.Objects:
    ws = settings.storage.workspace
    why = unavailable(ws.root if ws else None)
    if why:
        raise SnapshotRefused(409, why)
    return store.objects_of(settings.storage.stores[ws.store], ws.bucket)


def _name(name: object, field: str = "name") -> str:
    try:
        return snapshot_name(name, field)
    except ValueError as e:
        raise SnapshotRefused(400, str(e), getattr(e, "field", field)) from None


def _workspace_prefix(settings, user: str, server: str) -> str:
    spec = settings.storage.workspace_spec(user, server, settings.workspace_dir)
    return spec.prefix


#: a notebook's (server's) name a restore may name: what the hub's named servers take, less
#: what would leave the user's own prefix or alias another server's
_SERVER_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")


def _server(value: object) -> str:
    """A notebook's (server's) name whose workspace prefix is its own: lowercase letters,
    digits, '.', '_' and '-', starting with a letter or digit, at most 63 characters ("" is
    the default server). No '/', no leading '.' (``<root>/<user>/.home/`` holds the user's
    homes), and not "_default", whose prefix is the default server's."""
    if value == "":
        return value
    if not isinstance(value, str) or not _SERVER_NAME.fullmatch(value) or value == "_default":
        raise SnapshotRefused(
            400,
            "notebook: a notebook's (server's) name: lowercase letters, digits, '.', '_' and "
            "'-', starting with a letter or digit, at most 63 characters (\"\" for the "
            "default one)",
            "notebook",
        )
    return value


async def _off_loop(fn, *args):
    return await asyncio.get_running_loop().run_in_executor(None, functools.partial(fn, *args))


async def take(settings, records: NotebookRecords, user: str, body: dict) -> dict:
    """Snapshot ``body["name"]`` of the workspace of notebook ``body["notebook"]`` (the
    default server: "") as stored now; 404 when the user has no such notebook."""
    name = _name(body.get("name"))
    server = _server(body.get("notebook", ""))
    unknown = sorted(set(body) - {"name", "notebook"})
    if unknown:
        raise SnapshotRefused(400, f"unknown field {unknown[0][:64]!r}", unknown[0][:64])
    objects = _objects(settings)
    nb = await _off_loop(records.get, user, server)
    if nb is None or nb["state"] == S.DELETED.value:
        raise SnapshotRefused(404, f"no notebook {server or '(default)'} for {user}", "notebook")
    return await _off_loop(
        store.take,
        objects,
        user,
        name,
        _workspace_prefix(settings, user, server),
        {"kind": "notebook", "notebook": server, "state": nb["state"]},
        parse_size(settings.snapshot_quota, "snapshot_quota"),
        settings.max_snapshots,
    )


async def listing(settings, user: str) -> dict:
    result = await _off_loop(store.listing, _objects(settings), user)
    return {
        **result,
        "quota_bytes": parse_size(settings.snapshot_quota, "snapshot_quota"),
        "max_snapshots": settings.max_snapshots,
    }


async def one(settings, user: str, name: str) -> dict:
    return await _off_loop(store.one, _objects(settings), user, _name(name))


async def remove(settings, user: str, name: str) -> dict:
    return await _off_loop(store.remove, _objects(settings), user, _name(name))


async def restore(
    settings, records: NotebookRecords, runtime: Runtime, user: str, name: str, body: dict
) -> dict:
    """Make notebook ``body["notebook"]``'s stored workspace snapshot ``name``'s (see the
    module's rule on which notebooks); a STOPPED one's local workspace volume is removed."""
    name = _name(name)
    server = _server(body.get("notebook", ""))
    unknown = sorted(set(body) - {"notebook"})
    if unknown:
        raise SnapshotRefused(400, f"unknown field {unknown[0][:64]!r}", unknown[0][:64])
    objects = _objects(settings)
    nb = await _off_loop(records.get, user, server)
    if nb is not None and NotebookState(nb["state"]) not in RESTORABLE:
        raise SnapshotRefused(
            409,
            f"notebook {server or '(default)'} is {nb['state']}: a snapshot is restored into "
            "a new, STOPPED or DELETED notebook (stop it first)",
            "notebook",
        )
    result = await _off_loop(
        store.restore, objects, user, name, _workspace_prefix(settings, user, server)
    )
    if nb is not None and nb["state"] == S.STOPPED.value:
        volume = notebook_volume_name(settings.instance, user, server)
        try:
            await runtime.remove_volume(volume, nb.get("node") or "")
        except EngineError as e:
            raise SnapshotRefused(
                502,
                f"the workspace was restored in the store, but its local copy {volume} could "
                f"not be removed ({e}): delete the notebook's volume before starting it",
            ) from None
    return {**result, "notebook": server}
