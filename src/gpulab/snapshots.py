"""Snapshots of a workspace (pure): names, where they live, what a snapshot records, and
the plans of taking, restoring and deleting one, as values.

A snapshot is a **manifest** (key -> SHA-256 and size of every object of the workspace when
it was taken) plus **content-addressed blobs**, both under the owner's own prefix of the
workspace bucket, outside every workspace (``snapshots/<user>/``, which no volume grant
covers, so no workload can mount or change it):

    snapshots/<user>/manifests/<name>.json
    snapshots/<user>/blobs/<sha256>

Taking one copies each object to ``blobs/<its sha256>`` only when that blob is absent (a
server-side copy: no byte leaves the store), then writes the manifest; the snapshots of a
user share every unchanged object with each other. Restoring copies blobs back under the
target workspace's keys (skipping keys that already hold the same content) and deletes the
keys the snapshot does not have; deleting removes the manifest, then the blobs no other
snapshot of that user refers to. Why not a versioned bucket: see docs/snapshots.md.

Everything here is values in, values out; :mod:`gpulab.data.snapshots` does the store's I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .bounds import shown
from .errors import FieldError
from .volumes import SNAPSHOT_ROOT  # the top of every user's snapshots in the workspace bucket

SNAPSHOT_NAME_PATTERN = "^[a-z0-9][a-z0-9._-]{0,62}$"
SNAPSHOT_NAME_RE = re.compile(SNAPSHOT_NAME_PATTERN)
MAX_SNAPSHOT_NAME_CHARS = 63
#: the most objects one snapshot may hold (its manifest is read whole)
MAX_SNAPSHOT_OBJECTS = 200_000
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
VERSION = 1


class SnapshotError(FieldError):
    """A refused snapshot request; ``field`` names the input at fault."""


def snapshot_name(value: object, field: str = "name") -> str:
    if not isinstance(value, str) or not SNAPSHOT_NAME_RE.fullmatch(value):
        raise SnapshotError(
            field,
            f"{field}: a snapshot's name is 1 to {MAX_SNAPSHOT_NAME_CHARS} lowercase letters, "
            f"digits, '.', '_' or '-', starting with a letter or digit, not {shown(value)}",
        )
    return value


def user_root(user: str) -> str:
    """``snapshots/<user>``: a user name that could leave its prefix is refused (the hub's
    names never hold '/'; this holds whatever a name is)."""
    if not user or user in (".", "..") or "/" in user or "\x00" in user:
        raise SnapshotError("user", f"user {shown(user)} cannot own snapshots")
    return f"{SNAPSHOT_ROOT}/{user}"


def unavailable(workspace_root: str | None) -> str | None:
    """Why snapshots are off where workspaces live at ``workspace_root`` (None: no workspace
    store): a root that could hold ``snapshots/<user>/`` itself (none, or "snapshots") would
    let a workspace and someone's snapshots share keys."""
    if workspace_root is None:
        return "snapshots need a workspace store (c.GpulabSettings.workspace_store)"
    root = workspace_root.strip("/")
    if not root or root == SNAPSHOT_ROOT or root.startswith(f"{SNAPSHOT_ROOT}/"):
        return (
            f"snapshots are off: workspace_root {workspace_root!r} would share its keys with "
            f"the snapshots' {SNAPSHOT_ROOT}/ (give workspaces a root of their own)"
        )
    return None


def manifests_prefix(user: str) -> str:
    return f"{user_root(user)}/manifests/"


def manifest_key(user: str, name: str) -> str:
    return f"{manifests_prefix(user)}{snapshot_name(name)}.json"


def blobs_prefix(user: str) -> str:
    return f"{user_root(user)}/blobs/"


def blob_key(user: str, sha256: str) -> str:
    if not _SHA256_RE.fullmatch(sha256):
        raise ValueError(f"not a SHA-256: {sha256[:80]!r}")
    return f"{blobs_prefix(user)}{sha256}"


