"""Snapshots in the object store (the rules and the layout: :mod:`gpulab.snapshots`): take,
list, restore and delete, each a few server-side calls made by the service itself, in the
workspace bucket, with the store's keys it already holds for its listings.

Nothing goes through a helper container: no byte of a workspace leaves the store (S3's
CopyObject, or a file copy inside the embedded filesystem store), and nothing is read from
or written to a workload's volume. Every call is blocking: call them on a worker thread.
One user's snapshot operations run one at a time in this process (a lock per user), so a
delete never removes a blob that a snapshot being taken has just found present.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..datasync.filesystem import META_DIR, FilesystemRemote, meta_fields
from ..datasync.localtree import RESERVED_PREFIX, normalize_prefix
from ..datasync.s3_settings import S3Settings
from ..errors import FieldError
from ..snapshots import (
    MAX_SNAPSHOT_OBJECTS,
    Snapshot,
    blob_key,
    blobs_prefix,
    count_refusal,
    manifest_key,
    manifests_prefix,
    new_blobs,
    quota_refusal,
    restore_plan,
    unreferenced,
)
from ..volumes import ObjectStore
from .sync import HELPER_GID, HELPER_UID, _ensure_dir, store_remote

#: threads that read objects' digests and copy objects of one operation
COPY_THREADS = 8
_BUF = 1024 * 1024
META_SHA256 = "gpulab-sha256"  # the sync engine's (datasync.s3.META_SHA256, META_MODE)
META_MODE = "gpulab-mode"


class SnapshotRefused(Exception):
    """A snapshot operation refused: ``status`` (HTTP) and the user's message."""

    def __init__(self, status: int, message: str, field: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field


_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


@contextlib.contextmanager
def _one_at_a_time(user: str) -> Iterator[None]:
    with _locks_guard:
        lock = _locks.setdefault(user, threading.Lock())
    with lock:
        yield


# --- one bucket of a store, as snapshots use it ---------------------------------------------


class Objects:
    """The few calls snapshots make of one bucket: list (key, size, change token), a
    digest, a copy (verified against the content's digest), JSON documents, deletes."""

    store: str
    bucket: str

    def list(self, prefix: str) -> Iterator[tuple[str, int, str]]:
        raise NotImplementedError

    def describe(self, key: str, etag: str) -> tuple[str, int | None, bool]:
        """(sha256, permission bits or None, whether it is a symbolic link's object) of the
        object whose content is ``etag``'s, from the sync's metadata (the digest read from
        the content where the sync kept none)."""
        raise NotImplementedError

    def copy(
        self,
        src: str,
        dst: str,
        sha256: str,
        etag: str | None = None,
        src_bucket: str = "",
        mode: int | None = None,
    ) -> None:
        """Copy ``src`` (of ``src_bucket`` on the same store; "": this bucket) to ``dst``,
        recording ``sha256`` (and ``mode``, as the sync records a file's permission bits);
        fails when the source no longer has that content (``etag``)."""
        raise NotImplementedError

    def get_json(self, key: str) -> Any | None:
        raise NotImplementedError

    def put_json(self, key: str, data: Any) -> None:
        raise NotImplementedError

    def delete(self, keys: list[str]) -> None:
        raise NotImplementedError


class S3Objects(Objects):
    def __init__(self, store: ObjectStore, bucket: str):
        self.store = store.name
        self.bucket = bucket
        settings = S3Settings(max_attempts=3, connect_timeout=5.0, read_timeout=60.0)
        self.remote = store_remote(store, bucket, settings)
        self.client = self.remote.client

    def list(self, prefix: str) -> Iterator[tuple[str, int, str]]:
        from botocore.exceptions import ClientError

        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix
        )
        try:
            for page in pages:
                for item in page.get("Contents", ()):
                    if not item["Key"].endswith("/"):
                        yield item["Key"], int(item["Size"]), item["ETag"].strip('"')
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") != "NoSuchBucket":
                raise

    def describe(self, key: str, etag: str) -> tuple[str, int | None, bool]:
        from ..datasync.s3 import meta_fields

        head = self.client.head_object(Bucket=self.bucket, Key=key, IfMatch=f'"{etag}"')
        mode, link = meta_fields(head.get("Metadata"))
        known = (head.get("Metadata") or {}).get(META_SHA256, "")
        if len(known) == 64:
            return known, mode, link
        # an object the sync did not write (no digest kept): read it once
        body = self.client.get_object(Bucket=self.bucket, Key=key, IfMatch=f'"{etag}"')["Body"]
        sha = hashlib.sha256()
        for chunk in iter(lambda: body.read(_BUF), b""):
            sha.update(chunk)
        return sha.hexdigest(), mode, link

    def copy(
        self,
        src: str,
        dst: str,
        sha256: str,
        etag: str | None = None,
        src_bucket: str = "",
        mode: int | None = None,
    ) -> None:
        metadata = {META_SHA256: sha256}
        if mode is not None:
            metadata[META_MODE] = f"{mode:o}"
        extra = {"Metadata": metadata, "MetadataDirective": "REPLACE"}
        if etag:  # the content whose digest was read, or nothing
            extra["CopySourceIfMatch"] = f'"{etag}"'
        source = {"Bucket": src_bucket or self.bucket, "Key": src}
        self.client.copy(source, self.bucket, dst, ExtraArgs=extra)

    def get_json(self, key: str) -> Any | None:
        from botocore.exceptions import ClientError

        try:
            body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NoSuchBucket"):
                return None
            raise
        return json.loads(body)

    def put_json(self, key: str, data: Any) -> None:
        from botocore.exceptions import ClientError

        body = json.dumps(data, separators=(",", ":")).encode()
        put = functools.partial(
            self.client.put_object,
            Bucket=self.bucket,
            Key=key,
            Body=body,
            ContentType="application/json",
            Metadata={META_SHA256: hashlib.sha256(body).hexdigest()},
        )
        try:
            put()
        except ClientError as e:  # the first snapshot of an empty workspace on a fresh store
            if e.response.get("Error", {}).get("Code") != "NoSuchBucket":
                raise
            self.remote.ensure_bucket()
            put()

    def delete(self, keys: list[str]) -> None:
        for i in range(0, len(keys), 1000):
            batch = [{"Key": k} for k in keys[i : i + 1000]]
            answer = self.client.delete_objects(
                Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True}
            )
            if answer.get("Errors"):
                first = answer["Errors"][0]
                raise OSError(f"cannot delete {first.get('Key')}: {first.get('Message')}")


