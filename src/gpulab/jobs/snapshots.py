"""A snapshot of a job's output volume (``POST /api/snapshots/{user}`` with ``job`` and
``volume``, ``gpulab snapshot create NAME --job ID --volume /out``): the objects its rw or
rwd volume holds in the store now (what its pushes, live or final, left), kept as a workspace
snapshot is (:mod:`gpulab.snapshots`, :mod:`gpulab.data.snapshots`), so that it can be listed,
restored into a notebook's workspace and deleted like one.

The volume must be on the workspace store (its blobs are copied inside that store, into the
workspace bucket; a volume on another store would have to travel through the service), and
its owner must still be allowed to read it: the grant is checked again now, not only when the
job was submitted.
"""

from __future__ import annotations

import asyncio
import functools
import re

from ..data import snapshots as store
from ..disk_quota import parse_size
from ..snapshots import snapshot_name, unavailable
from ..volumes import VolumeError, check_access, parse_volume
from .records import JobRecords

SnapshotRefused = store.SnapshotRefused


async def take(settings, records: JobRecords, user: str, body: dict) -> dict:
    """Snapshot ``body["name"]`` of job ``body["job"]``'s volume mounted at
    ``body["volume"]`` (rw or rwd); 404 when the user has no such job or volume."""
    try:
        name = snapshot_name(body.get("name"))
    except ValueError as e:
        raise SnapshotRefused(400, str(e), "name") from None
    unknown = sorted(set(body) - {"name", "job", "volume"})
    if unknown:
        raise SnapshotRefused(400, f"unknown field {unknown[0][:64]!r}", unknown[0][:64])
    job_id, mount = body.get("job"), body.get("volume")
    if not isinstance(job_id, str) or not re.fullmatch(r"[a-z0-9]{1,64}", job_id):
        raise SnapshotRefused(400, "job: a job's id", "job")
    if not isinstance(mount, str) or not mount.startswith("/") or len(mount) > 1024:
        raise SnapshotRefused(400, "volume: the mount path of one of the job's volumes", "volume")
    ws = settings.storage.workspace
    why = unavailable(ws.root if ws else None)
    if why:
        raise SnapshotRefused(409, why)
    loop = asyncio.get_running_loop()
    job = await loop.run_in_executor(None, functools.partial(records.get, job_id, history=False))
    if job is None or job.get("owner") != user:
        raise SnapshotRefused(404, f"no job {job_id} of {user}", "job")
    spec = None
    for text in (job.get("spec") or {}).get("volumes") or ():
        try:
            found = parse_volume(text, settings.storage.stores, workspace=settings.workspace_dir)
        except VolumeError:
            continue  # a store removed since: not one that can be snapshotted
        if found.mount.rstrip("/") == mount.rstrip("/"):
            spec = found
    if spec is None:
        raise SnapshotRefused(404, f"job {job_id} has no volume at {mount}", "volume")
    if spec.mode not in ("rw", "rwd"):
        raise SnapshotRefused(
            409, f"{mount} is a read-only (input) volume: snapshot an rw or rwd one", "volume"
        )
    if spec.store != ws.store:
        raise SnapshotRefused(
            409,
            f"{mount} is on store {spec.store}: snapshots are kept on the workspace store "
            f"({ws.store}), and only a volume there can be copied inside it",
            "volume",
        )
    try:
        check_access(user, spec, settings.storage.grants, ws)
    except VolumeError as e:
        raise SnapshotRefused(403, f"volume: {e}", "volume") from None
    objects = store.objects_of(settings.storage.stores[ws.store], ws.bucket)
    origin = store.objects_of(settings.storage.stores[spec.store], spec.bucket)
    return await loop.run_in_executor(
        None,
        functools.partial(
            store.take,
            objects,
            user,
            name,
            spec.prefix,
            {"kind": "job", "job": job_id, "volume": spec.mount},
            parse_size(settings.snapshot_quota, "snapshot_quota"),
            settings.max_snapshots,
            origin,
        ),
    )