@dataclass(frozen=True)
class Snapshot:
    """What a manifest records: the workspace's objects (relative keys) when it was taken."""

    name: str
    created: str
    source: Mapping[str, str]
    #: relative key -> (sha256, size)
    objects: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    #: relative key -> its permission bits, where the sync kept them (a blob is shared by
    #: files of one content, whatever their modes: the mode is the file's, kept here)
    modes: Mapping[str, int] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return sum(size for _, size in self.objects.values())

    def blobs(self) -> dict[str, int]:
        """sha256 -> size of the distinct contents it refers to."""
        return {sha: size for sha, size in self.objects.values()}

    def summary(self) -> dict:
        return {
            "name": self.name,
            "created": self.created,
            "source": dict(self.source),
            "objects": len(self.objects),
            "bytes": self.size,
        }

    def to_json(self) -> dict:
        return {
            "version": VERSION,
            **self.summary(),
            "entries": {
                k: {"sha256": s, "size": n, **({"mode": self.modes[k]} if k in self.modes else {})}
                for k, (s, n) in sorted(self.objects.items())
            },
        }

    @classmethod
    def from_json(cls, data: object) -> Snapshot:
        """A manifest read back; ValueError when it is not one gpulab wrote (every key
        relative and plain, every sha256 a digest): restoring never follows a bad entry."""
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise ValueError("not a gpulab snapshot manifest")
        entries = data.get("entries")
        if not isinstance(entries, dict) or len(entries) > MAX_SNAPSHOT_OBJECTS:
            raise ValueError("a snapshot manifest without entries")
        objects, modes = {}, {}
        for key, entry in entries.items():
            if not safe_relative_key(key) or not isinstance(entry, dict):
                raise ValueError(f"a snapshot manifest with a bad key {str(key)[:80]!r}")
            sha, size = entry.get("sha256"), entry.get("size")
            if not isinstance(sha, str) or not _SHA256_RE.fullmatch(sha):
                raise ValueError(f"a snapshot manifest with a bad digest for {key[:80]!r}")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise ValueError(f"a snapshot manifest with a bad size for {key[:80]!r}")
            objects[key] = (sha, size)
            mode = entry.get("mode")
            if mode is not None:
                if not isinstance(mode, int) or isinstance(mode, bool) or not 0 <= mode <= 0o777:
                    raise ValueError(f"a snapshot manifest with a bad mode for {key[:80]!r}")
                modes[key] = mode
        source = data.get("source") if isinstance(data.get("source"), dict) else {}
        return cls(
            name=snapshot_name(data.get("name")),
            created=str(data.get("created") or ""),
            source={str(k): str(v) for k, v in source.items()},
            objects=objects,
            modes=modes,
        )


def safe_relative_key(key: object) -> bool:
    """A key below a prefix, as gpulab's sync writes them: no empty, '.' or '..' part, no
    leading '/', no NUL."""
    if not isinstance(key, str) or not key or key.startswith("/") or "\x00" in key:
        return False
    return all(part not in ("", ".", "..") for part in key.split("/"))


def new_blobs(objects: Mapping[str, tuple[str, int]], present: Mapping[str, int]) -> dict:
    """sha256 -> size of the contents a new snapshot must copy: those no blob holds yet."""
    return {sha: size for sha, size in objects.values() if sha not in present}


def quota_refusal(held: int, adding: int, quota: int | None) -> str | None:
    """Why a snapshot that stores ``adding`` more bytes of blobs is refused when the user's
    snapshots hold ``held`` (None: it fits; a None quota: unlimited)."""
    if quota is None or held + adding <= quota:
        return None
    return (
        f"your snapshots would hold {_size(held + adding)}, over your snapshot quota of "
        f"{_size(quota)} ({_size(held)} held, {_size(adding)} new): delete a snapshot first"
    )


def count_refusal(count: int, cap: int) -> str | None:
    if count < cap:
        return None
    return f"you have {count} snapshots, the most one may keep: delete one first"


@dataclass(frozen=True)
class RestorePlan:
    #: (target relative key, sha256) to copy from its blob
    copy: tuple[tuple[str, str], ...]
    #: target relative keys to delete (the snapshot does not have them)
    delete: tuple[str, ...]
    #: keys already holding the snapshot's content
    kept: int


def restore_plan(
    snapshot: Snapshot, target: Mapping[str, tuple[str | None, int | None]]
) -> RestorePlan:
    """What makes the target (relative key -> its sha256 and mode, None where unknown) hold
    exactly the snapshot: copy what differs, in content or in a mode the snapshot kept;
    delete what the snapshot lacks."""

    def same(key: str, sha: str) -> bool:
        has, mode = target.get(key) or (None, None)
        return has == sha and (key not in snapshot.modes or mode == snapshot.modes[key])

    copy = tuple(
        (key, sha) for key, (sha, _) in sorted(snapshot.objects.items()) if not same(key, sha)
    )
    delete = tuple(sorted(k for k in target if k not in snapshot.objects))
    return RestorePlan(copy, delete, len(snapshot.objects) - len(copy))


def unreferenced(blobs: Iterable[str], snapshots: Iterable[Snapshot]) -> set[str]:
    """The blobs (sha256) no snapshot refers to: what a delete removes."""
    used = {sha for s in snapshots for sha, _ in s.objects.values()}
    return {b for b in blobs if b not in used}


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"