class FilesystemObjects(Objects):
    """The embedded store: ``<root>/<bucket>/<key>`` and its sidecar
    ``<root>/.gpulab-meta/<bucket>/<key>.json`` ({size, sha256}), as the sync writes them."""

    def __init__(self, store: ObjectStore, bucket: str):
        self.store = store.name
        self.root = Path(store.root or "/nonexistent")
        self.bucket = bucket
        self.remote = FilesystemRemote(self.root, bucket)

    def _path(self, key: str) -> Path:
        return self.root / self.bucket / key

    def _meta(self, key: str) -> Path:
        return self.root / META_DIR / self.bucket / f"{key}.json"

    def list(self, prefix: str) -> Iterator[tuple[str, int, str]]:
        for o in self.remote.list(prefix):
            yield o.key, o.size, o.etag

    def describe(self, key: str, etag: str) -> tuple[str, int | None, bool]:
        meta = None
        with contextlib.suppress(OSError, ValueError):
            meta = json.loads(self._meta(key).read_text())
        mode, link = meta_fields(meta)
        known = meta.get("sha256") if isinstance(meta, dict) else None
        if isinstance(known, str) and len(known) == 64:
            return known, mode, link
        return self._hash(self._path(key)), mode, link

    @staticmethod
    def _hash(path: Path) -> str:
        sha = hashlib.sha256()
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with open(fd, "rb") as f:
            for chunk in iter(lambda: f.read(_BUF), b""):
                sha.update(chunk)
        return sha.hexdigest()

    def _dirs_for(self, path: Path) -> None:
        """Make ``path``'s directories below the store's root without following a link,
        owned by the helper's user (it writes there at the next push)."""
        rel = os.path.relpath(path.parent, self.root)
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            _ensure_dir(fd, rel, self.store)
        finally:
            os.close(fd)

    def _write(self, dest: Path, write: Callable[[Any], None]) -> None:
        self._dirs_for(dest)
        tmp = dest.parent / f"{RESERVED_PREFIX}-tmp-{os.urandom(6).hex()}"
        try:
            with open(tmp, "xb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            if os.geteuid() == 0:
                os.chown(tmp, HELPER_UID, HELPER_GID)
            os.replace(tmp, dest)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    def copy(
        self,
        src: str,
        dst: str,
        sha256: str,
        etag: str | None = None,
        src_bucket: str = "",
        mode: int | None = None,
    ) -> None:
        sha = hashlib.sha256()
        size = 0
        source = self.root / (src_bucket or self.bucket) / src

        def write(out) -> None:
            nonlocal size
            fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with open(fd, "rb") as f:
                for chunk in iter(lambda: f.read(_BUF), b""):
                    out.write(chunk)
                    sha.update(chunk)
                    size += len(chunk)
            if sha.hexdigest() != sha256:
                raise ChangedMeanwhile(src)

        self._write(self._path(dst), write)
        extra = {} if mode is None else {"mode": mode}
        meta = json.dumps({"size": size, "sha256": sha256, **extra}).encode()
        self._write(self._meta(dst), lambda f: f.write(meta))

    def get_json(self, key: str) -> Any | None:
        try:
            fd = os.open(self._path(key), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        with open(fd, "rb") as f:
            return json.loads(f.read())

    def put_json(self, key: str, data: Any) -> None:
        body = json.dumps(data, separators=(",", ":")).encode()
        self._write(self._path(key), lambda f: f.write(body))
        meta = json.dumps({"size": len(body), "sha256": hashlib.sha256(body).hexdigest()})
        self._write(self._meta(key), lambda f: f.write(meta.encode()))

    def delete(self, keys: list[str]) -> None:
        failed = self.remote.delete_many(keys)
        if failed:
            raise OSError(f"cannot delete {failed[0][0]}: {failed[0][1]}")


class ChangedMeanwhile(Exception):
    """An object changed between the read of its digest and its copy."""


def objects_of(store: ObjectStore, bucket: str) -> Objects:
    return (
        FilesystemObjects(store, bucket) if store.kind == "filesystem" else S3Objects(store, bucket)
    )


# --- the operations -------------------------------------------------------------------------


def _store_failure(store: str, e: Exception) -> SnapshotRefused:
    if isinstance(e, SnapshotRefused):
        return e
    text = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
    return SnapshotRefused(502, f"store {store}: {text}")


@contextlib.contextmanager
def _answered(objects: Objects) -> Iterator[None]:
    """A store's failure as a 502 naming the store (never a 500); a refusal as it is."""
    try:
        yield
    except SnapshotRefused:
        raise
    except FieldError as e:  # a name that cannot make a key (gpulab.snapshots)
        raise SnapshotRefused(400, str(e), e.field) from None
    except ChangedMeanwhile:
        raise SnapshotRefused(
            409, "the data changed while it was read (a push under way?): try again"
        ) from None
    except Exception as e:  # noqa: BLE001 - boto's, OSError...: the store failed
        code = getattr(e, "response", {}).get("Error", {}).get("Code", "")
        if code in ("PreconditionFailed", "412"):
            raise SnapshotRefused(
                409, "the data changed while it was read (a push under way?): try again"
            ) from None
        raise _store_failure(objects.store, e) from None


def _snapshots(objects: Objects, user: str) -> list[Snapshot]:
    found = []
    for key, _, _ in objects.list(manifests_prefix(user)):
        data = objects.get_json(key)
        if data is None:
            continue
        try:
            found.append(Snapshot.from_json(data))
        except Exception:  # noqa: BLE001 - a manifest gpulab did not write: not listed
            continue
    return sorted(found, key=lambda s: (s.created, s.name))


def _blobs(objects: Objects, user: str) -> dict[str, int]:
    prefix = blobs_prefix(user)
    return {key[len(prefix) :]: size for key, size, _ in objects.list(prefix)}


def _digests(objects: Objects, prefix: str, limit: int) -> dict[str, tuple]:
    """relative key -> (sha256, size, etag, mode) of every object under ``prefix``; a
    symbolic link's object (a home's; workspaces and job volumes have none) is left out."""
    listed = list(objects.list(prefix))
    if len(listed) > limit:
        raise SnapshotRefused(
            409, f"{prefix} holds {len(listed)} objects, more than a snapshot may ({limit})"
        )
    with ThreadPoolExecutor(COPY_THREADS, thread_name_prefix="gpulab-snapshot") as pool:
        described = list(pool.map(lambda item: objects.describe(item[0], item[2]), listed))
    return {
        key[len(prefix) :]: (sha, size, etag, mode)
        for (key, size, etag), (sha, mode, link) in zip(listed, described, strict=True)
        if not link
    }


def take(
    objects: Objects,
    user: str,
    name: str,
    source_prefix: str,
    source: dict[str, str],
    quota: int | None,
    max_count: int,
    source_objects: Objects | None = None,
) -> dict:
    """Take snapshot ``name`` of what ``source_prefix`` holds now (in ``source_objects``, a
    bucket of the same store; None: the snapshots' own bucket): copy each content whose blob
    is absent, then write the manifest. Its summary, with ``new_bytes`` (the blobs it added).
    SnapshotRefused: 409 (the name is taken, over the count or the quota, the data changed
    meanwhile), 502 (the store failed)."""
    origin = source_objects or objects
    prefix = normalize_prefix(source_prefix)
    with _one_at_a_time(user), _answered(objects):
        existing = _snapshots(objects, user)
        if any(s.name == name for s in existing):
            raise SnapshotRefused(409, f"you already have a snapshot named {name}", "name")
        why = count_refusal(len(existing), max_count)
        if why:
            raise SnapshotRefused(409, why)
        found = _digests(origin, prefix, MAX_SNAPSHOT_OBJECTS)
        snapshot = Snapshot(
            name=name,
            created=datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
            source=source,
            objects={key: (sha, size) for key, (sha, size, _, _) in found.items()},
            modes={key: mode for key, (_, _, _, mode) in found.items() if mode is not None},
        )
        present = _blobs(objects, user)
        adding = new_blobs(snapshot.objects, present)
        why = quota_refusal(sum(present.values()), sum(adding.values()), quota)
        if why:
            raise SnapshotRefused(409, why)
        first_key = {}
        for key, (sha, _, etag, _) in found.items():
            if sha in adding:
                first_key.setdefault(sha, (key, etag))
        with ThreadPoolExecutor(COPY_THREADS, thread_name_prefix="gpulab-snapshot") as pool:
            list(
                pool.map(
                    lambda item: objects.copy(
                        prefix + item[1][0],
                        blob_key(user, item[0]),
                        item[0],
                        item[1][1],
                        origin.bucket,
                    ),
                    first_key.items(),
                )
            )
        objects.put_json(manifest_key(user, name), snapshot.to_json())
        return {**snapshot.summary(), "new_bytes": sum(adding.values())}


def listing(objects: Objects, user: str) -> dict:
    """The user's snapshots (oldest first) and the bytes their blobs hold together."""
    with _one_at_a_time(user), _answered(objects):
        snapshots = _snapshots(objects, user)
        blobs = _blobs(objects, user)
    return {
        "snapshots": [s.summary() for s in snapshots],
        "stored_bytes": sum(blobs.values()),
    }


def _manifest(objects: Objects, user: str, name: str) -> Snapshot:
    data = objects.get_json(manifest_key(user, name))
    if data is None:
        raise SnapshotRefused(404, f"no snapshot {name} for {user}")
    try:
        return Snapshot.from_json(data)
    except ValueError as e:
        raise SnapshotRefused(502, f"snapshot {name} cannot be read: {e}") from None


def one(objects: Objects, user: str, name: str) -> dict:
    with _answered(objects):
        return _manifest(objects, user, name).summary()


def remove(objects: Objects, user: str, name: str) -> dict:
    """Delete the manifest, then every blob no other snapshot of the user refers to."""
    with _one_at_a_time(user), _answered(objects):
        _manifest(objects, user, name)
        objects.delete([manifest_key(user, name)])
        rest = _snapshots(objects, user)
        blobs = _blobs(objects, user)
        gone = sorted(unreferenced(blobs, rest))
        objects.delete([blob_key(user, sha) for sha in gone])
        return {"name": name, "deleted": True, "freed_bytes": sum(blobs[b] for b in gone)}


def restore(objects: Objects, user: str, name: str, target_prefix: str) -> dict:
    """Make ``target_prefix`` hold exactly snapshot ``name``'s objects: copy the contents
    that differ from their blobs, delete the keys the snapshot lacks."""
    prefix = normalize_prefix(target_prefix)
    with _one_at_a_time(user), _answered(objects):
        snapshot = _manifest(objects, user, name)
        target = _digests(objects, prefix, MAX_SNAPSHOT_OBJECTS)
        plan = restore_plan(snapshot, {k: (sha, mode) for k, (sha, _, _, mode) in target.items()})
        with ThreadPoolExecutor(COPY_THREADS, thread_name_prefix="gpulab-snapshot") as pool:
            list(
                pool.map(
                    lambda item: objects.copy(
                        blob_key(user, item[1]),
                        prefix + item[0],
                        item[1],
                        mode=snapshot.modes.get(item[0]),
                    ),
                    plan.copy,
                )
            )
        objects.delete([prefix + key for key in plan.delete])
        return {
            "name": name,
            "copied": len(plan.copy),
            "deleted": len(plan.delete),
            "unchanged": plan.kept,
        }
